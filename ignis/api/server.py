"""`ignis serve`: an OpenAI-compatible HTTP server (starlette + uvicorn), a thin wire layer over an
ignis.Client bound to one loaded model, so the HTTP API and the in-process Client cannot disagree.

    ignis serve qwen2.5-coder-0.5b-instruct --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "qwen2.5-coder-0.5b-instruct", "messages": [{"role": "user", "content": "hi"}]}'

Concurrency: the model is loaded with `parallel` KV slots and the server runs that many requests
at once (generation or embeddings), one worker thread each; their forward steps are batched
(ignis.generate.batch), so one pass over the weights serves every running sequence. Admitted
requests beyond those wait in a bounded FIFO (`max_queue`; more get 503 with Retry-After), so the
event loop stays free (/health answers during generations). A request's place is taken before its
prompt is tokenized, and given back before its answer is sent, so a client that waits for each
answer never meets a full server. A client that disconnects stops its work before the next token
(or embedding input) and frees its slot; one still waiting leaves the queue at once.

The wire is guarded: a server bound to loopback answers only loopback Host names (DNS rebinding),
browsers get CORS only for --cors-origins, request headers and bodies have read deadlines (408),
JSON nests at most MAX_NESTING levels (deeper is a 400 before any other check), an
internal error is answered with a request id and logged, never shown, and SIGTERM/SIGINT let
running requests finish up to --shutdown-timeout before ending streams with an error event.

Endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses (its streams send
named `event:` lines and end with their last event, as OpenAI's), GET /v1/models[/name],
/v1/responses/{id}, /health.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import inspect
import ipaddress
import json
import logging
import queue
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import IgnisError
from ..generate import GenerationCancelled, InvalidParameterError, cancel_when
from ..generate.params import MAX_NESTING, check_request_value, check_text, field_name
from .client import EXTRA_CHAT, EXTRA_COMPLETIONS, EXTRA_EMBEDDING, APIError, Client
from .responses import EXTRA_RESPONSES, ResponseEvent
from .model import Model
from .types import ModelInfo, ModelList

try:
    import h11
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    from uvicorn.protocols.http.h11_impl import H11Protocol
    _MISSING: ImportError | None = None
except ImportError as _e:          # `ignis serve` says how to install them; the rest of ignis works
    _MISSING = _e

MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_QUEUE = 16
DEFAULT_HEADER_TIMEOUT = 10.0      # seconds to receive a request line and its headers
DEFAULT_BODY_TIMEOUT = 30.0        # seconds to receive a request body
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0   # seconds an idle kept-alive connection stays open
DEFAULT_SHUTDOWN_TIMEOUT = 30.0    # seconds running requests get to finish after SIGTERM/SIGINT
RETRY_AFTER = "1"                  # seconds, on every 503
# create() arguments that only make sense in-process (the official client never sends them as JSON)
_NOT_WIRE = {"extra_body", "extra_headers", "extra_query", "timeout"}
_REQUIRED = {"chat": ("model", "messages"), "completions": ("model", "prompt"),
             "embeddings": ("model", "input"), "responses": ("model",)}

log = logging.getLogger("ignis.server")


class ServerDependencyError(IgnisError, ImportError):
    """starlette/uvicorn (the `server` extra) are not installed."""


class QueueFullError(IgnisError, RuntimeError):
    """Every request slot is taken: the client should retry later (HTTP 503)."""


class ShuttingDownError(IgnisError, RuntimeError):
    """The server is stopping and takes no new work (HTTP 503)."""


def require_server_dependencies() -> None:
    if _MISSING is not None:
        raise ServerDependencyError(f"ignis serve needs starlette and uvicorn ({_MISSING}); "
                                    f"install them with: pip install 'ignis[server]'")


@dataclass
class ServerConfig:
    """What `ignis serve` was started with (the model itself is passed separately)."""
    api_key: str | None = None
    max_queue: int = DEFAULT_MAX_QUEUE        # requests waiting behind the running ones
    max_body_bytes: int = MAX_BODY_BYTES
    aliases: tuple[str, ...] = ()             # more names the model answers to (e.g. the CLI path)
    # the address listened on (serve() sets it): on loopback, only loopback Host names, `host`
    # and `allowed_hosts` are answered; None (an app not yet bound) checks only allowed_hosts
    host: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()        # browser origins allowed to call the API ("*": any)
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT


class _WireError(Exception):
    """An error answered before any work: becomes one OpenAI error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.body = {"message": message, "type": type, "param": param, "code": code}
        self.headers = headers


def _error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> "Response":
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _shutdown_body() -> dict[str, Any]:
    return {"message": "the server is shutting down and ended this request; retry it on another "
                       "server or once this one is back", "type": "server_error", "param": None,
            "code": "server_shutting_down"}


def _internal_body(request_id: str | None) -> dict[str, Any]:
    return {"message": f"The server had an error while processing your request (request id "
                       f"{request_id}); the server's log has the details. Retry, or report the id "
                       f"to whoever runs the server.", "type": "server_error", "param": None,
            "code": "internal_error"}


# ---- the workers: one thread per KV slot ---------------------------------------------------------

class _Job:
    """One admitted request. Its place in the queue is taken by admit(), before any work; `work`
    runs on a worker thread, then `after` (the answer's delivery) once the place is given back,
    so a client that waits for its answer before sending the next request always finds it free.
    cancel() frees a waiting place at once, or asks running work to stop at its next chance."""

    def __init__(self, owner: "RequestQueue"):
        self._owner = owner
        self.work: Callable[["_Job"], None] | None = None
        self.after: Callable[["_Job"], None] | None = None
        self.state = "admitted"   # admitted -> waiting -> running -> done; or -> cancelled before running
        self.cancelled = threading.Event()
        self.reason: str | None = None    # why it was cancelled: "client", "shutdown" or "unused"

    def cancel(self, reason: str = "client") -> None:
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()
            self._owner._cancel(self)


class RequestQueue:
    """A bounded FIFO served by `workers` threads: up to `workers` running + at most `max_waiting`
    admitted and waiting. With as many workers as the model has KV slots every running request
    holds a slot on its own thread (a thread never waits for a slot it holds itself)."""

    def __init__(self, max_waiting: int, workers: int = 1):
        if max_waiting < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_waiting}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.max_waiting = max_waiting
        self.workers = workers
        self.closing = False        # shutting down: admit() refuses
        self._lock = threading.Lock()
        self._in_flight = 0
        self._running = 0
        self._abandoned = 0        # requests whose client left before they finished
        self._jobs: set[_Job] = set()
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, name=f"ignis-worker-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"running": self._running, "waiting": self._in_flight - self._running,
                    "parallel": self.workers, "max_queue": self.max_waiting,
                    "abandoned": self._abandoned}

    def jobs(self) -> list[_Job]:
        """Every admitted job not yet done."""
        with self._lock:
            return list(self._jobs)

    def admit(self) -> _Job:
        """A place for one request, or QueueFullError (ShuttingDownError when stopping)."""
        with self._lock:
            if self.closing:
                raise ShuttingDownError("the server is shutting down and takes no new requests")
            if self._in_flight >= self.workers + self.max_waiting:
                raise QueueFullError(f"the server is busy: {self._running} request(s) running and "
                                     f"{self._in_flight - self._running} waiting (max "
                                     f"{self.max_waiting}); retry later")
            self._in_flight += 1
            job = _Job(self)
            self._jobs.add(job)
        return job

    def start(self, job: _Job, work: Callable[[_Job], None],
              after: Callable[[_Job], None] | None = None) -> None:
        """Queue an admitted job's work; `after(job)` runs once, when the work is over or the job
        was cancelled before it ran."""
        with self._lock:
            job.work, job.after = work, after
            cancelled = job.state != "admitted"
            if not cancelled:
                job.state = "waiting"
        if cancelled:              # cancelled while its request was being read
            if after is not None:
                after(job)
            return
        self._q.put(job)

    def submit(self, work: Callable[[_Job], None],
               after: Callable[[_Job], None] | None = None) -> _Job:
        job = self.admit()
        self.start(job, work, after)
        return job

    def _cancel(self, job: _Job) -> None:
        after = None
        with self._lock:
            if job.state in ("admitted", "waiting"):
                after = job.after if job.state == "waiting" else None
                job.state = "cancelled"
                self._in_flight -= 1
                self._jobs.discard(job)
                self._abandoned += job.reason == "client"
            elif job.state == "running":
                self._abandoned += job.reason == "client"
        if after is not None:
            after(job)

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            with self._lock:
                if job.state != "waiting":
                    continue
                job.state = "running"
                self._running += 1
            try:
                with cancel_when(job.cancelled):
                    job.work(job)  # type: ignore[misc]
            except GenerationCancelled:
                pass
            except BaseException:     # work delivers its own errors; this is a last resort
                log.exception("request worker failed")
            finally:
                with self._lock:
                    job.state = "done"
                    self._running -= 1
                    self._in_flight -= 1
                    self._jobs.discard(job)
            if job.after is not None:
                try:
                    job.after(job)
                except BaseException:
                    log.exception("request worker failed to deliver its answer")

    def close(self, wait: float = 0) -> None:
        """Stop the workers once the queue is empty; wait up to `wait` seconds for them."""
        for _ in self._threads:
            self._q.put(None)
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) on the event loop, from any thread; nothing when the loop is gone (shutdown)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


async def _run_on_worker(rq: RequestQueue, fn: Callable[[], Any], request: "Request | None" = None,
                         job: _Job | None = None) -> Any:
    """fn() on a worker thread, awaited; its exception is re-raised here. With `request`, a
    client that hangs up while waiting cancels the job (a generation stops at its next token).
    `job`: a place already admitted (else one is taken here: QueueFullError when none is free)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    outcome: list[tuple[bool, Any]] = []

    def deliver(ok: bool, value: Any) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def work(job: _Job) -> None:
        try:
            outcome.append((True, fn()))
        except Exception as e:     # GenerationCancelled too: the handler answers the empty line
            outcome.append((False, e))

    def after(job: _Job) -> None:  # the place is free again: now the answer may go out
        ok, value = outcome[0] if outcome else (False, GenerationCancelled("cancelled while waiting"))
        _on_loop(loop, deliver, ok, value)

    if job is None:
        job = rq.admit()
    rq.start(job, work, after)

    async def watch() -> None:     # the body is read: the next message can only be a hang-up
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()
        if not fut.done():         # still queued, or running: answer now, the work stops itself
            fut.set_exception(GenerationCancelled("the client closed the connection"))

    watcher = asyncio.ensure_future(watch()) if request is not None else None
    try:
        return await fut
    finally:
        if watcher is not None:
            watcher.cancel()
        if not fut.done():         # the handler was cancelled
            job.cancel()


# ---- streaming ---------------------------------------------------------------------------------

_END = object()


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _SSEResponse(StreamingResponse if _MISSING is None else object):  # type: ignore[misc]
    """Server-Sent Events fed by a worker job; the job is cancelled however the response ends
    (a disconnect seen by receive() or by a failed send), so a gone client frees its slot."""

    media_type = "text/event-stream"

    def __init__(self, content: Any, job: _Job):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.ensure_future(self.stream_response(send))
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            self.job.cancel()
            task.cancel()          # also ends a stream still waiting in the queue

        watcher = asyncio.ensure_future(watch())
        finished = False
        try:
            await task
            finished = True
        except asyncio.CancelledError:
            if not gone:
                raise
        except OSError:            # the send found the client gone: nothing left to tell it
            pass
        finally:
            watcher.cancel()
            task.cancel()
            if not finished:
                self.job.cancel()


def _stream_job(rq: RequestQueue, stream: Any, job: _Job | None = None,
                request_id: str | None = None) -> tuple[_Job, Any]:
    """Iterate a Client Stream on the worker, handing SSE lines to the event loop. The last
    line ([DONE], or an error event) goes out once the job's place is free again. `job`: a place
    already admitted (else one is taken here: QueueFullError when none is free)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue()
    tail: list[str] = []

    def push(item: Any) -> None:
        _on_loop(loop, out.put_nowait, item)

    def work(job: _Job) -> None:
        events = False
        try:
            for chunk in stream:
                # Responses API events go out named (`event: response.created`), as OpenAI's
                # do, and end with the last event; chat and completions end with [DONE]
                events = isinstance(chunk, ResponseEvent)
                name = f"event: {chunk['type']}\n" if events else ""
                push(f"{name}data: {chunk.model_dump_json()}\n\n")
                if job.cancelled.is_set():
                    break
            else:
                if not events:
                    tail.append("data: [DONE]\n\n")
        except GenerationCancelled:
            pass
        except APIError as e:
            tail.append(_sse({"error": e.body}))
        except Exception as e:
            log.error("request %s: the stream failed", request_id, exc_info=e)
            tail.append(_sse({"error": _internal_body(request_id)}))
        finally:
            stream.close()         # releases the model at once when stopped early

    def after(job: _Job) -> None:
        if job.reason == "shutdown" and not tail:      # cut short at the shutdown deadline
            tail.append(_sse({"error": _shutdown_body()}))
        for line in tail:          # nobody reads a stream cancelled by its client: no harm
            push(line)
        push(_END)

    async def lines():
        while True:
            # everything made since the last send goes out as one write
            items = [await out.get()]
            while not out.empty():
                items.append(out.get_nowait())
            text = "".join(i for i in items if i is not _END)
            if text:
                yield text
            if items[-1] is _END:
                return
            # a sleep(0) lets the loop see a hang-up (connection_lost, http.disconnect) between
            # writes even while the worker keeps the queue full
            await asyncio.sleep(0)

    if job is None:
        try:
            job = rq.admit()
        except (QueueFullError, ShuttingDownError):
            stream.close()
            raise
    rq.start(job, work, after)
    return job, lines()


# ---- reading requests ------------------------------------------------------------------------------

def _allowed(create: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(create).parameters) - _NOT_WIRE


def _utf8_bytes(text: str) -> int:
    """UTF-8 bytes of `text`; a lone surrogate (refused later, by the Client) counts as 3."""
    return len(text.encode("utf-8", "surrogatepass"))


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of the message text in a chat message's content (a string or text parts)."""
    if isinstance(value, str):
        return _utf8_bytes(value)
    if isinstance(value, list):
        return sum(_text_bytes(p.get("text")) for p in value if isinstance(p, dict))
    return 0


class _HostCheck:
    """Which Host header values the server answers. Bound to loopback, it answers loopback names,
    the bound name and --allowed-hosts only: a web page cannot reach it through DNS rebinding
    (its requests carry the attacker's host name). Bound elsewhere, any Host unless
    --allowed-hosts narrows it. "*" allows any; "*.example.com" any subdomain."""

    def __init__(self, bound: str | None, allowed: tuple[str, ...]):
        self.bound = bound
        names = {_host_name(h) for h in allowed if h and not h.startswith("*")}
        self.suffixes = tuple(h[1:].lower() for h in allowed if h.startswith("*.") and len(h) > 2)
        loopback = bound is not None and _is_loopback(bound)
        self.any = "*" in allowed or not (loopback or names or self.suffixes)
        self.names = names | ({_host_name(bound)} if bound else set())

    def allows(self, host: str | None) -> bool:
        if self.any or host is None:      # no Host at all: HTTP/1.0, never a browser
            return True
        name = _host_name(host)
        return _is_loopback(name) or name in self.names or name.endswith(self.suffixes)

    def refusal(self, host: str) -> dict[str, Any]:
        shown = _host_name(host)
        where = f"listens on {self.bound} and " if self.bound else ""
        return {"message": f"Host {host!r} is not allowed: this server {where}answers only loopback "
                           f"names (localhost, 127.0.0.1, [::1]) and the names it is given, so web "
                           f"pages cannot reach it through DNS rebinding; to reach it as {shown!r} "
                           f"start it with --allowed-hosts {shown}",
                "type": "invalid_request_error", "param": None, "code": "host_not_allowed"}


def _host_name(value: str) -> str:
    """The host of a Host header value, lower case, without port or brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    if v.count(":") == 1:
        v = v.split(":")[0]
    return v.rstrip(".")


def _is_loopback(name: str) -> bool:
    name = name.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _Guard:
    """Outermost ASGI layer: a request id for every request (the x-request-id header), the Host
    check, and paths with a trailing slash served as without (no redirect)."""

    def __init__(self, app: Any, hosts: _HostCheck):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = f"req_{uuid.uuid4().hex[:24]}"
        scope.setdefault("state", {})["request_id"] = rid
        path = scope.get("path", "")
        if len(path) > 1 and path.endswith("/"):
            scope["path"] = path.rstrip("/") or "/"
            raw = scope.get("raw_path")
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", rid.encode())]}
            await send(message)

        host = None
        for k, v in scope.get("headers", ()):
            if k == b"host":
                host = v.decode("latin-1")
                break
        if not self.hosts.allows(host):
            return await _error(403, self.hosts.refusal(host or ""))(scope, receive, send_with_id)
        await self.app(scope, receive, send_with_id)


# ---- the app -------------------------------------------------------------------------------------

class _App:
    def __init__(self, model: Model, config: ServerConfig):
        self.model = model
        self.config = config
        self.names = (model.name,) + tuple(a for a in config.aliases if a != model.name)
        self.client = Client({n: model for n in self.names})
        self.queue = RequestQueue(config.max_queue, workers=model.parallel)
        self.created = int(time.time())
        self.stopping = False
        c = self.client
        self.endpoints = {
            "chat": (c.chat.completions.create, _allowed(c.chat.completions.create), EXTRA_CHAT),
            "completions": (c.completions.create, _allowed(c.completions.create), EXTRA_COMPLETIONS),
            "embeddings": (c.embeddings.create, _allowed(c.embeddings.create), EXTRA_EMBEDDING),
            "responses": (c.responses.create, _allowed(c.responses.create), EXTRA_RESPONSES),
        }
        # no token of the vocabulary spells more bytes than this: a text of B bytes is at least
        # B / max_token_bytes tokens, which refuses a prompt far past the context untokenized
        tok, valid = model.tokenizer, model._valid
        self.max_token_bytes = max([len(tok.token_bytes(i)) for i in range(len(valid)) if valid[i]]
                                   or [1])

    # -- shutdown --
    def begin_shutdown(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Take no new requests; end the ones still running after `timeout` seconds (streams
        with an error event). Call on the event loop."""
        self.stopping = True
        self.queue.closing = True
        loop.call_later(max(timeout, 0), self._end_all)

    def _end_all(self) -> None:
        for job in self.queue.jobs():
            job.cancel("shutdown")

    # -- request reading --
    def _check_key(self, request: "Request") -> None:
        key = self.config.api_key
        if key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise _WireError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY' "
                                  "with the key the server was started with (--api-key)",
                             code="invalid_api_key")

    async def _json_body(self, request: "Request") -> dict[str, Any]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise _WireError(400, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                             code="invalid_content_type")
        cap = self.config.max_body_bytes
        too_big = _WireError(413, f"the request body is larger than {cap} bytes",
                             code="request_too_large", headers={"Connection": "close"})
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise too_big
        parts: list[bytes] = []
        n = 0

        async def read() -> None:
            nonlocal n
            async for part in request.stream():
                n += len(part)
                if n > cap:
                    raise too_big
                parts.append(part)
        try:
            # wait_for, not asyncio.timeout (3.11+): ignis runs on 3.10 too, where wait_for's
            # TimeoutError is asyncio's own class, not the builtin
            await asyncio.wait_for(read(), self.config.body_timeout)
        except ClientDisconnect:
            raise _WireError(400, "the client closed the connection before sending the whole "
                                  "body") from None
        except asyncio.TimeoutError:
            said = f" of the {length} its Content-Length announced" if length.isdigit() else ""
            raise _WireError(408, f"the request body did not arrive within "
                                  f"{self.config.body_timeout:g} s ({n} bytes came{said}); send the "
                                  f"whole body with the request", code="request_timeout",
                             headers={"Connection": "close"}) from None

        def no_constants(name: str) -> Any:
            raise ValueError(f"{name} is not valid JSON")
        def too_deep(where: str | None) -> _WireError:
            at = f" (at {where[:60]}{'...' if len(where) > 60 else ''})" if where else ""
            return _WireError(400, f"the request body nests JSON arrays and objects more than "
                                   f"{MAX_NESTING} levels deep{at}; ignis reads at most "
                                   f"{MAX_NESTING} levels", param=where, code="invalid_json")
        try:
            body = json.loads(b"".join(parts), parse_constant=no_constants)
        except RecursionError:            # deeper than the parser goes (~1000 levels)
            raise too_deep(None) from None
        except ValueError as e:
            raise _WireError(400, f"the request body is not valid JSON ({e}); send a JSON object",
                             code="invalid_json") from None
        if not isinstance(body, dict):
            raise _WireError(400, f"the request body must be a JSON object, got "
                                  f"{type(body).__name__}", code="invalid_json")
        try:
            # nesting only: the Client checks the text of every field (one walk, not two), and
            # _kwargs the field names it reads itself
            check_request_value(body, None, texts=False)
        except InvalidParameterError as e:
            raise too_deep(e.param) from None
        return body

    def _kwargs(self, which: str, body: dict[str, Any]) -> dict[str, Any]:
        _, allowed, extra_keys = self.endpoints[which]
        body = dict(body)
        try:     # the names read here, before the Client sees the rest: errors must be UTF-8
            for k in body:
                check_text(k, field_name(None, k), what=f"the field name '{field_name(None, k)}'")
            if isinstance(body.get("model"), str):
                check_text(body["model"], "model")
        except InvalidParameterError as e:
            raise _WireError(400, str(e), param=e.param, code=e.code) from None
        # the official client merges extra_body into the top level of the JSON body
        extra = {k: body.pop(k) for k in extra_keys if k in body}
        for k in _REQUIRED[which]:
            if k not in body:
                raise _WireError(400, f"Missing required parameter: '{k}'.", param=k,
                                 code="missing_required_parameter")
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise _WireError(400, f"Unrecognized request argument supplied: {unknown[0]}",
                             param=unknown[0], code="unknown_parameter")
        name = body["model"]
        if isinstance(name, str) and name and name not in self.names:
            raise _WireError(404, f"The model {name!r} does not exist; this server serves "
                                  f"{self.names[0]!r}", param="model", code="model_not_found")
        body["extra_body"] = extra or None
        return body

    def _check_text_size(self, which: str, kwargs: dict[str, Any]) -> None:
        """Refuse, before tokenizing, text that cannot fit the context whatever its tokens."""
        key = {"chat": "messages", "responses": "input"}.get(which)
        if which == "chat":
            messages = kwargs.get("messages")
            texts = [("messages", sum(_text_bytes(m.get("content")) for m in messages
                                      if isinstance(m, dict)))] if isinstance(messages, list) else []
        elif which == "responses":
            value = kwargs.get("input")
            n = _text_bytes(value) if isinstance(value, str) else sum(
                _text_bytes(m.get("content")) + _text_bytes(m.get("output")) for m in value
                if isinstance(m, dict)) if isinstance(value, list) else 0
            texts = [("input", n + _text_bytes(kwargs.get("instructions")))]
        else:
            key = "prompt" if which == "completions" else "input"
            value = kwargs.get(key)
            items = value if isinstance(value, list) else [value]
            texts = [(f"{key}[{i}]" if isinstance(value, list) else key, _utf8_bytes(s))
                     for i, s in enumerate(items) if isinstance(s, str)]
        n_ctx, most = self.model.n_ctx, self.max_token_bytes
        for where, n in texts:
            if n > n_ctx * most:
                raise _WireError(
                    400, f"This model's maximum context length is {n_ctx} tokens. However, "
                         f"{where} holds {n} bytes of text, at least {-(-n // most)} tokens (no "
                         f"token of this model spells more than {most} bytes). Please reduce the "
                         f"length of the {key}.",
                    param=key, code="context_length_exceeded")

    # -- handlers --
    async def generate(self, request: "Request", which: str) -> "Response":
        self._check_key(request)
        if self.stopping:
            raise ShuttingDownError("the server is shutting down and takes no new requests")
        kwargs = self._kwargs(which, await self._json_body(request))
        self._check_text_size(which, kwargs)
        create = self.endpoints[which][0]
        job = self.queue.admit()          # a place first: a busy server does no work for a 503
        if which != "embeddings" and kwargs.get("stream") is True:
            # validation and tokenization happen here, off the event loop, before the 200
            try:
                stream = await run_in_threadpool(lambda: create(**kwargs))
            except BaseException:
                job.cancel("unused")
                raise
            if job.cancelled.is_set():    # the server began to stop meanwhile
                stream.close()
                raise ShuttingDownError("the server is shutting down and takes no new requests")
            job, lines = _stream_job(self.queue, stream, job, request.state.request_id)
            return _SSEResponse(lines, job)
        try:
            result = await _run_on_worker(self.queue, lambda: create(**kwargs), request, job)
        except GenerationCancelled as e:
            if job.reason == "shutdown":
                return _error(503, _shutdown_body(), {"Retry-After": RETRY_AFTER})
            # the client hung up and its work was stopped; this answer reaches no one
            return _error(499, {"message": str(e), "type": "invalid_request_error", "param": None,
                                "code": "client_closed_request"})
        return JSONResponse(result.model_dump())

    async def chat(self, request: "Request") -> "Response":
        return await self.generate(request, "chat")

    async def completions(self, request: "Request") -> "Response":
        return await self.generate(request, "completions")

    async def embeddings(self, request: "Request") -> "Response":
        return await self.generate(request, "embeddings")

    async def responses(self, request: "Request") -> "Response":
        return await self.generate(request, "responses")

    async def response_info(self, request: "Request") -> "Response":
        self._check_key(request)
        return JSONResponse(self.client.responses.retrieve(request.path_params["id"]).model_dump())

    def _model_list(self) -> ModelList:
        return ModelList(data=[ModelInfo(id=self.names[0], created=self.created)])

    async def models(self, request: "Request") -> "Response":
        self._check_key(request)
        return JSONResponse(self._model_list().model_dump())

    async def model_info(self, request: "Request") -> "Response":
        self._check_key(request)
        name = request.path_params["name"]
        if name not in self.names:
            raise _WireError(404, f"The model {name!r} does not exist", param="model",
                             code="model_not_found")
        return JSONResponse(ModelInfo(id=name, created=self.created).model_dump())

    async def health(self, request: "Request") -> "Response":
        body = {"status": "stopping" if self.stopping else "ok", "model": self.names[0],
                "weight_format": getattr(self.model, "weight_format", None),
                "kv_dtype": getattr(self.model, "kv_dtype", None), **self.queue.stats()}
        spec = getattr(self.model, "speculative_stats", None)
        if spec is not None:
            default = self.model.speculative
            body["speculative"] = {**spec.as_dict(),
                                   "default": default.name if default is not None else None}
        sched = self.model._scheduler
        if sched is not None:
            st = sched.stats
            body["batching"] = {"steps": st.steps, "rows": st.rows,
                                "mean_batch": round(st.mean_batch, 3)}
        # a load balancer stops sending work to a server that is draining
        if self.stopping:
            return JSONResponse(body, status_code=503, headers={"Retry-After": RETRY_AFTER})
        return JSONResponse(body)


def _error_response(request: Any, e: BaseException) -> "Response":
    """Any exception as one OpenAI error object. Internal errors are logged with the request id
    and answered with the id only: their class and message are for the operator, not the client."""
    if isinstance(e, _WireError):
        return _error(e.status, e.body, e.headers)
    if isinstance(e, APIError):
        return _error(e.status_code, e.body)
    if isinstance(e, QueueFullError):
        return _error(503, {"message": str(e), "type": "server_error", "param": None,
                            "code": "server_busy"}, {"Retry-After": RETRY_AFTER})
    if isinstance(e, ShuttingDownError):
        return _error(503, _shutdown_body(), {"Retry-After": RETRY_AFTER, "Connection": "close"})
    if isinstance(e, HTTPException):
        what = "no such endpoint" if e.status_code == 404 else e.detail
        return _error(e.status_code, {"message": f"{request.method} {request.url.path}: {what}",
                                      "type": "invalid_request_error", "param": None,
                                      "code": "unknown_url" if e.status_code == 404 else None})
    rid = request.scope.get("state", {}).get("request_id")
    log.error("request %s: internal error on %s %s", rid, request.method, request.url.path,
              exc_info=e)
    return _error(500, _internal_body(rid))


def _guarded(handler: Callable[["Request"], Any]) -> Callable[["Request"], Any]:
    """The handler with every exception answered as an error object (none reaches starlette's
    ServerErrorMiddleware, whose 500 would bypass the request id)."""
    async def endpoint(request: "Request") -> "Response":
        try:
            return await handler(request)
        except Exception as e:
            return _error_response(request, e)
    return endpoint


async def _on_wire_error(request: Any, e: Exception) -> "Response":
    return _error_response(request, e)


def build_app(model: Model, config: ServerConfig | None = None) -> "_Served":
    """The ASGI app serving `model` (run it with uvicorn, or use serve()): starlette's app inside
    the Host check and request ids; `.state.ignis` is the server's state. Set config.host to the
    address it is served on, so a loopback server answers loopback Host names only."""
    require_server_dependencies()
    config = config or ServerConfig()
    a = _App(model, config)
    routes = [
        Route("/v1/chat/completions", _guarded(a.chat), methods=["POST"]),
        Route("/v1/completions", _guarded(a.completions), methods=["POST"]),
        Route("/v1/embeddings", _guarded(a.embeddings), methods=["POST"]),
        Route("/v1/responses", _guarded(a.responses), methods=["POST"]),
        Route("/v1/responses/{id}", _guarded(a.response_info), methods=["GET"]),
        Route("/v1/models", _guarded(a.models), methods=["GET"]),
        Route("/v1/models/{name:path}", _guarded(a.model_info), methods=["GET"]),
        Route("/health", _guarded(a.health), methods=["GET"]),
    ]
    handlers = {c: _on_wire_error for c in (HTTPException, Exception)}
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    app.router.redirect_slashes = False
    if config.cors_origins:
        # the origins named may call from a public page to this machine (Private Network Access)
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           allow_private_network=True,
                           expose_headers=["x-request-id", "retry-after"], max_age=600)
    app.state.ignis = a
    return _Served(app, _HostCheck(config.host, config.allowed_hosts))


class _Served(_Guard):
    """What build_app returns: the guarded app, with the Starlette app's `state` at hand."""

    @property
    def state(self) -> Any:
        return self.app.state


def _http_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol with a deadline for each request's line and headers, which uvicorn
    lacks: a client that connects and sends nothing, or half a header, would hold a connection
    forever. Partial headers get a 408; a connection with nothing sent is closed."""

    class Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()        # the next request on a kept-alive connection begins
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0] and self.conn.our_state is h11.IDLE:
                body = json.dumps({"error": {
                    "message": f"the request line and headers did not arrive within "
                               f"{header_timeout:g} s", "type": "invalid_request_error",
                    "param": None, "code": "request_timeout"}}).encode()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: "
                                     b"application/json\r\nconnection: close\r\ncontent-length: "
                                     + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.transport.close()

    return Protocol


def uvicorn_config(app: Any, *, host: str, port: int, config: ServerConfig) -> "uvicorn.Config":
    """uvicorn settings for `app`: the timeouts of `config`, the h11 protocol with its header
    deadline. uvicorn's own graceful-shutdown deadline is a backstop behind ours."""
    return uvicorn.Config(app, host=host, port=port, log_level="warning",
                          http=_http_protocol(config.header_timeout),
                          timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]
                          timeout_graceful_shutdown=config.shutdown_timeout + 10)  # type: ignore[arg-type]


class _Server(uvicorn.Server if _MISSING is None else object):  # type: ignore[misc]
    """uvicorn's server, stopped our way: the first SIGTERM/SIGINT stops accepting and gives
    running requests `shutdown_timeout` seconds, a second ends them at once; the process then
    exits 0 (uvicorn would re-raise the signal: exit 143, or KeyboardInterrupt)."""

    def __init__(self, config: "uvicorn.Config", app: _App):
        super().__init__(config)
        self.ignis = app
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def handle_exit(self, sig: int, frame: Any) -> None:
        timeout = 0 if self.should_exit else self.ignis.config.shutdown_timeout
        self.should_exit = True
        if self._loop is not None:
            _on_loop(self._loop, self.ignis.begin_shutdown, self._loop, timeout)


def serve(model: Model, *, host: str = "127.0.0.1", port: int = 8000,
          config: ServerConfig | None = None) -> None:
    """Serve `model` until SIGTERM/SIGINT (blocking); returns once the requests are finished."""
    config = dataclasses.replace(config or ServerConfig(), host=host)   # the Host check's address
    app = build_app(model, config)
    a = app.state.ignis
    shown = f"[{host}]" if ":" in host else host
    print(f"ignis serve: {a.names[0]!r} at http://{shown}:{port}/v1 "
          f"({a.queue.workers} request(s) at once with batched decoding, up to "
          f"{a.queue.max_waiting} waiting"
          f"{', API key required' if a.config.api_key else ''})", file=sys.stderr, flush=True)
    # the grammar engine's index of the vocabulary (~0.3 s for 151k ids), off the first
    # structured-output request's time
    threading.Thread(target=model.constrainer.warm, name="ignis-grammar-warm", daemon=True).start()
    server = _Server(uvicorn_config(app, host=host, port=port, config=config), a)
    try:
        server.run()
    finally:
        # work cancelled at the deadline stops at its next token: let it, rather than exit mid-step
        a.queue.close(wait=10)
