"""ignis.Client(native="DIR"): the Client's chat, completions and embeddings answered by a library `ignis
compile` wrote, through ctypes (the C ABI of csrc/native/ignis_model.h).

The request goes to the library as the JSON body the official client would send (extra_body
merged in, None fields left out, the transport options dropped); its answer is read into the same
response types the in-process Client returns, and an error object is raised as the exception the
in-process Client raises for it (BadRequestError for invalid_request_error, NotFoundError for
model_not_found, APIError otherwise), with the library's message, param and code.

One handle per Client, opened at construction and closed by Client.close(), the `with` block's
end or garbage collection. The library serialises calls on a handle; a stream runs the library
call on a worker thread whose callback hands each chunk to the iterator, at most STREAM_LAG chunks
ahead of the reader (so closing a stream stops generation within a few tokens: the callback
answers nonzero). A call made while a stream is unread lifts that stream's bound first, so the
stream's generation can finish and free the handle (no deadlock between them).
"""
from __future__ import annotations

import ctypes
import json
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import IgnisError
from .types import (AttrDict, ChatCompletion, ChatCompletionChunk, ChatCompletionMessage, Choice,
                    ChoiceDelta, ChunkChoice, Completion, CompletionChoice, CompletionUsage,
                    CreateEmbeddingResponse, Embedding, EmbeddingUsage, Logprobs,
                    PromptTokensDetails)

MANIFEST = "manifest.json"
STREAM_LAG = 4          # chunks the library may run ahead of the stream's reader
CHUNK_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_TRANSPORT = ("extra_headers", "extra_query", "timeout")


class NativeLibraryError(IgnisError, OSError):
    """A compiled-model directory cannot be used: no manifest, a manifest naming no library, a
    library that does not load, or ignis_open refusing it (the library's message)."""


# ---- the library ------------------------------------------------------------------------------------

def _load(directory: Path) -> tuple[ctypes.CDLL, dict[str, Any]]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise NativeLibraryError(f"{directory} is not a compiled model directory: it has no "
                                 f"{MANIFEST} (write one with `ignis compile MODEL -o DIR`)") from None
    except (OSError, ValueError) as e:
        raise NativeLibraryError(f"{path} cannot be read as JSON: {e}") from None
    name = manifest.get("library") if isinstance(manifest, dict) else None
    if not isinstance(name, str) or not name or "/" in name:
        raise NativeLibraryError(f"{path} names no library file (its \"library\" field is "
                                 f"{name!r:.80})")
    try:
        dll = ctypes.CDLL(str(directory / name))
    except OSError as e:
        raise NativeLibraryError(f"the compiled library {directory / name} does not load: {e}") from None
    dll.ignis_open.restype = ctypes.c_void_p
    dll.ignis_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    dll.ignis_last_error.restype = ctypes.c_char_p
    dll.ignis_last_error.argtypes = []
    dll.ignis_close.restype = None
    dll.ignis_close.argtypes = [ctypes.c_void_p]
    dll.ignis_free.restype = None
    dll.ignis_free.argtypes = [ctypes.c_void_p]
    for fn in (dll.ignis_completions, dll.ignis_chat_completions):
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CHUNK_CB, ctypes.c_void_p]
    if hasattr(dll, "ignis_embeddings"):        # a library compiled by an ignis before issue 18 lacks it
        dll.ignis_embeddings.restype = ctypes.c_void_p
        dll.ignis_embeddings.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return dll, manifest


class NativeModel:
    """One open handle of a compiled model's library."""

    def __init__(self, directory: str | Path, options: Mapping[str, Any] | None = None):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise NativeLibraryError(f"{self.directory} is not a directory (a compiled model "
                                     f"directory is written by `ignis compile MODEL -o DIR`)")
        self.dll, self.manifest = _load(self.directory)
        self.name = self.manifest.get("model")
        opts = json.dumps(dict(options)).encode() if options is not None else None
        handle = self.dll.ignis_open(str(self.directory).encode(), opts)
        if not handle:
            raise NativeLibraryError(f"ignis_open({str(self.directory)!r}): "
                                     f"{self.dll.ignis_last_error().decode(errors='replace')}")
        self._handle: int | None = handle
        self._streams: weakref.WeakSet[_NativeStream] = weakref.WeakSet()
        self._streams_lock = threading.Lock()        # calls may come from several threads
        self._finalizer = weakref.finalize(self, self.dll.ignis_close, handle)

    def close(self) -> None:
        """Close the handle (after cancelling and finishing the streams still running)."""
        for s in self._live_streams():
            s.close()
        self._handle = None
        self._finalizer()

    def _live_streams(self) -> list["_NativeStream"]:
        with self._streams_lock:
            return list(self._streams)

    def _forget(self, stream: "_NativeStream") -> None:
        with self._streams_lock:
            self._streams.discard(stream)

    def _entry(self, endpoint: str) -> Any:
        if self._handle is None:
            raise NativeLibraryError(f"the compiled model in {self.directory} is closed")
        if endpoint == "embeddings":
            if not hasattr(self.dll, "ignis_embeddings"):
                from .client import BadRequestError
                raise BadRequestError(f"the compiled model in {self.directory} has no embeddings: "
                                      f"its library was compiled by an older ignis; compile it again",
                                      param=None, code="unsupported_endpoint")
            return self.dll.ignis_embeddings
        return self.dll.ignis_chat_completions if endpoint == "chat" else self.dll.ignis_completions

    def call(self, endpoint: str, body: bytes, on_chunk: Any = None,
             stream: "_NativeStream | None" = None) -> dict[str, Any]:
        """The library's answer (a response or an error object) to one request body (for
        `stream`, when that stream's worker calls)."""
        fn = self._entry(endpoint)
        for s in self._live_streams():      # an unread stream must not hold the handle forever
            if s is not stream:
                s.unbound()

        def cb(text: bytes, _user: Any) -> int:
            try:
                return on_chunk(text) if on_chunk is not None else 0
            except BaseException:           # never unwind through C: stop the generation instead
                return 1
        keep = CHUNK_CB(cb)                 # alive for the whole call
        p = (fn(self._handle, body) if endpoint == "embeddings"
             else fn(self._handle, body, keep, None))
        if not p:
            raise NativeLibraryError(f"the compiled library answered nothing: "
                                     f"{self.dll.ignis_last_error().decode(errors='replace')}")
        try:
            return json.loads(ctypes.string_at(p).decode())
        finally:
            self.dll.ignis_free(p)

    def create(self, endpoint: str, fields: dict[str, Any]) -> Any:
        """chat.completions.create / completions.create / embeddings.create with `fields`
        (create()'s arguments)."""
        body = _body(fields, endpoint)
        raw = _encode(body)
        if body.get("stream"):
            stream = _NativeStream(self, endpoint, raw)
            with self._streams_lock:
                self._streams.add(stream)
            return stream.start()
        answer = self.call(endpoint, raw)
        _raise_error(answer)
        if endpoint == "embeddings":
            return embedding_response(answer)
        return chat_completion(answer) if endpoint == "chat" else completion(answer)


def _body(fields: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """create()'s arguments as the request body the official client sends. extra_body exists
    only on this side (the body merges it), so its keys are checked here, as the in-process
    Client checks them; every other check is the library's."""
    from .client import (EXTRA_CHAT, EXTRA_COMPLETIONS, EXTRA_EMBEDDING, _bad, _check_extra_keys,
                         _field)
    body = {k: v for k, v in fields.items()
            if k not in _TRANSPORT and k not in ("self", "extra_body") and v is not None}
    extra = fields.get("extra_body")
    if isinstance(extra, dict) and endpoint == "embeddings":
        unknown = sorted(set(extra) - set(EXTRA_EMBEDDING), key=str)
        if unknown:         # worded as the in-process embeddings.create words it
            raise _bad(f"unknown extra_body field(s) {unknown}; embeddings take "
                       f"{list(EXTRA_EMBEDDING)}", _field(None, unknown[0]), "unknown_parameter")
        body.update(extra)
    elif isinstance(extra, dict):
        _check_extra_keys(extra, EXTRA_CHAT if endpoint == "chat" else EXTRA_COMPLETIONS)
        body.update(extra)
    elif extra is not None:
        raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
    return body


def _encode(body: dict[str, Any]) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        from .client import _bad
        raise _bad(f"the request cannot be sent as JSON: {e}", None, "invalid_type") from None


def _raise_error(answer: dict[str, Any]) -> None:
    """An error object as the exception the in-process Client raises for it."""
    err = answer.get("error") if isinstance(answer, dict) else None
    if err is None:
        return
    from .client import APIError, BadRequestError, NotFoundError
    message = err.get("message") or "the compiled library refused the request"
    kwargs = {"param": err.get("param"), "code": err.get("code"),
              "type": err.get("type") or "invalid_request_error"}
    if kwargs["code"] == "model_not_found":
        raise NotFoundError(message, **kwargs)
    if kwargs["type"] == "invalid_request_error":
        raise BadRequestError(message, **kwargs)
    raise APIError(message, **kwargs)


# ---- streams ------------------------------------------------------------------------------------------

class _NativeStream:
    """A stream's chunks as they come: the library call runs on a worker thread; its callback
    queues each chunk (waiting while STREAM_LAG are unread) and answers nonzero once closed."""

    def __init__(self, model: NativeModel, endpoint: str, body: bytes):
        self._model = model
        self._endpoint = endpoint
        self._body = body
        self._cond = threading.Condition()
        self._queue: list[bytes] = []
        self._bounded = True
        self._cancelled = False
        self._done = False
        self.answer: dict[str, Any] | None = None     # the library's return value, once done
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ignis-native-stream", daemon=True)

    def _run(self) -> None:
        try:
            self.answer = self._model.call(self._endpoint, self._body, self._on_chunk, self)
        except BaseException as e:          # handed to the reader
            self._failure = e
        self._model._forget(self)
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _on_chunk(self, text: bytes) -> int:
        with self._cond:
            while self._bounded and not self._cancelled and len(self._queue) >= STREAM_LAG:
                self._cond.wait()
            if self._cancelled:
                return 1
            self._queue.append(text)
            self._cond.notify_all()
            return 0

    def start(self) -> Any:
        """Run the call; wait for its first chunk (or its end), so a refused request raises here,
        as the in-process Client's create() does, not at the first next()."""
        from .client import Stream
        self._thread.start()
        with self._cond:
            while not self._queue and not self._done:
                self._cond.wait()
        if not self._queue:
            self._thread.join()
            self._finish()
        chunks = self._chunks()
        weakref.finalize(chunks, self.close)    # dropped unread (the generator never started)
        return Stream(chunks, self.close)

    def _finish(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._cancelled:
            _raise_error(self.answer or {})

    def _chunks(self) -> Iterator[Any]:
        read = chat_chunk if self._endpoint == "chat" else completion
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._done:
                        self._cond.wait()
                    if not self._queue:
                        break
                    text = self._queue.pop(0)
                    self._cond.notify_all()
                yield read(json.loads(text.decode()))
        finally:                 # read to the end, closed, or dropped: the call ends either way
            self.close()
        self._finish()

    def unbound(self) -> None:
        with self._cond:
            self._bounded = False
            self._cond.notify_all()

    def close(self) -> None:
        """Stop generating (the callback's next answer is nonzero) and wait for the call's end."""
        with self._cond:
            if not self._done:
                self._cancelled = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._model._forget(self)


# ---- the response JSON as the Client's types -----------------------------------------------------

def usage(d: Mapping[str, Any] | None) -> CompletionUsage | None:
    if d is None:
        return None
    details = d.get("prompt_tokens_details")
    return CompletionUsage(
        prompt_tokens=d["prompt_tokens"], completion_tokens=d["completion_tokens"],
        total_tokens=d["total_tokens"],
        prompt_tokens_details=None if details is None else PromptTokensDetails(**details),
        completion_tokens_details=d.get("completion_tokens_details"))


def embedding_response(d: Mapping[str, Any]) -> CreateEmbeddingResponse:
    u = d["usage"]
    return CreateEmbeddingResponse(
        data=[Embedding(embedding=e["embedding"], index=e["index"]) for e in d["data"]],
        model=d["model"], usage=EmbeddingUsage(prompt_tokens=u["prompt_tokens"],
                                               total_tokens=u["total_tokens"]))


def _text_logprobs(d: Mapping[str, Any] | None) -> Logprobs | None:
    return None if d is None else Logprobs(**d)


def completion(d: Mapping[str, Any]) -> Completion:
    choices = [CompletionChoice(finish_reason=c["finish_reason"], index=c["index"], text=c["text"],
                                logprobs=_text_logprobs(c.get("logprobs"))) for c in d["choices"]]
    return Completion(id=d["id"], choices=choices, created=d["created"], model=d["model"],
                      system_fingerprint=d.get("system_fingerprint"), usage=usage(d.get("usage")))


def _calls(calls: Any) -> list | None:
    return None if calls is None else [AttrDict(c) for c in calls]


def chat_completion(d: Mapping[str, Any]) -> ChatCompletion:
    choices = []
    for c in d["choices"]:
        m = dict(c["message"])
        m["tool_calls"] = _calls(m.get("tool_calls"))
        choices.append(Choice(finish_reason=c["finish_reason"], index=c["index"],
                              message=ChatCompletionMessage(**m), logprobs=c.get("logprobs")))
    return ChatCompletion(id=d["id"], choices=choices, created=d["created"], model=d["model"],
                          service_tier=d.get("service_tier"),
                          system_fingerprint=d.get("system_fingerprint"), usage=usage(d.get("usage")))


def chat_chunk(d: Mapping[str, Any]) -> ChatCompletionChunk:
    choices = []
    for c in d["choices"]:
        delta = dict(c["delta"])
        delta["tool_calls"] = _calls(delta.get("tool_calls"))
        choices.append(ChunkChoice(delta=ChoiceDelta(**delta), index=c["index"],
                                   finish_reason=c.get("finish_reason"), logprobs=c.get("logprobs")))
    return ChatCompletionChunk(id=d["id"], choices=choices, created=d["created"], model=d["model"],
                               service_tier=d.get("service_tier"),
                               system_fingerprint=d.get("system_fingerprint"),
                               usage=usage(d.get("usage")))
