"""`ignis serve` under hostile and careless clients (issue 13): the Host check and CORS, request ids
instead of exception text, lone surrogates, sequential clients and the queue, embedding caps and
hang-ups, admission before tokenizing, read timeouts, SIGTERM/SIGINT, and the small wire fixes
(/health's abandoned counter, trailing slashes, bad ports). Timing tests use small configured
timeouts on a real uvicorn process and wait generously; none measures speed."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ignis

pytest.importorskip("starlette", reason="ignis serve needs the server extra: pip install 'ignis[server]'")
pytest.importorskip("uvicorn", reason="ignis serve needs the server extra: pip install 'ignis[server]'")

from test_server import N_CTX, Paced, PacedStream, Server, _free_port, _get, _until  # noqa: E402

from ignis.api.server import (RequestQueue, ServerConfig, _run_on_worker, _stream_job,  # noqa: E402
                              build_app)

ROOT = Path(__file__).resolve().parent.parent
CHAT = {"model": "tiny-chat", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1)
    yield m
    m.weights.close()


@pytest.fixture
def app_for(model):
    """build_app(model, ServerConfig(**config)), its worker threads stopped after the test."""
    apps = []

    def make(**config):
        apps.append(build_app(model, ServerConfig(**{"host": "127.0.0.1", **config})))
        return apps[-1]
    yield make
    for a in apps:
        a.state.ignis.queue.close()


def call(app, method: str, path: str, body: bytes | dict = b"", headers: dict | None = None,
         receive_after_body=None, more_body: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app in-process: (status, response headers, body).
    receive_after_body: an async function answering receive() once the body is read (default: a
    client that stays connected). more_body: the body sent is not all of it."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdrs = {"host": "127.0.0.1:8000", "content-type": "application/json",
            "content-length": str(len(data)), **{k.lower(): v for k, v in (headers or {}).items()}}
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 1),
             "headers": [(k.encode(), v.encode()) for k, v in hdrs.items() if v is not None]}
    messages = [{"type": "http.request", "body": data, "more_body": more_body}]
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop(0)
        if receive_after_body is not None:
            return await receive_after_body()
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, out


def error_of(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# ---- #2: Host header check and CORS ------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000",
                                  "127.0.0.2", "api.localhost:8000"])
def test_a_loopback_server_answers_loopback_host_names(app_for, host):
    status, _, _ = call(app_for(), "GET", "/health", headers={"host": host})
    assert status == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "192.168.1.5:8000"])
def test_a_loopback_server_refuses_other_host_names(app_for, host):
    app = app_for()
    for method, path, body in (("GET", "/health", b""), ("GET", "/v1/models", b""),
                               ("POST", "/v1/chat/completions", CHAT)):
        status, _, data = call(app, method, path, body, headers={"host": host})
        err = error_of(data)
        assert status == 403 and err["code"] == "host_not_allowed"
        assert "--allowed-hosts" in err["message"] and "DNS rebinding" in err["message"]
    assert app.state.ignis.queue.stats()["running"] == 0


def test_ignis_serve_checks_the_host_of_its_loopback_address(single):
    assert _get(single.port, "/health", headers={"Host": f"localhost:{single.port}"})[0] == 200
    status, body = _get(single.port, "/v1/models", headers={"Host": "rebound.example"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed"


def test_allowed_hosts_widen_the_check(app_for):
    app = app_for(allowed_hosts=("ignis.lan", "*.corp.example"))
    for host, status in (("ignis.lan:8000", 200), ("a.corp.example", 200), ("corp.example", 403),
                         ("localhost", 200), ("evil.example", 403)):
        assert call(app, "GET", "/health", headers={"host": host})[0] == status, host
    assert call(app_for(allowed_hosts=("*",)), "GET", "/health",
                headers={"host": "anything.example"})[0] == 200
    # bound to a public address without --allowed-hosts: any Host (the operator chose exposure);
    # an app not told where it is served (build_app alone, e.g. under a test client) likewise
    assert call(app_for(host="0.0.0.0"), "GET", "/health", headers={"host": "x.example"})[0] == 200
    assert call(app_for(host=None), "GET", "/health", headers={"host": "testserver"})[0] == 200
    assert call(app_for(host=None, allowed_hosts=("a.example",)), "GET", "/health",
                headers={"host": "testserver"})[0] == 403
    # bound to a name: that name is answered too
    assert call(app_for(host="ignis.internal"), "GET", "/health",
                headers={"host": "ignis.internal:8000"})[0] == 200


def test_cors_is_off_by_default(app_for):
    app = app_for()
    status, headers, _ = call(app, "GET", "/v1/models", headers={"origin": "http://app.example"})
    assert status == 200 and "access-control-allow-origin" not in headers
    status, headers, data = call(app, "OPTIONS", "/v1/chat/completions", headers={
        "origin": "http://app.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in headers and status == 405


def test_cors_origins_answer_preflights_and_requests(app_for):
    app = app_for(cors_origins=("http://app.example",), api_key="k")
    status, headers, _ = call(app, "OPTIONS", "/v1/chat/completions", headers={
        "origin": "http://app.example", "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert status == 200                                   # no API key needed for a preflight
    assert headers["access-control-allow-origin"] == "http://app.example"
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, headers, _ = call(app, "OPTIONS", "/v1/models", headers={     # Chrome, to localhost
        "origin": "http://app.example", "access-control-request-method": "GET",
        "access-control-request-private-network": "true"})
    assert status == 200 and headers["access-control-allow-private-network"] == "true"
    status, headers, _ = call(app, "OPTIONS", "/v1/chat/completions", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST",
        "access-control-request-private-network": "true"})
    assert status == 400 and "access-control-allow-origin" not in headers     # the browser refuses
    status, headers, _ = call(app, "OPTIONS", "/v1/chat/completions", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert status == 400 and "access-control-allow-origin" not in headers
    status, headers, data = call(app, "POST", "/v1/chat/completions", CHAT, headers={
        "origin": "http://app.example", "authorization": "Bearer k"})
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    assert "x-request-id" in headers["access-control-expose-headers"].lower()
    # an error answer carries the CORS headers too, so the page can read the error
    status, headers, _ = call(app, "POST", "/v1/chat/completions", CHAT,
                              headers={"origin": "http://app.example"})
    assert status == 401 and headers["access-control-allow-origin"] == "http://app.example"


# ---- #3: no exception text in answers; the request id instead -----------------------------------

def test_every_answer_carries_a_request_id(app_for):
    app = app_for()
    ids = set()
    for method, path, body in (("GET", "/health", b""), ("GET", "/nope", b""),
                               ("POST", "/v1/chat/completions", b"{")):
        _, headers, _ = call(app, method, path, body)
        assert headers["x-request-id"].startswith("req_")
        ids.add(headers["x-request-id"])
    assert len(ids) == 3


def test_a_stream_that_fails_inside_reports_only_its_request_id(caplog):
    class Broken(PacedStream):
        def __iter__(self):
            yield from ()
            raise RuntimeError("secret internals at 0xdeadbeef")

    async def main():
        rq = RequestQueue(0)
        _, lines = _stream_job(rq, Broken(), request_id="req_abc")
        text = "".join([t async for t in lines])
        rq.close()
        return text
    with caplog.at_level("ERROR", logger="ignis.server"):
        text = asyncio.run(main())
    event = json.loads(text[len("data: "):])
    assert event["error"]["code"] == "internal_error" and "req_abc" in event["error"]["message"]
    assert "secret" not in text and "RuntimeError" not in text
    assert any("req_abc" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_500_names_the_request_id_of_its_header(app_for):
    app = app_for()
    a = app.state.ignis

    def broken(**kw):
        raise KeyError("internal_table")
    a.endpoints["chat"] = (broken,) + a.endpoints["chat"][1:]
    status, headers, data = call(app, "POST", "/v1/chat/completions", CHAT)
    err = error_of(data)
    assert status == 500 and headers["x-request-id"] in err["message"]
    assert "internal_table" not in err["message"] and "KeyError" not in err["message"]


# ---- #4: lone surrogates --------------------------------------------------------------------------

SURROGATES = [
    ("chat content", "/v1/chat/completions",
     b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages.[0].content"),
    ("content part", "/v1/chat/completions",
     b'{"model": "tiny-chat", "messages": [{"role": "user", "content": [{"type": "text", '
     b'"text": "\\udfff"}]}]}', "messages.[0].content.[0].text"),
    ("stop string", "/v1/chat/completions",
     b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "stop": ["ok", '
     b'"\\ud83d"]}', "stop.[1]"),
    ("field name", "/v1/chat/completions",
     b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "\\ud800x": 1}',
     "\\ud800x"),
    ("nested field name", "/v1/chat/completions",
     b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi", "na\\udc00me": "x"}]}',
     "messages.[0].na\\udc00me"),
    ("model name", "/v1/chat/completions",
     b'{"model": "tiny\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    ("prompt", "/v1/completions", b'{"model": "tiny-chat", "prompt": "x\\ud800"}', "prompt"),
    ("prompt list", "/v1/completions", b'{"model": "tiny-chat", "prompt": ["ok", "\\ud800"]}',
     "prompt.[1]"),
    ("embedding input", "/v1/embeddings", b'{"model": "tiny-chat", "input": ["ok", "\\udbff"]}',
     "input.[1]"),
]


@pytest.mark.parametrize("name,path,body,param", SURROGATES, ids=[s[0] for s in SURROGATES])
def test_lone_surrogates_are_400_naming_the_field(app_for, name, path, body, param):
    status, _, data = call(app_for(), "POST", path, body)
    err = error_of(data)
    assert status == 400 and err["code"] == "invalid_value" and err["param"] == param
    assert "surrogate" in err["message"]
    data.decode("utf-8")                   # the answer itself is valid UTF-8


def test_surrogate_pairs_are_fine(app_for):
    body = b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], ' \
           b'"max_tokens": 1}'
    assert call(app_for(), "POST", "/v1/chat/completions", body)[0] == 200


# ---- #6: sequential clients never see 503; 503 carries Retry-After --------------------------------

class _SlowToRelease:
    """A lock that makes worker threads wait before taking it: the worker is slow to be scheduled
    again after a request's work, the interleaving that made sequential clients see 503."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        if threading.current_thread().name.startswith("ignis-worker"):
            time.sleep(0.3)
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


def test_the_place_is_free_before_the_answer_is_delivered():
    async def main():
        rq = RequestQueue(0)
        rq._lock = _SlowToRelease()
        assert await _run_on_worker(rq, lambda: 42) == 42
        job = rq.submit(lambda job: None)          # the client's next request: never QueueFull
        await _until(lambda: job.state == "done", "the job to run")
        stream = PacedStream(1)
        stream.gate.release()
        _, lines = _stream_job(rq, stream)
        assert "".join([t async for t in lines]).endswith("data: [DONE]\n\n")
        rq.submit(lambda job: None)
        await _until(lambda: rq.stats()["running"] == rq.stats()["waiting"] == 0, "idle")
        rq.close()
    asyncio.run(main())


@pytest.fixture(scope="module")
def single(tiny_chat_dir, tmp_path_factory):
    """`ignis serve --parallel 1 --max-queue 0` with short read timeouts."""
    s = Server(tiny_chat_dir, tmp_path_factory.mktemp("serve-log") / "single.log", "--parallel", "1",
               "--max-queue", "0", "--header-timeout", "1", "--body-timeout", "1",
               "--keep-alive-timeout", "1")
    yield s
    s.stop()


def test_sequential_requests_on_one_connection_never_get_503(single):
    c = http.client.HTTPConnection("127.0.0.1", single.port, timeout=30)
    statuses = []
    for i in range(60):
        body = {"model": "tiny-chat", "prompt": "ab", "max_tokens": 2, "seed": i,
                "stream": i % 2 == 1}
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
    c.close()
    assert statuses == [200] * 60


def test_a_503_carries_retry_after(paced):
    p = paced(max_queue=0)
    running = p.open_stream()
    p.wait(lambda: p.stats()["running"] == 1, "the stream to start")
    for path, body in (("/v1/completions", {"model": "tiny-chat", "prompt": "a"}),
                       ("/v1/embeddings", {"model": "tiny-chat", "input": "a"})):
        c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        err = json.loads(r.read())["error"]
        c.close()
        assert r.status == 503 and err["code"] == "server_busy"
        assert int(r.getheader("retry-after")) >= 1
    running.close()


@pytest.fixture
def paced(model):
    servers = []

    def make(**config):
        servers.append(Paced(model, **config))
        return servers[-1]
    yield make
    for p in servers:
        p.close()


# ---- #7: embeddings: caps, hang-ups, the shared queue ------------------------------------------------

def test_embedding_requests_are_capped(app_for, model):
    app = app_for()
    status, _, data = call(app, "POST", "/v1/embeddings",
                           {"model": "tiny-chat", "input": ["a"] * 2049})
    err = error_of(data)
    assert status == 400 and err["param"] == "input" and "2048" in err["message"]
    assert call(app, "POST", "/v1/embeddings", {"model": "tiny-chat", "input": ["a"] * 2048})[0] == 200
    # each input fits the context, together they are more than 8 contexts' worth of tokens
    status, _, data = call(app, "POST", "/v1/embeddings",
                           {"model": "tiny-chat", "input": [[5] * 500] * 9})
    err = error_of(data)
    assert status == 400 and err["param"] == "input"
    assert f"{8 * N_CTX}" in err["message"] and "8 times the context" in err["message"]
    from ignis.api.client import BadRequestError
    with pytest.raises(BadRequestError) as e:            # the in-process Client has the same caps
        ignis.Client([model]).embeddings.create(model="tiny-chat", input=["a"] * 2049)
    assert e.value.param == "input"


def test_an_embedding_request_stops_between_inputs_when_its_client_hangs_up(app_for, model):
    app = app_for()
    eng = model._embedding_engine()
    made, started = [], threading.Event()
    release = threading.Event()

    def hidden_states(ids):
        started.set()
        assert release.wait(20)
        made.append(len(ids))
        return real(ids)
    real = eng.hidden_states
    eng.hidden_states = hidden_states
    try:
        async def hang_up():
            while not started.is_set():
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        done = threading.Event()
        result = []
        t = threading.Thread(target=lambda: (result.append(call(
            app, "POST", "/v1/embeddings", {"model": "tiny-chat", "input": ["abc"] * 50},
            receive_after_body=hang_up)), done.set()))
        t.start()
        assert done.wait(20), "the hang-up was not answered"
        assert result[0][0] == 499
        # the input being embedded when the client left finishes; no other starts
        release.set()
        rq = app.state.ignis.queue
        deadline = time.monotonic() + 20
        while rq.stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rq.stats()["running"] == 0 and rq.stats()["abandoned"] == 1
        assert len(made) <= 2
    finally:
        eng.hidden_states = real
        release.set()


def test_embeddings_take_a_place_in_the_queue_like_generation(app_for, model):
    app = app_for(max_queue=0)
    eng = model._embedding_engine()
    started, release = threading.Event(), threading.Event()
    real = eng.hidden_states

    def hidden_states(ids):
        started.set()
        assert release.wait(20)
        return real(ids)
    eng.hidden_states = hidden_states
    try:
        first = []
        t = threading.Thread(target=lambda: first.append(call(
            app, "POST", "/v1/embeddings", {"model": "tiny-chat", "input": "abc"})))
        t.start()
        assert started.wait(20)
        assert app.state.ignis.queue.stats()["running"] == 1
        status, headers, data = call(app, "POST", "/v1/completions",
                                     {"model": "tiny-chat", "prompt": "a", "max_tokens": 1})
        assert status == 503 and error_of(data)["code"] == "server_busy" and "retry-after" in headers
        release.set()
        t.join(20)
        assert first[0][0] == 200
    finally:
        eng.hidden_states = real
        release.set()


# ---- #9: admission before tokenizing; tokenizing work bounded ----------------------------------------

def test_a_stream_to_a_full_server_is_refused_before_its_prompt_is_tokenized(paced, model):
    p = paced(max_queue=0)
    running = p.open_stream()
    p.wait(lambda: p.stats()["running"] == 1, "the stream to start")
    tokenized = []
    real = model.tokenize
    model.tokenize = lambda text, **kw: (tokenized.append(len(text)), real(text, **kw))[1]
    try:
        c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"model": "tiny-chat", "prompt": "x" * 5000, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        assert r.status == 503 and tokenized == []
    finally:
        model.tokenize = real
        running.close()


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"model": "tiny-chat", "prompt": "hello world " * 100_000,
                         "stream": True}, "prompt"),
    ("/v1/completions", {"model": "tiny-chat", "prompt": ["ok", "hello world " * 100_000]}, "prompt"),
    ("/v1/chat/completions", {"model": "tiny-chat", "messages": [
        {"role": "user", "content": "hello world " * 100_000}]}, "messages"),
    ("/v1/embeddings", {"model": "tiny-chat", "input": "hello world " * 100_000}, "input"),
])
def test_a_prompt_far_past_the_context_is_refused_untokenized(app_for, model, path, body, param):
    app = app_for()
    tokenized = []
    real_tokenize, real_encode = model.tokenize, model.tokenizer.encode_chat
    model.tokenize = lambda text, **kw: (tokenized.append(len(text)), real_tokenize(text, **kw))[1]
    model.tokenizer.encode_chat = lambda *a, **kw: (tokenized.append(1), real_encode(*a, **kw))[1]
    try:
        status, _, data = call(app, "POST", path, body)
    finally:
        model.tokenize = real_tokenize
        del model.tokenizer.encode_chat
    err = error_of(data)
    assert status == 400 and err["code"] == "context_length_exceeded" and err["param"] == param
    assert str(N_CTX) in err["message"] and tokenized == []


# ---- #10: read timeouts ----------------------------------------------------------------------------

def _read_all(s: socket.socket, limit: float = 15) -> bytes:
    """Everything the server sends until it closes the connection (fails after `limit` s)."""
    s.settimeout(limit)
    got = b""
    while True:
        part = s.recv(65536)
        if not part:
            return got
        got += part


def test_partial_headers_get_a_408_and_the_connection_closed(single):
    s = socket.create_connection(("127.0.0.1", single.port), timeout=15)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    got = _read_all(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 408")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_a_body_shorter_than_its_content_length_gets_a_408(single):
    s = socket.create_connection(("127.0.0.1", single.port), timeout=15)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
              b"\r\nContent-Length: 100\r\n\r\n{\"model\": \"tiny")
    got = _read_all(s)
    s.close()
    assert got.startswith(b"HTTP/1.1 408"), got
    err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "request_timeout" and "100" in err["message"]
    assert _get(single.port, "/health")[0] == 200


def test_idle_connections_are_closed(single):
    silent = socket.create_connection(("127.0.0.1", single.port), timeout=15)
    kept = socket.create_connection(("127.0.0.1", single.port), timeout=15)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    got = _read_all(kept)                    # the answer, then the close of an idle connection
    assert got.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in got
    assert _read_all(silent) == b""           # nothing sent: closed without an answer
    silent.close()
    kept.close()


# ---- #11: SIGTERM / SIGINT ---------------------------------------------------------------------------

_SERVE = """
import sys, time
import ignis
from ignis.api.server import ServerConfig, serve
model_dir, port, delay, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
m = ignis.load(model_dir, n_ctx=512, threads=1)
forward = m.engine.forward
def slow(*a, **kw):                 # a token every `delay` seconds: requests outlive the signal
    time.sleep(delay)
    return forward(*a, **kw)
m.engine.forward = slow
serve(m, host="127.0.0.1", port=port, config=ServerConfig(shutdown_timeout=timeout))
print("serve returned", file=sys.stderr, flush=True)
"""


class Slow:
    """serve() in a subprocess of its own, on a model that makes a token every `delay` s."""

    def __init__(self, model_dir: Path, log: Path, delay: float, shutdown_timeout: float):
        self.log = log
        self.port = _free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with open(log, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(model_dir), str(self.port),
                                          str(delay), str(shutdown_timeout)],
                                         stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, log.read_text()
            try:
                if _get(self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

    def stream(self, max_tokens: int) -> tuple[socket.socket, bytes]:
        body = json.dumps({"model": "tiny-chat", "prompt": "hello", "max_tokens": max_tokens,
                           "seed": 1, "stream": True, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:
            part = s.recv(65536)
            assert part, "the stream closed before its first event"
            got += part
        return s, got

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the server did not exit:\n{self.log.read_text()}")
        return code, self.log.read_text()


def _events(s: socket.socket, pending: bytes) -> list[str]:
    raw = pending + _read_all(s, 30)
    body = raw.split(b"\r\n\r\n", 1)[1]
    # undo the chunked framing: keep the SSE lines
    return [line.decode() for line in body.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_running_streams_finish_then_exits_0(tiny_chat_dir, tmp_path, sig):
    srv = Slow(tiny_chat_dir, tmp_path / "serve.log", delay=0.05, shutdown_timeout=30)
    s, pending = srv.stream(max_tokens=40)
    assert _get(srv.port, "/health")[1]["running"] == 1      # 2 s of stream left at the signal
    srv.proc.send_signal(sig)
    events = _events(s, pending)
    s.close()
    code, log = srv.finish()
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
    assert code == 0 and "serve returned" in log
    assert "Traceback" not in log and "CancelledError" not in log
    with pytest.raises(OSError):                        # and it no longer listens
        socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()


def test_streams_past_the_shutdown_timeout_end_with_an_error_event(tiny_chat_dir, tmp_path):
    srv = Slow(tiny_chat_dir, tmp_path / "serve.log", delay=0.1, shutdown_timeout=1)
    s, pending = srv.stream(max_tokens=400)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)    # waits behind the stream
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny-chat", "prompt": "hi", "max_tokens": 400, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while _get(srv.port, "/health")[1]["waiting"] != 1:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.05)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(OSError):                        # no new connections while draining
        socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    events = _events(s, pending)
    s.close()
    r = c.getresponse()
    answer = json.loads(r.read())
    c.close()
    code, log = srv.finish()
    last = json.loads(events[-1][len("data: "):])
    assert last["error"]["code"] == "server_shutting_down"
    assert "data: [DONE]" not in events
    assert r.status == 503 and answer["error"]["code"] == "server_shutting_down"
    assert time.monotonic() - t0 < 20                  # ended at the deadline, not at the end
    assert code == 0 and "serve returned" in log
    assert "Traceback" not in log and "CancelledError" not in log


def test_ignis_serve_exits_0_on_sigterm(tiny_chat_dir, tmp_path):
    srv = Server(tiny_chat_dir, tmp_path / "serve.log")
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0
    assert "Traceback" not in srv.log.read_text()


def test_requests_arriving_while_draining_get_503(app_for):
    app = app_for()
    loop = asyncio.new_event_loop()
    app.state.ignis.begin_shutdown(loop, 30)
    loop.close()                                        # its deadline never comes here
    status, headers, data = call(app, "GET", "/health")
    assert status == 503 and json.loads(data)["status"] == "stopping"
    assert headers["retry-after"] == "1"                # every 503 says when to come back
    status, headers, data = call(app, "POST", "/v1/chat/completions", CHAT)
    assert status == 503 and error_of(data)["code"] == "server_shutting_down"
    assert headers["retry-after"] == "1" and headers["connection"] == "close"


# ---- #14: abandoned, trailing slashes, bad ports ------------------------------------------------------

def test_a_completed_stream_is_not_counted_as_abandoned():
    class SlowClose(PacedStream):
        def close(self):                     # the worker tidies up after the last chunk
            time.sleep(0.3)
            super().close()

    async def main():
        rq = RequestQueue(0)
        for _ in range(3):
            stream = SlowClose(2)
            stream.gate.release(2)
            job, lines = _stream_job(rq, stream)
            text = ""
            async for part in lines:
                text += part
                if "[DONE]" in text:
                    job.cancel()             # the client got everything and hung up at once
            assert text.endswith("data: [DONE]\n\n")
        await _until(lambda: rq.stats()["running"] == 0, "idle")
        assert rq.stats()["abandoned"] == 0
        rq.close()
    asyncio.run(main())


def test_streams_read_to_the_end_leave_abandoned_at_zero(single):
    before = _get(single.port, "/health")[1]["abandoned"]
    for i in range(10):
        body = json.dumps({"model": "tiny-chat", "prompt": "ab", "max_tokens": 3, "seed": i,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", single.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: [DONE]" not in got:
            part = s.recv(65536)
            assert part
            got += part
        s.close()                            # as soon as [DONE] is in
    time.sleep(0.3)
    assert _get(single.port, "/health")[1]["abandoned"] == before


def test_trailing_slashes_are_served_not_redirected(app_for):
    app = app_for()
    status, _, data = call(app, "GET", "/v1/models/")
    assert status == 200 and json.loads(data)["data"][0]["id"] == "tiny-chat"
    status, _, data = call(app, "POST", "/v1/chat/completions/", CHAT)
    assert status == 200 and json.loads(data)["object"] == "chat.completion"
    status, _, data = call(app, "GET", "/v1/nope/")
    assert status == 404 and error_of(data)["code"] == "unknown_url"


@pytest.mark.parametrize("args,message", [
    (["--port", "99999"], "--port must be a TCP port from 1 to 65535, got 99999"),
    (["--port", "0"], "--port must be a TCP port from 1 to 65535, got 0"),
    (["--body-timeout", "0"], "--body-timeout must be a number of seconds above 0, got 0"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be a number of seconds 0 or more, got -1"),
])
def test_bad_serve_options_fail_before_the_model_loads(tiny_chat_dir, monkeypatch, capsys, args,
                                                       message):
    from ignis.api import cli

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before the options were checked")
    monkeypatch.setattr(cli, "_load_for_generation", no_load)
    assert cli.main(["serve", str(tiny_chat_dir), *args]) == 2
    assert capsys.readouterr().err.strip() == f"ignis serve: error: {message}"


def test_a_taken_port_fails_before_the_model_loads(tiny_chat_dir, monkeypatch, capsys):
    from ignis.api import cli
    monkeypatch.setattr(cli, "_load_for_generation", lambda *a, **kw: pytest.fail("loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["serve", str(tiny_chat_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ignis serve: error: cannot listen on 127.0.0.1 port {port}: address already in use"


# ---- after review: nesting, Python 3.10, the starlette pin, one walk of the body --------------------

def _nested(depth: int, leaf=0):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [70, 500, 5000])
def test_json_nested_past_64_levels_is_a_400_saying_the_limit(app_for, depth):
    # 500 levels parsed, then overflowed a later walk (500); 5000 overflow the parser itself
    deep = "[" * depth + "0" + "]" * depth              # json.dumps itself stops at ~1000
    body = ('{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi", "meta": %s}]}'
            % deep).encode()
    status, _, data = call(app_for(), "POST", "/v1/chat/completions", body)
    err = error_of(data)
    assert status == 400 and err["code"] == "invalid_json"
    assert "64 levels" in err["message"]
    if depth < 1000:                           # parsed: the place is named
        assert err["param"] == "messages.[0].meta" + ".[0]" * 61     # meta is level 4


def test_json_nested_64_levels_is_read(app_for):
    # body 1, messages 2, the message 3, content 4, a part 5: 59 more fit (an unknown field then)
    part = {"type": "text", "text": "hi", "x": _nested(59)}
    body = {**CHAT, "messages": [{"role": "user", "content": [part]}]}
    assert call(app_for(), "POST", "/v1/chat/completions", body)[0] == 200
    part["x"] = _nested(60)
    status, _, data = call(app_for(), "POST", "/v1/chat/completions", body)
    assert status == 400 and error_of(data)["code"] == "invalid_json"


def test_bodies_are_read_without_asyncio_timeout(app_for, monkeypatch):
    # asyncio.timeout is Python 3.11+; ignis supports 3.10, where every POST failed
    monkeypatch.delattr(asyncio, "timeout", raising=False)
    status, _, data = call(app_for(), "POST", "/v1/chat/completions", CHAT)
    assert status == 200, data
    status, _, data = call(app_for(body_timeout=0.2), "POST", "/v1/chat/completions", b'{"mod',
                           more_body=True, receive_after_body=lambda: asyncio.sleep(3600))
    assert status == 408 and error_of(data)["code"] == "request_timeout"


def test_the_server_extra_pins_a_starlette_with_cors_private_network():
    # --cors-origins passes CORSMiddleware(allow_private_network=...), new in starlette 0.51.0
    import inspect
    import re
    from starlette.middleware.cors import CORSMiddleware
    assert "allow_private_network" in inspect.signature(CORSMiddleware).parameters
    text = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"starlette>=([0-9.]+)"', text)
    assert len(pins) == 2                     # the server extra and the test extra
    assert all(tuple(map(int, p.split("."))) >= (0, 51) for p in pins), pins


def test_the_body_text_is_walked_once(app_for, monkeypatch):
    # the Client checks every string for lone surrogates; the wire checks only nesting and the
    # names it reads itself, so a long text is not scanned twice
    from ignis.generate import params
    seen = []
    real = params.lone_surrogate

    def counting(text):
        seen.append(text)
        return real(text)
    monkeypatch.setattr(params, "lone_surrogate", counting)
    text = "h\u00e9llo " * 20
    body = {**CHAT, "messages": [{"role": "user", "content": text}]}
    assert call(app_for(), "POST", "/v1/chat/completions", body)[0] == 200
    assert seen.count(text) == 1


@pytest.mark.parametrize("body,param,code", [
    ({**CHAT, "messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages.[0].foo",
     "unknown_parameter"),
    ({**CHAT, "messages": [{"role": "user", "content": []}]}, "messages.[0].content", "empty_array"),
    ({**CHAT, "messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "tool_calls": [{}]}]},
     "messages.[1].tool_calls.[0].id", "missing_required_parameter"),
    # the name of an unknown field, not clean text: named, escaped, in a UTF-8 answer
    (b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], '
     b'"stream_options": {"\\ud800": 1}, "stream": true}', "stream_options.\\ud800",
     "invalid_value"),
])
def test_message_fields_are_checked_on_the_wire(app_for, body, param, code):
    status, _, data = call(app_for(), "POST", "/v1/chat/completions", body)
    err = error_of(data)
    assert status == 400 and (err["param"], err["code"]) == (param, code)
    data.decode("utf-8")
