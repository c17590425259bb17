"""ignis.Client: the OpenAI Python client's interface, answered by local models in-process.

    client = ignis.Client()                      # instead of openai.OpenAI()
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b-instruct",
                                       messages=[{"role": "user", "content": "hi"}])
    print(r.choices[0].message.content)

Request fields and results follow the OpenAI API; sampling options OpenAI lacks (top_k, min_p,
repetition_penalty) go through `extra_body` as with the official client. Invalid requests raise
BadRequestError (status_code 400, .message, .body, .param, .code) before a token is computed.
client.embeddings.create gives Model.embed's vectors (mean-pooled final hidden states, unit length).
"""
from __future__ import annotations

import base64
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import __version__
from ..errors import IgnisError
from ..generate import Chunk, ContextLengthExceeded, InvalidParameterError, TokenLogprob
from .model import POOLINGS, Model
from .types import (ChatCompletion, ChatCompletionChunk, ChatCompletionMessage,
                    ChatCompletionTokenLogprob, Choice, ChoiceDelta, ChoiceLogprobs, ChunkChoice,
                    Completion, CompletionChoice, CompletionUsage, CreateEmbeddingResponse,
                    Embedding, EmbeddingUsage, Logprobs, ModelInfo, ModelList, PromptTokensDetails,
                    TopLogprob)

# extra_body keys ignis understands beyond the OpenAI request fields
EXTRA_SAMPLING = ("top_k", "min_p", "repetition_penalty", "ignore_eos")
_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(IgnisError):
    """Base of the errors shaped like the official client's (openai.APIStatusError)."""
    status_code = 500

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        self.param = param
        self.code = code
        self.type = type
        self.body = {"message": message, "type": type, "param": param, "code": code}
        self.message = f"Error code: {self.status_code} - {{'error': {self.body!r}}}"
        self.response = None
        self.request = None
        self.request_id = None
        super().__init__(self.message)


class BadRequestError(APIError, ValueError):
    """The request is invalid (what the OpenAI API answers with HTTP 400)."""
    status_code = 400


class NotFoundError(APIError, LookupError):
    """The model does not exist here (HTTP 404 in the OpenAI API)."""
    status_code = 404


def _bad(message: str, param: str | None, code: str | None = "invalid_value") -> BadRequestError:
    return BadRequestError(message, param=param, code=code)


def _translate(e: Exception, prompt_param: str = "messages") -> APIError:
    """A generation error as the API's 400; prompt_param names the request field holding the
    prompt ("messages" for chat, "prompt" for completions)."""
    if isinstance(e, ContextLengthExceeded):
        return _bad(str(e), prompt_param, "context_length_exceeded")
    if isinstance(e, InvalidParameterError):
        return _bad(str(e), e.param, e.code)
    return _bad(str(e), None, None)


class Client:
    """An in-process stand-in for openai.OpenAI. `models`: loaded Model objects, names or paths
    (loaded on first use), or a {name: Model} dict; a name not bound is loaded on demand with
    `load_options` (e.g. {"weight_format": "q8", "n_ctx": 4096})."""

    def __init__(self, models: Any = None, *, load_options: dict[str, Any] | None = None,
                 api_key: str | None = None, base_url: str | None = None, **_ignored: Any):
        # api_key/base_url are accepted (and unused) so openai.OpenAI(...) arguments still work
        self._models: dict[str, Model | None] = {}
        self._load_options = dict(load_options or {})
        self._lock = threading.Lock()
        if models is None:
            models = []
        if isinstance(models, (Model, str)):
            models = [models]
        if isinstance(models, dict):
            items = list(models.items())
        else:
            items = [(m.name, m) if isinstance(m, Model) else (str(m), None) for m in models]
        for name, m in items:
            if m is not None and not isinstance(m, Model):
                raise TypeError(f"Client models must be ignis Model objects or names, got "
                                f"{type(m).__name__}")
            self._models[name] = m
        self.chat = _Chat(self)
        self.completions = _Completions(self)
        self.embeddings = _Embeddings(self)
        self.models = _Models(self)

    def _model(self, name: Any) -> Model:
        if not isinstance(name, str) or not name:
            raise _bad("model must be a non-empty string naming a model", "model", "invalid_type")
        with self._lock:
            m = self._models.get(name)
            if m is None:
                from .. import load
                from ..errors import ModelNotFoundError
                try:
                    m = load(name, **self._load_options)
                except ModelNotFoundError as e:
                    raise NotFoundError(f"The model {name!r} does not exist: {e}", param="model",
                                        code="model_not_found") from None
                self._models[name] = m
            return m

    @property
    def system_fingerprint(self) -> str:
        return f"fp_ignis_{__version__}"


# ---- request checks shared by both endpoints ---------------------------------------------------------

def _check_common(*, n: Any, stream: Any, stream_options: Any, extra_body: Any,
                  max_tokens: Any, max_completion_tokens: Any = None) -> tuple[int | None, dict, bool]:
    if n is not None and n != 1:
        raise _bad(f"n={n!r}: ignis generates one choice per request (n=1)", "n",
                   "unsupported_value")
    if not isinstance(stream, bool) and stream is not None:
        raise _bad(f"stream must be true or false, got {stream!r}", "stream", "invalid_type")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage",
                                                                         "include_obfuscation"}:
            raise _bad(f"stream_options must be {{'include_usage': bool}}, got {stream_options!r}",
                       "stream_options")
        include_usage = bool(stream_options.get("include_usage", False))
    extra = dict(extra_body or {})
    if not isinstance(extra_body, (dict, type(None))):
        raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
    unknown = sorted(set(extra) - set(EXTRA_SAMPLING))
    if unknown:
        raise _bad(f"unknown extra_body field(s) {unknown}; ignis takes {list(EXTRA_SAMPLING)}",
                   unknown[0], "unknown_parameter")
    if max_tokens is not None and max_completion_tokens is not None and max_tokens != max_completion_tokens:
        raise _bad("max_tokens and max_completion_tokens disagree; pass one of them",
                   "max_tokens")
    return (max_completion_tokens if max_completion_tokens is not None else max_tokens), extra, include_usage


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object with role and content", f"messages.[{i}]",
                       "invalid_type")
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(f"messages[{i}].role is {role!r}; expected one of {list(_ROLES)}",
                       f"messages.[{i}].role")
        content = m.get("content")
        if isinstance(content, list):      # content parts: only text can be read by these models
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}; "
                               f"this model reads text only", f"messages.[{i}].content")
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise _bad(f"messages[{i}] ({role}) has no content", f"messages.[{i}].content")
        if content is not None and not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or a list of text parts",
                       f"messages.[{i}].content", "invalid_type")
        msg = {k: v for k, v in m.items() if v is not None}
        if content is not None:
            msg["content"] = content
        out.append(msg)
    return out


def _token_text(model: Model, token_id: int) -> tuple[str, list[int]]:
    b = model.tokenizer.token_bytes(token_id)
    return b.decode("utf-8", "replace"), list(b)


def _chat_logprobs(model: Model, lps: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    content = []
    for lp in lps:
        tok, b = _token_text(model, lp.token_id)
        tops = []
        for t in lp.top:
            ttok, tb = _token_text(model, t.token_id)
            tops.append(TopLogprob(token=ttok, bytes=tb, logprob=t.logprob))
        content.append(ChatCompletionTokenLogprob(token=tok, bytes=b, logprob=lp.logprob,
                                                  top_logprobs=tops))
    return ChoiceLogprobs(content=content)


def _usage(prompt: int, completion: int, cached: int) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion,
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class Stream:
    """What create(stream=True) returns: iterate it for chunks; close() stops generating."""

    def __init__(self, chunks: Iterator[Any], close: Callable[[], None]):
        self._chunks = chunks
        self._close = close

    def __iter__(self) -> Iterator[Any]:
        return self._chunks

    def __next__(self) -> Any:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        self._close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- chat.completions ---------------------------------------------------------------------------

class _Chat:
    def __init__(self, client: Client):
        self.completions = _ChatCompletions(client)


class _ChatCompletions:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, messages: Any, model: str, stream: bool | None = None,
               stream_options: dict | None = None, max_tokens: int | None = None,
               max_completion_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, stop: str | list[str] | None = None,
               seed: int | None = None, logprobs: bool | None = None,
               top_logprobs: int | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None, logit_bias: dict | None = None,
               n: int | None = None, response_format: dict | None = None,
               tools: list | None = None, tool_choice: Any = None, user: str | None = None,
               store: bool | None = None, metadata: dict | None = None,
               parallel_tool_calls: bool | None = None, service_tier: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> ChatCompletion | Stream:
        limit, extra, include_usage = _check_common(
            n=n, stream=stream, stream_options=stream_options, extra_body=extra_body,
            max_tokens=max_tokens, max_completion_tokens=max_completion_tokens)
        if response_format is not None and response_format != {"type": "text"}:
            raise _bad("response_format: only {'type': 'text'} is supported (no constrained "
                       "JSON decoding yet)", "response_format", "unsupported_value")
        if tools or tool_choice not in (None, "none"):
            raise _bad("tools: ignis does not parse tool calls yet; send the request without "
                       "tools", "tools", "unsupported_parameter")
        msgs = _messages(messages)
        m = self._client._model(model)
        try:
            if logprobs is False and top_logprobs:
                raise InvalidParameterError("top_logprobs needs logprobs=true", param="top_logprobs")
            prompt = m.chat_prompt_ids(msgs)
            run = m.start(prompt, max_tokens=limit, temperature=temperature, top_p=top_p, stop=stop,
                          seed=seed, logprobs=logprobs, top_logprobs=top_logprobs,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                          logit_bias=logit_bias, **extra)
        except (InvalidParameterError, ContextLengthExceeded) as e:
            raise _translate(e) from None
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        fp = self._client.system_fingerprint
        want_lp = bool(logprobs)
        if stream:
            return Stream(self._chunks(m, run, cid, created, model, fp, want_lp, include_usage),
                          run.close)
        for _ in run:
            pass
        r = run.result
        choice = Choice(finish_reason=r.finish_reason, index=0,
                        message=ChatCompletionMessage(content=r.text),
                        logprobs=_chat_logprobs(m, r.logprobs) if want_lp else None)
        return ChatCompletion(id=cid, choices=[choice], created=created, model=model,
                              system_fingerprint=fp,
                              usage=_usage(r.prompt_tokens, r.completion_tokens, r.cached_tokens))

    @staticmethod
    def _chunks(m: Model, run: Any, cid: str, created: int, model: str, fp: str, want_lp: bool,
                include_usage: bool) -> Iterator[ChatCompletionChunk]:
        def chunk(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=cid, choices=choices, created=created, model=model,
                                       system_fingerprint=fp, usage=usage)
        yield chunk([ChunkChoice(delta=ChoiceDelta(role="assistant", content=""), index=0)])
        c: Chunk
        for c in run:
            lp = _chat_logprobs(m, c.logprobs) if want_lp else None
            yield chunk([ChunkChoice(delta=ChoiceDelta(content=c.text), index=0, logprobs=lp)])
        r = run.result
        yield chunk([ChunkChoice(delta=ChoiceDelta(), index=0, finish_reason=r.finish_reason)])
        if include_usage:
            yield chunk([], _usage(r.prompt_tokens, r.completion_tokens, r.cached_tokens))


# ---- completions --------------------------------------------------------------------------------

class _Completions:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, model: str, prompt: Any, max_tokens: int | None = 16,
               temperature: float | None = None, top_p: float | None = None,
               stop: str | list[str] | None = None, seed: int | None = None,
               logprobs: int | None = None, echo: bool | None = None, n: int | None = None,
               best_of: int | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None, logit_bias: dict | None = None,
               stream: bool | None = None, stream_options: dict | None = None,
               suffix: str | None = None, user: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> Completion | Stream:
        """max_tokens defaults to 16, as in the OpenAI completions API."""
        limit, extra, include_usage = _check_common(
            n=n, stream=stream, stream_options=stream_options, extra_body=extra_body,
            max_tokens=max_tokens)
        if echo:
            raise _bad("echo=true is not supported", "echo", "unsupported_value")
        if suffix is not None:
            raise _bad("suffix is not supported (no fill-in-the-middle template)", "suffix",
                       "unsupported_parameter")
        if best_of not in (None, 1):
            raise _bad("best_of must be 1", "best_of", "unsupported_value")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= 5):
            raise _bad(f"logprobs must be an integer in [0, 5], got {logprobs!r}", "logprobs")
        prompts = self._prompts(prompt)
        if stream and len(prompts) > 1:
            raise _bad("stream=true takes a single prompt", "prompt", "unsupported_value")
        m = self._client._model(model)
        runs = []
        try:
            for p in prompts:
                ids = m.tokenize(p) if isinstance(p, str) else p
                runs.append(m.start(ids, max_tokens=limit, temperature=temperature, top_p=top_p,
                                    stop=stop, seed=seed, logprobs=logprobs is not None,
                                    top_logprobs=logprobs or None,
                                    presence_penalty=presence_penalty,
                                    frequency_penalty=frequency_penalty, logit_bias=logit_bias,
                                    **extra))
        except (InvalidParameterError, ContextLengthExceeded) as e:
            raise _translate(e, "prompt") from None
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        fp = self._client.system_fingerprint
        want_lp = logprobs is not None
        if stream:
            return Stream(self._chunks(m, runs[0], cid, created, model, fp, want_lp, include_usage),
                          runs[0].close)
        choices, n_prompt, n_out, cached = [], 0, 0, 0
        for i, run in enumerate(runs):
            for _ in run:
                pass
            r = run.result
            choices.append(CompletionChoice(finish_reason=r.finish_reason, index=i, text=r.text,
                                            logprobs=_text_logprobs(m, r.logprobs, 0) if want_lp else None))
            n_prompt += r.prompt_tokens
            n_out += r.completion_tokens
            cached += r.cached_tokens
        return Completion(id=cid, choices=choices, created=created, model=model,
                          system_fingerprint=fp, usage=_usage(n_prompt, n_out, cached))

    @staticmethod
    def _prompts(prompt: Any) -> list[str | list[int]]:
        if isinstance(prompt, str):
            prompts: list[Any] = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt:
            prompts = prompt
        else:
            raise _bad("prompt must be a string, a list of strings, or a list of token ids", "prompt")
        for p in prompts:
            ok = isinstance(p, str) and p or (isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p))
            if not ok:
                raise _bad(f"each prompt must be a non-empty string or list of token ids, got {p!r}",
                           "prompt")
        return prompts

    @staticmethod
    def _chunks(m: Model, run: Any, cid: str, created: int, model: str, fp: str, want_lp: bool,
                include_usage: bool) -> Iterator[Completion]:
        offset = 0
        for c in run:
            lp = _text_logprobs(m, list(c.logprobs), offset) if want_lp else None
            offset += len(c.text)
            yield Completion(id=cid, choices=[CompletionChoice(finish_reason=None, index=0,  # type: ignore[arg-type]
                                                               text=c.text, logprobs=lp)],
                             created=created, model=model, system_fingerprint=fp)
        r = run.result
        yield Completion(id=cid, choices=[CompletionChoice(finish_reason=r.finish_reason, index=0,
                                                           text="")],
                         created=created, model=model, system_fingerprint=fp)
        if include_usage:
            yield Completion(id=cid, choices=[], created=created, model=model, system_fingerprint=fp,
                             usage=_usage(r.prompt_tokens, r.completion_tokens, r.cached_tokens))


def _text_logprobs(m: Model, lps: Sequence[TokenLogprob] | None, offset: int) -> Logprobs:
    out = Logprobs()
    for lp in lps or ():
        tok, _ = _token_text(m, lp.token_id)
        out.tokens.append(tok)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({_token_text(m, t.token_id)[0]: t.logprob for t in lp.top})
        out.text_offset.append(offset)
        offset += len(tok)
    return out


# ---- embeddings ---------------------------------------------------------------------------------

ENCODING_FORMATS = ("float", "base64")
EXTRA_EMBEDDING = ("pooling",)     # extra_body keys of embeddings.create: Model.embed's options


class _Embeddings:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, model: str, input: Any, encoding_format: str | None = None,
               dimensions: int | None = None, user: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> CreateEmbeddingResponse:
        """One vector per input: Model.embed's mean-pooled, L2-normalised final hidden states
        (extra_body={"pooling": "last"}: the last token's). encoding_format "float" (default) gives
        lists of floats, "base64" the base64 text of each vector's little-endian float32 bytes
        (what the official client decodes)."""
        fmt = "float" if encoding_format is None else encoding_format
        if fmt not in ENCODING_FORMATS:
            raise _bad(f"encoding_format must be one of {list(ENCODING_FORMATS)}, got "
                       f"{encoding_format!r}", "encoding_format")
        if dimensions is not None:
            raise _bad(f"dimensions={dimensions!r}: ignis returns the model's full hidden size and "
                       f"does not shorten embeddings; omit dimensions", "dimensions",
                       "unsupported_parameter")
        if not isinstance(extra_body, (dict, type(None))):
            raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
        extra = dict(extra_body or {})
        unknown = sorted(set(extra) - set(EXTRA_EMBEDDING))
        if unknown:
            raise _bad(f"unknown extra_body field(s) {unknown}; embeddings take "
                       f"{list(EXTRA_EMBEDDING)}", unknown[0], "unknown_parameter")
        pooling = extra.get("pooling", "mean")
        if pooling not in POOLINGS:
            raise _bad(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}", "pooling")
        m = self._client._model(model)
        try:
            ids = m.embedding_inputs(input)
        except InvalidParameterError as e:
            raise _translate(e) from None
        vecs = m.embed_ids(ids, pooling=pooling)
        data = [Embedding(embedding=_encode_vector(v, fmt), index=i) for i, v in enumerate(vecs)]
        n = sum(len(x) for x in ids)
        return CreateEmbeddingResponse(data=data, model=model,
                                       usage=EmbeddingUsage(prompt_tokens=n, total_tokens=n))


def _encode_vector(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


# ---- models -------------------------------------------------------------------------------------

class _Models:
    def __init__(self, client: Client):
        self._client = client

    def list(self) -> ModelList:
        """Models bound to this client, then the registry's models that are installed."""
        from ..loader.registry import list_models
        created = int(time.time())
        ids = list(self._client._models)
        try:
            ids += [e["name"] for e in list_models() if e["packages_installed"] and e["name"] not in ids]
        except IgnisError:
            pass
        return ModelList(data=[ModelInfo(id=i, created=created) for i in ids])

    def retrieve(self, model: str) -> ModelInfo:
        for info in self.list():
            if info.id == model:
                return info
        raise NotFoundError(f"The model {model!r} does not exist", param="model",
                            code="model_not_found")
