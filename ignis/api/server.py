"""`ignis serve`: an OpenAI-compatible HTTP server (starlette + uvicorn), a thin wire layer over an
ignis.Client bound to one loaded model, so the HTTP API and the in-process Client cannot disagree.

    ignis serve qwen2.5-coder-0.5b-instruct --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "qwen2.5-coder-0.5b-instruct", "messages": [{"role": "user", "content": "hi"}]}'

Concurrency: the model is loaded with `parallel` KV slots and the server runs that many requests
at once, one worker thread each; their forward steps are batched (ignis.generate.batch), so one
pass over the weights serves every running sequence and aggregate tokens/s grows with the number
of streams. Admitted requests beyond those wait in a bounded FIFO (`max_queue`; more get 503), so
the event loop stays free (/health answers during generations). A stream whose client disconnects
stops before its next token and frees its slot, streaming or not; one still waiting leaves the
queue at once.
"""
from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import IgnisError
from ..generate import GenerationCancelled, cancel_when
from .client import EXTRA_EMBEDDING, EXTRA_SAMPLING, APIError, Client
from .model import Model
from .types import ModelInfo, ModelList

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    _MISSING: ImportError | None = None
except ImportError as _e:          # `ignis serve` says how to install them; the rest of ignis works
    _MISSING = _e

MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_QUEUE = 16
# create() arguments that only make sense in-process (the official client never sends them as JSON)
_NOT_WIRE = {"extra_body", "extra_headers", "extra_query", "timeout"}
_REQUIRED = {"chat": ("model", "messages"), "completions": ("model", "prompt"),
             "embeddings": ("model", "input")}

log = logging.getLogger("ignis.server")


class ServerDependencyError(IgnisError, ImportError):
    """starlette/uvicorn (the `server` extra) are not installed."""


class QueueFullError(IgnisError, RuntimeError):
    """Every request slot is taken: the client should retry later (HTTP 503)."""


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


class _WireError(Exception):
    """An error answered before any work: becomes one OpenAI error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {"message": message, "type": type, "param": param, "code": code}


def _error(status: int, body: dict[str, Any]) -> "Response":
    return JSONResponse({"error": body}, status_code=status)


# ---- the workers: one thread per KV slot ---------------------------------------------------------

class _Job:
    """One admitted request. `work` runs on the worker thread; `cancel()` (a client gone) frees the
    slot at once when still waiting, or asks the running work to stop at its next chance."""

    def __init__(self, owner: "RequestQueue", work: Callable[["_Job"], None]):
        self._owner = owner
        self.work = work
        self.state = "waiting"            # waiting -> running -> done, or waiting -> cancelled
        self.cancelled = threading.Event()
        self.finished = False             # the work has handed over everything it will make

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._owner._cancel(self)


class RequestQueue:
    """A bounded FIFO served by `workers` threads: up to `workers` running + at most `max_waiting`
    waiting. With as many workers as the model has KV slots every running request holds a slot
    on its own thread (a thread never waits for a slot it holds itself)."""

    def __init__(self, max_waiting: int, workers: int = 1):
        if max_waiting < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_waiting}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.max_waiting = max_waiting
        self.workers = workers
        self._lock = threading.Lock()
        self._in_flight = 0
        self._running = 0
        self._abandoned = 0        # requests whose client left before they finished
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

    def submit(self, work: Callable[[_Job], None]) -> _Job:
        job = _Job(self, work)
        with self._lock:
            if self._in_flight >= self.workers + self.max_waiting:
                raise QueueFullError(f"the server is busy: {self._running} request(s) running and "
                                     f"{self._in_flight - self._running} waiting (max "
                                     f"{self.max_waiting}); retry later")
            self._in_flight += 1
        self._q.put(job)
        return job

    def _cancel(self, job: _Job) -> None:
        with self._lock:
            if job.state == "waiting":
                job.state = "cancelled"
                self._in_flight -= 1
                self._abandoned += 1
            elif job.state == "running" and not job.finished:
                self._abandoned += 1

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
                    job.work(job)
            except GenerationCancelled:
                pass
            except BaseException:     # work delivers its own errors; this is a last resort
                log.exception("request worker failed")
            finally:
                with self._lock:
                    job.state = "done"
                    self._running -= 1
                    self._in_flight -= 1

    def close(self) -> None:
        for _ in self._threads:
            self._q.put(None)


async def _run_on_worker(rq: RequestQueue, fn: Callable[[], Any], request: "Request | None" = None) -> Any:
    """fn() on a worker thread, awaited; its exception is re-raised here. With `request`, a
    client that hangs up while waiting cancels the job (a generation stops at its next token)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def work(job: _Job) -> None:
        try:
            r = fn()
        except Exception as e:     # GenerationCancelled too: the handler answers the empty line
            loop.call_soon_threadsafe(deliver, False, e)
        else:
            loop.call_soon_threadsafe(deliver, True, r)

    job = rq.submit(work)

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
        if not fut.done():         # the handler was cancelled (server shutdown)
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


def _stream_job(rq: RequestQueue, stream: Any) -> tuple[_Job, Any]:
    """Iterate a Client Stream on the worker, handing SSE lines to the event loop."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue()

    def push(item: Any) -> None:
        loop.call_soon_threadsafe(out.put_nowait, item)

    def work(job: _Job) -> None:
        try:
            for chunk in stream:
                push(f"data: {chunk.model_dump_json()}\n\n")
                if job.cancelled.is_set():
                    break
            else:
                push("data: [DONE]\n\n")
        except GenerationCancelled:
            pass                   # the client is gone: nobody to tell
        except APIError as e:
            push(_sse({"error": e.body}))
        except Exception as e:
            log.exception("stream failed")
            push(_sse({"error": {"message": f"internal error: {type(e).__name__}: {e}",
                                 "type": "server_error", "param": None, "code": "internal_error"}}))
        finally:
            stream.close()         # releases the model at once when stopped early
            job.finished = True
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

    try:
        job = rq.submit(work)
    except QueueFullError:
        stream.close()
        raise
    return job, lines()


# ---- the app -------------------------------------------------------------------------------------

def _allowed(create: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(create).parameters) - _NOT_WIRE


class _App:
    def __init__(self, model: Model, config: ServerConfig):
        self.model = model
        self.config = config
        self.names = (model.name,) + tuple(a for a in config.aliases if a != model.name)
        self.client = Client({n: model for n in self.names})
        self.queue = RequestQueue(config.max_queue, workers=model.parallel)
        self.created = int(time.time())
        c = self.client
        self.endpoints = {
            "chat": (c.chat.completions.create, _allowed(c.chat.completions.create), EXTRA_SAMPLING),
            "completions": (c.completions.create, _allowed(c.completions.create), EXTRA_SAMPLING),
            "embeddings": (c.embeddings.create, _allowed(c.embeddings.create), EXTRA_EMBEDDING),
        }

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
                             code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise too_big
        parts, n = [], 0
        try:
            async for part in request.stream():
                n += len(part)
                if n > cap:
                    raise too_big
                parts.append(part)
        except ClientDisconnect:
            raise _WireError(400, "the client closed the connection before sending the whole "
                                  "body") from None

        def no_constants(name: str) -> Any:
            raise ValueError(f"{name} is not valid JSON")
        try:
            body = json.loads(b"".join(parts), parse_constant=no_constants)
        except (ValueError, RecursionError) as e:
            raise _WireError(400, f"the request body is not valid JSON ({e}); send a JSON object",
                             code="invalid_json") from None
        if not isinstance(body, dict):
            raise _WireError(400, f"the request body must be a JSON object, got "
                                  f"{type(body).__name__}", code="invalid_json")
        return body

    def _kwargs(self, which: str, body: dict[str, Any]) -> dict[str, Any]:
        _, allowed, extra_keys = self.endpoints[which]
        body = dict(body)
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

    # -- handlers --
    async def generate(self, request: "Request", which: str) -> "Response":
        self._check_key(request)
        kwargs = self._kwargs(which, await self._json_body(request))
        create = self.endpoints[which][0]
        if which != "embeddings" and kwargs.get("stream") is True:
            # validation and tokenization happen here, before the 200 and the first event
            stream = await run_in_threadpool(lambda: create(**kwargs))
            job, lines = _stream_job(self.queue, stream)
            return _SSEResponse(lines, job)
        try:
            result = await _run_on_worker(self.queue, lambda: create(**kwargs), request)
        except GenerationCancelled as e:
            # the client hung up and its generation was stopped; this answer reaches no one
            return _error(499, {"message": str(e), "type": "invalid_request_error", "param": None,
                                "code": "client_closed_request"})
        return JSONResponse(result.model_dump())

    async def chat(self, request: "Request") -> "Response":
        return await self.generate(request, "chat")

    async def completions(self, request: "Request") -> "Response":
        return await self.generate(request, "completions")

    async def embeddings(self, request: "Request") -> "Response":
        return await self.generate(request, "embeddings")

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
        body = {"status": "ok", "model": self.names[0], **self.queue.stats()}
        sched = self.model._scheduler
        if sched is not None:
            st = sched.stats
            body["batching"] = {"steps": st.steps, "rows": st.rows,
                                "mean_batch": round(st.mean_batch, 3)}
        return JSONResponse(body)


async def _on_wire_error(request: Any, e: Exception) -> "Response":
    if isinstance(e, _WireError):
        return _error(e.status, e.body)
    if isinstance(e, APIError):
        return _error(e.status_code, e.body)
    if isinstance(e, QueueFullError):
        return _error(503, {"message": str(e), "type": "server_error", "param": None,
                            "code": "server_busy"})
    if isinstance(e, HTTPException):
        what = "no such endpoint" if e.status_code == 404 else e.detail
        return _error(e.status_code, {"message": f"{request.method} {request.url.path}: {what}",
                                      "type": "invalid_request_error", "param": None,
                                      "code": "unknown_url" if e.status_code == 404 else None})
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=e)
    return _error(500, {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                        "param": None, "code": "internal_error"})


def build_app(model: Model, config: ServerConfig | None = None) -> "Starlette":
    """The ASGI app serving `model` (run it with uvicorn, or use serve())."""
    require_server_dependencies()
    a = _App(model, config or ServerConfig())
    routes = [
        Route("/v1/chat/completions", a.chat, methods=["POST"]),
        Route("/v1/completions", a.completions, methods=["POST"]),
        Route("/v1/embeddings", a.embeddings, methods=["POST"]),
        Route("/v1/models", a.models, methods=["GET"]),
        Route("/v1/models/{name:path}", a.model_info, methods=["GET"]),
        Route("/health", a.health, methods=["GET"]),
    ]
    handlers = {c: _on_wire_error for c in (_WireError, APIError, QueueFullError, HTTPException,
                                            Exception)}
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    app.state.ignis = a
    return app


def serve(model: Model, *, host: str = "127.0.0.1", port: int = 8000,
          config: ServerConfig | None = None) -> None:
    """Serve `model` until interrupted (blocking)."""
    app = build_app(model, config)
    a = app.state.ignis
    print(f"ignis serve: {a.names[0]!r} at http://{host}:{port}/v1 "
          f"({a.queue.workers} request(s) at once with batched decoding, up to "
          f"{a.queue.max_waiting} waiting"
          f"{', API key required' if a.config.api_key else ''})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
