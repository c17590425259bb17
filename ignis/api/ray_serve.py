"""`ignis serve --ray`: the OpenAI-compatible server as a Ray Serve application, so one model is
served by many replicas across the machines of a Ray cluster.

    from ignis.api.ray_serve import build_app
    serve.run(build_app("qwen2.5-coder-0.5b-instruct", num_replicas=2, threads_per_replica=1))

Two deployments. `IgnisReplica` holds one ignis Model (its KV slots, its batching) and runs
ignis's own ASGI app (ignis.api.server.build_app) on each request handed to it, so every route,
error object and limit is the single-process server's. `IgnisIngress` takes the HTTP requests
from Ray's proxy, reads the body and hands the request to a replica through a deployment handle:
a handle call, unlike the proxy's, carries the prompt where a request router can read it, which is
what lets Ray's prefix-cache-affinity router send a conversation back to the replica whose KV slot
holds its prefix.

Why not ray.serve.llm: its OpenAI front end builds vLLM's (or SGLang's) request and response
classes and will not import without one of them installed, and LLMConfig accepts no engine but
"vLLM"; only the engine class can be swapped, behind those types. ignis keeps its own wire layer.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..errors import IgnisError
from .server import RETRY_AFTER, ServerConfig, _internal_body, require_server_dependencies

try:
    import ray
    from ray import serve
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
    _MISSING_RAY: ImportError | None = None
except ImportError as _e:          # ignis[ray] is optional: say how to install it when asked for
    _MISSING_RAY = _e

log = logging.getLogger("ignis.ray_serve")

DEFAULT_PARALLEL = 4               # KV slots per replica, as `ignis serve --parallel`
# Ray's prefix-cache-affinity router (its ray.serve.llm.request_router export imports vLLM's
# types; the class itself needs only Ray Serve). Tested with the ray range pinned in ignis[ray].
PREFIX_ROUTER = ("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
                 "PrefixCacheAffinityRouter")
# the endpoints whose prompts fill a KV slot: only these are routed by prefix
_PREFIX_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
                 "/v1/responses": "responses"}


class RayDependencyError(IgnisError, ImportError):
    """Ray Serve (the `ray` extra) is not installed."""


class RayServeConfigError(IgnisError, ValueError):
    """The replica or autoscaling options do not make sense together."""


def require_ray() -> None:
    require_server_dependencies()
    if _MISSING_RAY is not None:
        raise RayDependencyError(f"ignis serve --ray needs Ray Serve ({_MISSING_RAY}); install it "
                                 f"with: pip install 'ignis[ray]'")


@dataclass
class ReplicaSpec:
    """What each replica loads: the arguments of ignis.load, and the wire settings of ignis serve."""
    model: str
    weights: str = "auto"
    ctx: int | None = None
    threads: int = 1
    parallel: int = DEFAULT_PARALLEL
    kv_dtype: str = "auto"
    speculative: str | None = "auto"     # ignis.load's (and ignis serve --speculative's)
    server: ServerConfig = field(default_factory=ServerConfig)


# ---- what the ingress hands a replica -------------------------------------------------------------

@dataclass
class ForwardedRequest:
    """One HTTP request as read by the ingress. `prompt` is the text a prefix router matches (the
    chat messages' or completion prompt's text, in order); it is named so because Ray's router
    reads a `prompt` (or `messages`) attribute of the call's first argument."""
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    complete: bool          # False: the client stopped sending before the body ended (a timeout)
    client: tuple[str, int] | None
    prompt: str = ""


def _text_of(value: Any) -> str:
    """The text of a message content, prompt or input: strings, lists of them, content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        return _text_of(value.get("content"))
    return ""


def routing_text(which: str, body: bytes) -> str:
    """The prompt text of a request body for prefix routing; "" when there is none to match (a
    malformed body is refused by the replica, whichever it lands on)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(obj, dict):
        return ""
    if which == "chat":
        return _text_of(obj.get("messages"))
    if which == "completions":
        return _text_of(obj.get("prompt"))
    return _text_of(obj.get("instructions")) + _text_of(obj.get("input"))


# ---- the replica ----------------------------------------------------------------------------------

class IgnisReplica:
    """One ignis Model and ignis's ASGI app over it. handle() runs one forwarded request through
    the app and yields what it sends: ("start", status, headers), then ("body", bytes) pieces."""

    def __init__(self, spec: ReplicaSpec):
        from .load import load
        from .server import build_app
        self.spec = spec
        self.model = load(spec.model, weight_format=spec.weights, n_ctx=spec.ctx,
                          threads=spec.threads, kv_dtype=spec.kv_dtype, progress=False,
                          parallel=spec.parallel, speculative=spec.speculative)
        self.app = build_app(self.model, spec.server)
        self.state = self.app.state.ignis
        try:
            self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        except Exception:      # noqa: BLE001 - constructed outside Ray (tests, a REPL)
            self.replica = "local"
        self.closed = False

    async def handle(self, req: ForwardedRequest) -> AsyncIterator[tuple]:
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": req.body, "more_body": not req.complete}
            await gone.wait()      # the body is all there is: what comes next is the hang-up
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await out.put(message)

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": "1.1", "method": req.method, "scheme": "http",
                 "path": req.path, "raw_path": req.path.encode(), "root_path": "",
                 "query_string": req.query_string, "headers": req.headers,
                 "client": req.client, "server": None}
        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda t: out.put_nowait(None))
        try:
            while True:
                m = await out.get()
                if m is None:
                    break
                if m["type"] == "http.response.start":
                    headers = [(k, v) for k, v in m.get("headers", [])]
                    headers.append((b"x-ignis-replica", self.replica.encode()))
                    yield ("start", m["status"], headers)
                elif m["type"] == "http.response.body":
                    if m.get("body"):
                        yield ("body", bytes(m["body"]))
                    if not m.get("more_body"):
                        break
            await task
        finally:
            gone.set()             # the caller went away (or we are done): the app sees it
            if not task.done():
                await asyncio.wait([task], timeout=5)

    def check_health(self) -> None:
        """Ray Serve calls this periodically; raising marks the replica unhealthy, and Ray
        replaces it. Unhealthy: the batching thread or a request worker has died, or the model
        was closed, so no request on this replica could finish."""
        if self.closed:
            raise RuntimeError("the replica's model was closed")
        sched = self.model._scheduler
        if sched is not None and (sched._closed or not sched._thread.is_alive()):
            raise RuntimeError("the replica's batching thread has stopped: its engine cannot run")
        dead = [t.name for t in self.state.queue._threads if not t.is_alive()]
        if dead:
            raise RuntimeError(f"the replica's request workers stopped: {', '.join(dead)}")

    def shutdown(self) -> None:
        """Ray Serve has stopped routing here and waited graceful_shutdown_timeout_s for the
        running requests: end what remains (streams get the shutdown error event), free the model."""
        if self.closed:
            return
        self.closed = True
        self.state.stopping = True
        self.state.queue.closing = True
        self.state._end_all()
        self.state.queue.close(wait=10)
        self.model.close()

    def __del__(self) -> None:     # what Ray Serve calls when it stops a replica
        try:
            self.shutdown()
        except Exception:          # noqa: BLE001 - a half-built replica has nothing to free
            pass


# ---- the ingress ----------------------------------------------------------------------------------

def _error_json(status: int, body: dict[str, Any], retry: bool = False) -> Any:
    from starlette.responses import JSONResponse
    return JSONResponse({"error": body}, status_code=status,
                        headers={"Retry-After": RETRY_AFTER} if retry else None)


def _unavailable_body(what: str) -> dict[str, Any]:
    return {"message": f"the replica serving this request stopped ({what}); retry the request: "
                       f"Ray Serve sends it to another replica", "type": "server_error",
            "param": None, "code": "replica_unavailable"}


_DROP = {b"content-length", b"transfer-encoding", b"connection"}


class IgnisIngress:
    """The HTTP side: reads each request (at most max_body_bytes + 1 of it, within body_timeout)
    and hands it to a replica; a replica that dies or is gone becomes a 503 with Retry-After
    before the response has begun, or an error event ending a stream that had."""

    def __init__(self, replicas: Any, server: ServerConfig):
        self.replicas = replicas.options(stream=True)
        self.server = server

    async def _read(self, request: Any) -> tuple[bytes, bool]:
        cap = self.server.max_body_bytes
        parts: list[bytes] = []
        n = 0

        async def read() -> None:
            nonlocal n
            async for part in request.stream():
                parts.append(part)
                n += len(part)
                if n > cap:          # enough to be refused (413) by the replica as ignis serve does
                    return
        try:
            await asyncio.wait_for(read(), self.server.body_timeout)
            complete = True
        except asyncio.TimeoutError:
            complete = False         # the replica's own deadline answers the 408
        return b"".join(parts), complete

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse
        body, complete = await self._read(request)
        scope = request.scope
        path = scope.get("path", "")
        which = _PREFIX_PATHS.get(path.rstrip("/") or "/") if request.method == "POST" else None
        fwd = ForwardedRequest(method=request.method, path=path,
                               query_string=scope.get("query_string", b""),
                               headers=list(scope.get("headers", [])), body=body,
                               complete=complete, client=scope.get("client"),
                               prompt=routing_text(which, body) if which and complete else "")
        # positional: the router reads the prompt of the first argument; a request with no text
        # to match goes by keyword, which the prefix router passes to its power-of-two fallback
        gen = (self.replicas.handle.remote(fwd) if fwd.prompt
               else self.replicas.handle.remote(req=fwd))
        try:
            first = await gen.__anext__()
        except BackPressureError:
            gen.cancel()
            return _error_json(503, {"message": "every replica is busy and the queue in front of "
                                                "them is full; retry later", "type": "server_error",
                                     "param": None, "code": "server_busy"}, retry=True)
        except (RayActorError, DeploymentUnavailableError) as e:
            gen.cancel()
            return _error_json(503, _unavailable_body(type(e).__name__), retry=True)
        except Exception as e:     # noqa: BLE001 - ignis's app answers its own errors: a bug here
            gen.cancel()
            rid = f"req_{uuid.uuid4().hex[:24]}"
            log.error("request %s: the replica call failed", rid, exc_info=e)
            return _error_json(500, _internal_body(rid))
        _, status, raw_headers = first
        headers: dict[str, str] = {}
        for k, v in raw_headers:
            if k.lower() not in _DROP:
                headers[k.decode("latin-1")] = v.decode("latin-1")
        streaming = headers.get("content-type", "").startswith("text/event-stream")
        if not streaming:
            # the whole answer first: a replica lost midway is still a clean 503
            chunks: list[bytes] = []
            try:
                async for item in gen:
                    chunks.append(item[1])
            except RayActorError as e:
                return _error_json(503, _unavailable_body(type(e).__name__), retry=True)
            return Response(b"".join(chunks), status_code=status, headers=headers)

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for item in gen:
                    yield item[1]
            except RayActorError as e:
                # the 200 is out: the stream ends with an error event, as ignis serve's shutdown
                yield f"data: {json.dumps({'error': _unavailable_body(type(e).__name__)})}\n\n".encode()
            finally:
                gen.cancel()       # a client that hung up stops the replica's generation
        return StreamingResponse(rest(), status_code=status, headers=headers)


# ---- the application ------------------------------------------------------------------------------

def build_app(model: str, *, num_replicas: int | None = None, min_replicas: int | None = None,
              max_replicas: int | None = None, threads_per_replica: int = 1,
              parallel: int = DEFAULT_PARALLEL, weights: str = "auto", ctx: int | None = None,
              kv_dtype: str = "auto", speculative: str | None = "auto",
              prefix_routing: bool = True, server: ServerConfig | None = None,
              name: str = "ignis") -> Any:
    """The Ray Serve application serving `model` (a registry name, model directory or .gguf
    file; each replica's node loads it into its own IGNIS_HOME, pulling a registry model on first
    start). num_replicas fixed, or min_replicas..max_replicas with Ray's autoscaling (a replica is
    busy when its `parallel` KV slots run); default 1. Each replica reserves threads_per_replica
    CPUs and runs that many threads. speculative: ignis.load's ("prompt-lookup", "draft:MODEL",
    "auto" or "off"; each replica loads a draft model beside its own). prefix_routing: Ray's
    prefix-cache-affinity router sends a prompt to the replica that served its longest prefix
    (else Ray's power-of-two choice).
    server: ignis serve's wire settings (api_key, max_queue, max_body_bytes, body_timeout,
    shutdown_timeout, aliases, host, allowed_hosts, cors_origins); its host is the address Ray's
    HTTP proxy listens on, for the Host check (default 127.0.0.1, Ray's default)."""
    require_ray()
    server = server or ServerConfig()
    if server.host is None:
        server = dataclasses.replace(server, host="127.0.0.1")
    for label, v in (("threads_per_replica", threads_per_replica), ("parallel", parallel)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RayServeConfigError(f"{label} must be a positive integer, got {v!r}")
    scaling = min_replicas is not None or max_replicas is not None
    if scaling and num_replicas is not None:
        raise RayServeConfigError("give num_replicas (a fixed count) or min_replicas/max_replicas "
                                  "(autoscaling), not both")
    for label, v in (("num_replicas", num_replicas), ("max_replicas", max_replicas)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise RayServeConfigError(f"{label} must be a positive integer, got {v!r}")
    if min_replicas is not None and (isinstance(min_replicas, bool)
                                     or not isinstance(min_replicas, int) or min_replicas < 0):
        raise RayServeConfigError(f"min_replicas must be 0 or more, got {min_replicas!r}")
    if scaling:
        lo = 1 if min_replicas is None else min_replicas
        hi = max(lo, 1) if max_replicas is None else max_replicas
        if hi < lo:
            raise RayServeConfigError(f"max_replicas ({hi}) is below min_replicas ({lo})")
    from ..generate.speculative import parse_speculative
    parse_speculative(speculative)      # here, not in every replica as it starts
    spec = ReplicaSpec(model=model, weights=weights, ctx=ctx, threads=threads_per_replica,
                       parallel=parallel, kv_dtype=kv_dtype, speculative=speculative,
                       server=server)
    per_replica = parallel + server.max_queue
    options: dict[str, Any] = dict(
        name=f"{name}-replica",
        ray_actor_options={"num_cpus": threads_per_replica},
        max_ongoing_requests=per_replica,
        # past every replica's slots and queue, a 503 as from ignis serve, not an endless wait
        max_queued_requests=max(server.max_queue, 1),
        graceful_shutdown_timeout_s=server.shutdown_timeout,
        graceful_shutdown_wait_loop_s=1.0,
        health_check_period_s=5.0,
    )
    if scaling:
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                         "initial_replicas": max(lo, 1),
                                         "target_ongoing_requests": parallel}
        most = hi
    else:
        options["num_replicas"] = num_replicas or 1
        most = options["num_replicas"]
    if prefix_routing:
        # prefix matches win unless one candidate holds `parallel` more requests than another
        options["request_router_config"] = {
            "request_router_class": PREFIX_ROUTER,
            "request_router_kwargs": {"imbalanced_threshold": parallel, "do_eviction": True}}
    replica = serve.deployment(IgnisReplica).options(**options).bind(spec)
    ingress = serve.deployment(IgnisIngress).options(
        name=f"{name}-ingress", ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=most * per_replica + max(server.max_queue, 1),
        graceful_shutdown_timeout_s=server.shutdown_timeout + 5)
    return ingress.bind(replica, server)


def app_builder(args: dict[str, Any]) -> Any:
    """For a Ray Serve config file (`import_path: ignis.api.ray_serve:app_builder`, `args:` with
    build_app's keywords; the server settings as a `server:` mapping of ServerConfig's fields)."""
    args = dict(args)
    if "model" not in args:
        raise RayServeConfigError("the application's args need 'model' (a registry name, model "
                                  "directory or .gguf file)")
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    srv = args.pop("server", None) or {}
    bad = sorted(set(srv) - fields)
    if bad:
        raise RayServeConfigError(f"unknown server setting(s) {', '.join(bad)}; known: "
                                  f"{', '.join(sorted(fields))}")
    for k in ("aliases", "allowed_hosts", "cors_origins"):
        if k in srv:
            srv[k] = tuple(srv[k])
    return build_app(args.pop("model"), server=ServerConfig(**srv), **args)


def serve_on_ray(app: Any, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
                 keep_alive_timeout: float | None = None, name: str = "ignis") -> None:
    """Run `app` (build_app's) until SIGTERM/SIGINT, then shut Serve down gracefully (replicas
    drain for their graceful_shutdown_timeout_s). address: a running Ray cluster ("auto" or
    host:port, else $RAY_ADDRESS); without either, a local Ray instance is started and stopped."""
    import os
    import signal
    import sys
    import threading
    require_ray()
    if address is None and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    ray.init(address=address, include_dashboard=False if address is None else None,
             log_to_driver=False)
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        http: dict[str, Any] = {"host": host, "port": port}
        if keep_alive_timeout is not None:
            http["keep_alive_timeout_s"] = keep_alive_timeout
        serve.start(http_options=http)
        serve.run(app, name=name, route_prefix="/")
        shown = f"[{host}]" if ":" in host else host
        print(f"ignis serve --ray: application {name!r} at http://{shown}:{port}/v1 on "
              f"{'Ray at ' + address if address else 'a local Ray instance'}", file=sys.stderr,
              flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        try:
            if address is None:
                serve.shutdown()          # our own instance: Serve and Ray go with us
            else:
                serve.delete(name)        # a shared cluster keeps Serve for its other apps
        finally:
            ray.shutdown()
