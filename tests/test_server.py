"""`ignis serve` as a real process on 127.0.0.1, driven by the official `openai` package and by raw
HTTP: every endpoint, SSE streaming, the OpenAI error objects and status codes, the bounded queue,
API keys, parallel streams and clients that hang up mid-stream."""
from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import ignis

openai = pytest.importorskip("openai", reason="the server tests drive it with the official client "
                                              "(pip install openai; in the test extras)")
pytest.importorskip("starlette", reason="ignis serve needs the server extra: pip install 'ignis[server]'")
pytest.importorskip("uvicorn", reason="ignis serve needs the server extra: pip install 'ignis[server]'")

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 512            # the tiny model's max_position_embeddings
KEY = "sekrit-test-key"
USER = [{"role": "user", "content": "Say hi."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, headers: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def _post(port: int, path: str, body: bytes | dict, *, content_type: str = "application/json",
          headers: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", path, body=data, headers={"Content-Type": content_type, **(headers or {})})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


class Server:
    """`python -m ignis serve DIR ...` on a free port; stopped by stop()."""

    def __init__(self, model_dir: Path, log: Path, *args: str):
        self.log = log
        for _ in range(3):          # the free port may be taken before the server binds it
            if self._start(model_dir, args):
                return
        raise RuntimeError(f"ignis serve found no free port:\n{log.read_text()}")

    def _start(self, model_dir: Path, args: tuple[str, ...]) -> bool:
        self.port = _free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ignis", "serve", str(model_dir), "--port", str(self.port),
                 "--ctx", str(N_CTX), "--threads", "1", "-q", *args],
                stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                text = self.log.read_text()
                if "address already in use" in text.lower():
                    return False
                raise RuntimeError(f"ignis serve exited with {self.proc.returncode}:\n{text}")
            try:
                if _get(self.port, "/health", timeout=2)[0] == 200:
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ignis serve did not answer /health in 60 s:\n{self.log.read_text()}")
            time.sleep(0.1)

    def client(self, api_key: str = "none") -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key,
                             max_retries=0, timeout=60)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def model_dir(tiny_chat_dir) -> Path:
    return tiny_chat_dir


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    s = Server(model_dir, tmp_path_factory.mktemp("serve-log") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def locked_server(model_dir, tmp_path_factory):
    """Started with an API key and --max-queue 0."""
    s = Server(model_dir, tmp_path_factory.mktemp("serve-log") / "locked.log",
               "--api-key", KEY, "--max-queue", "0")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(model_dir):
    """The same model in-process: what the wire must reproduce exactly."""
    m = ignis.load(str(model_dir), n_ctx=N_CTX, threads=1)
    yield ignis.Client([m])
    m.weights.close()


@pytest.fixture(scope="module")
def api(server):
    return server.client()


def _complete(client, **kw) -> tuple[str, str]:
    r = client.completions.create(model="tiny-chat", **kw)
    return r.choices[0].text, r.choices[0].finish_reason


def _stream_completion(client, **kw) -> tuple[str, str | None, object]:
    text, finish, usage = [], None, None
    for c in client.completions.create(model="tiny-chat", stream=True, **kw):
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            text.append(ch.text)
            finish = ch.finish_reason or finish
    return "".join(text), finish, usage


# ---- the endpoints ---------------------------------------------------------------------------------

def test_chat_matches_the_in_process_client(api, local):
    kw = dict(model="tiny-chat", messages=USER, max_tokens=8, temperature=0.9, seed=3)
    r = api.chat.completions.create(**kw)
    ref = local.chat.completions.create(**kw)
    assert isinstance(r, openai.types.chat.ChatCompletion)
    assert r.object == "chat.completion" and r.model == "tiny-chat"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.choices[0].message.content
    assert r.choices[0].finish_reason == ref.choices[0].finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (ref.usage.prompt_tokens,
                                                                  ref.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completions_with_logprobs_match_the_in_process_client(api, local):
    kw = dict(model="tiny-chat", prompt="hello world", max_tokens=6, temperature=1.0, seed=7,
              logprobs=2)
    r = api.completions.create(**kw)
    ref = local.completions.create(**kw)
    assert r.object == "text_completion"
    assert r.choices[0].text == ref.choices[0].text
    assert r.choices[0].logprobs.tokens == ref.choices[0].logprobs.tokens
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(ref.choices[0].logprobs.token_logprobs)


def test_embeddings_in_base64_and_float(api, local, server):
    ref = local.embeddings.create(model="tiny-chat", input=["hello world", "abc"]).data
    b64 = api.embeddings.create(model="tiny-chat", input=["hello world", "abc"])   # client default
    flt = api.embeddings.create(model="tiny-chat", input=["hello world", "abc"],
                                encoding_format="float")
    for got in (b64, flt):
        assert [d.index for d in got.data] == [0, 1]
        for d, r in zip(got.data, ref):
            np.testing.assert_allclose(d.embedding, r.embedding, rtol=0, atol=1e-6)
        assert got.usage.prompt_tokens == got.usage.total_tokens > 0
    status, raw = _post(server.port, "/v1/embeddings",
                        {"model": "tiny-chat", "input": "abc", "encoding_format": "base64"})
    assert status == 200
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vec, ref[1].embedding, rtol=0, atol=1e-6)
    assert abs(np.linalg.norm(vec) - 1) < 1e-5


def test_models_list_and_retrieve(api, server):
    assert [m.id for m in api.models.list()] == ["tiny-chat"]
    assert api.models.retrieve("tiny-chat").id == "tiny-chat"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4o")
    status, h = _get(server.port, "/health")
    assert status == 200 and h["status"] == "ok" and h["model"] == "tiny-chat"
    from ignis import _core
    from ignis.runtime.engine import choose_kv_dtype
    assert h["weight_format"] == "q8"          # auto, for a float checkpoint; its cache as auto picks
    assert h["kv_dtype"] == choose_kv_dtype("q8", _core.active_kernels())


# ---- streaming ---------------------------------------------------------------------------------------

def test_chat_stream_text_equals_non_stream_and_usage_comes_last(api):
    kw = dict(model="tiny-chat", messages=USER, max_tokens=8, temperature=0.9, seed=5)
    whole = api.chat.completions.create(**kw)
    chunks = list(api.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1

    plain = list(api.chat.completions.create(stream=True, **kw))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_completion_stream_is_sse_ending_in_done(api, server):
    abandoned = _get(server.port, "/health")[1]["abandoned"]
    text, finish, usage = _stream_completion(api, prompt="hello world", max_tokens=6,
                                             temperature=1.0, seed=2)
    assert (text, finish) == _complete(api, prompt="hello world", max_tokens=6, temperature=1.0, seed=2)
    assert usage is None
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny-chat", "prompt": "hello world", "max_tokens": 4, "seed": 1, "stream": True,
         "stream_options": {"include_usage": True}}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    events = r.read().decode().split("\n\n")
    c.close()
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    last = json.loads(events[-3][len("data: "):])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert _get(server.port, "/health")[1]["abandoned"] == abandoned     # read to the end


def test_completions_take_split_special_tokens_from_extra_body(api):
    """The raw prompt's special-token text is markup unless extra_body says otherwise."""
    def prompt_tokens(**kw):
        return api.completions.create(model="tiny-chat", prompt="<|im_start|>", max_tokens=1,
                                      **kw).usage.prompt_tokens
    assert prompt_tokens() == 1
    assert prompt_tokens(extra_body={"split_special_tokens": True}) == len("<|im_start|>")


def test_stop_sequences_cut_at_the_first_match(api):
    kw = dict(prompt="hello world", max_tokens=24, temperature=1.0, seed=11)
    full, _ = _complete(api, **kw)
    assert len(full) >= 6
    stop = full[len(full) // 2: len(full) // 2 + 2]
    expected = full[:full.index(stop)]
    assert _complete(api, stop=[stop], **kw) == (expected, "stop")
    assert _stream_completion(api, stop=stop, **kw)[:2] == (expected, "stop")


def test_same_seed_same_text(api):
    kw = dict(prompt="abc", max_tokens=12, temperature=1.0)
    runs = {s: [_complete(api, seed=s, **kw)[0] for _ in range(2)] for s in (1, 2, 3)}
    assert all(a == b for a, b in runs.values())
    assert len({a for a, _ in runs.values()}) > 1      # the seed does choose the sample


# ---- invalid requests: status, param and code ---------------------------------------------------------

BAD_CHAT = [
    ({"messages": None}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [123]}, "messages.[0]"),
    ({"messages": [{}]}, "messages.[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.[0].content"),
    ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"n": 129}, "n"),
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"), ({"seed": "x"}, "seed"),
    ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ({"response_format": {"type": "json"}}, "response_format.type"),
    ({"stop": ""}, "stop"), ({"stop": ["ok", ""]}, "stop"),
    ({"extra_body": {"top_k": -1}}, "top_k"),
    ({"extra_body": {"typical_p": 0.5}}, "typical_p"),
]


@pytest.mark.parametrize("kw,param", BAD_CHAT, ids=[p for _, p in BAD_CHAT])
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_chat_requests_are_400_error_objects(api, kw, param, stream):
    extra = {"stream": True} if stream else {}
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(**{"model": "tiny-chat", "messages": USER, **kw, **extra})
    err = e.value
    assert err.status_code == 400 and err.param == param and err.code
    assert err.body["type"] == "invalid_request_error" and err.body["message"]


def test_an_unknown_model_is_a_404(api):
    for call in (lambda: api.chat.completions.create(model="gpt-4o", messages=USER),
                 lambda: api.completions.create(model="gpt-4o", prompt="x", stream=True),
                 lambda: api.embeddings.create(model="gpt-4o", input="x")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.status_code == 404 and e.value.code == "model_not_found"


def test_context_overflow_is_a_400_in_both_modes(api):
    long = "hello world " * 300            # ~600 tokens, the context holds 512
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            api.completions.create(model="tiny-chat", prompt=long, stream=stream)
        assert e.value.code == "context_length_exceeded" and "512" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model="tiny-chat", stream=stream,
                                        messages=[{"role": "user", "content": long}])
        assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        api.embeddings.create(model="tiny-chat", input=long)
    assert e.value.code == "context_length_exceeded"


CHAT = {"model": "tiny-chat", "messages": USER}
MALFORMED = [
    ("malformed-json", b'{"model": "tiny-chat", "messages": [', "application/json", 400, "invalid_json"),
    ("not-an-object", b'[1, 2]', "application/json", 400, "invalid_json"),
    ("nan", b'{"model": "tiny-chat", "messages": [], "temperature": NaN}', "application/json", 400,
     "invalid_json"),
    ("not-utf8", b'\xff\xfe{}', "application/json", 400, "invalid_json"),
    ("form", b"model=tiny-chat", "application/x-www-form-urlencoded", 400, "invalid_content_type"),
    ("text", json.dumps(CHAT).encode(), "text/plain", 400, "invalid_content_type"),
    ("missing-messages", b'{"model": "tiny-chat"}', "application/json", 400,
     "missing_required_parameter"),
    ("unknown-field", json.dumps({**CHAT, "frobnicate": 1}).encode(), "application/json", 400,
     "unknown_parameter"),
    ("model-not-a-string", json.dumps({**CHAT, "model": 5}).encode(), "application/json", 400,
     "invalid_type"),
]


@pytest.mark.parametrize("name,body,ctype,status,code", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_http_requests(server, name, body, ctype, status, code):
    got, err = _post(server.port, "/v1/chat/completions", body, content_type=ctype)
    assert got == status
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["code"] == code and err["error"]["type"] == "invalid_request_error"


def test_a_huge_body_is_413_without_being_read(server):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.putrequest("POST", "/v1/chat/completions")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(5 * 1024 * 1024))
    c.endheaders(b'{"model": "tiny-chat", "messages": "')
    r = c.getresponse()
    err = json.loads(r.read())
    c.close()
    assert r.status == 413 and err["error"]["code"] == "request_too_large"


def test_unknown_routes_and_methods_are_error_objects(server):
    status, err = _get(server.port, "/v1/nope")
    assert status == 404 and err["error"]["code"] == "unknown_url"
    status, err = _get(server.port, "/v1/chat/completions")
    assert status == 405 and set(err["error"]) == {"message", "type", "param", "code"}


# ---- concurrency -----------------------------------------------------------------------------------

def test_eight_parallel_streams_are_batched_and_match_a_sequential_run(api, local, server):
    jobs = [dict(prompt=p, max_tokens=24, temperature=1.0, seed=s, extra_body={"ignore_eos": True})
            for p, s in (("hello world", 1), ("abc", 2), ("the cat", 3), ("xyz", 4),
                         ("one two three", 5), ("q", 6), ("a longer prompt than the rest", 7),
                         ("zz", 8))]
    expected = [(r.choices[0].text, r.choices[0].finish_reason) for r in
                (local.completions.create(model="tiny-chat", **j) for j in jobs)]
    before = _get(server.port, "/health")[1]["batching"]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda j: _stream_completion(api, **j)[:2], jobs))
    assert got == expected
    after = _get(server.port, "/health")[1]
    assert after["parallel"] == 4
    steps = after["batching"]["steps"] - before["steps"]
    rows = after["batching"]["rows"] - before["rows"]
    # 8 streams of 24 tokens on 4 slots: far fewer steps than rows, as slots share steps
    assert steps < rows / 1.5


def _wait_idle(port: int, headers: dict | None = None) -> dict:
    deadline = time.monotonic() + 30
    while True:
        status, h = _get(port, "/health", headers)
        assert status == 200
        if h["running"] == 0 and h["waiting"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.05)


@pytest.mark.parametrize("n", [1, 3])     # n=3: three choices on their own threads and slots
def test_a_client_that_hangs_up_mid_stream_leaves_the_server_healthy(server, api, n):
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        body = json.dumps({"model": "tiny-chat", "prompt": "hello", "max_tokens": 500, "seed": 1,
                           "stream": True, "ignore_eos": True, "n": n}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:
            part = s.recv(4096)
            assert part, "the server closed the stream before the first event"
            got += part
        assert got.startswith(b"HTTP/1.1 200")
        assert _get(server.port, "/health")[0] == 200        # the event loop is not blocked
        s.close()
    h = _wait_idle(server.port)
    assert (h["running"], h["waiting"]) == (0, 0)
    assert _complete(api, prompt="abc", max_tokens=5, temperature=1.0, seed=9) == \
        _complete(api, prompt="abc", max_tokens=5, temperature=1.0, seed=9)


def test_api_key(locked_server):
    with pytest.raises(openai.AuthenticationError) as e:
        locked_server.client("wrong").models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    status, err = _post(locked_server.port, "/v1/completions", {"model": "tiny-chat", "prompt": "a"})
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    ok = locked_server.client(KEY)
    assert [m.id for m in ok.models.list()] == ["tiny-chat"]
    assert ok.completions.create(model="tiny-chat", prompt="a", max_tokens=2).usage.completion_tokens <= 2
    status, health = _get(locked_server.port, "/health")      # health needs no key
    assert status == 200 and health["max_queue"] == 0


def test_serve_without_the_server_extra_says_what_to_install(tmp_path):
    code = ("import sys\nsys.modules['starlette'] = None\nsys.modules['uvicorn'] = None\n"
            "from ignis.api.cli import main\nsys.exit(main(['serve', 'no-such-model']))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=env)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ignis[server]'" in lines[0]


# ---- the cancellation mechanics, in-process with a stream whose pace the test sets -----------------

class _Chunk:
    def __init__(self, i: int):
        self.i = i

    def model_dump_json(self) -> str:
        return json.dumps({"i": self.i})


class PacedStream:
    """A Client Stream stand-in that makes one chunk per release() of its gate."""

    def __init__(self, n: int = 1000):
        self.gate = threading.Semaphore(0)
        self.n = n
        self.made = 0
        self.asked = 0            # chunks the consumer has asked for
        self.closed = False

    def __iter__(self):
        for i in range(self.n):
            self.asked += 1
            assert self.gate.acquire(timeout=10), "the test never released the next chunk"
            self.made += 1
            yield _Chunk(i)

    def close(self) -> None:
        self.closed = True


async def _until(cond, what: str) -> None:
    import asyncio
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def test_a_cancelled_stream_stops_at_its_next_chunk_and_frees_its_slot():
    import asyncio
    from ignis.api.server import QueueFullError, RequestQueue, _stream_job

    async def main():
        rq = RequestQueue(0)
        stream = PacedStream()
        job, lines = _stream_job(rq, stream)
        stream.gate.release()
        assert await lines.__anext__() == 'data: {"i": 0}\n\n'
        with pytest.raises(QueueFullError):
            _stream_job(rq, PacedStream())
        await _until(lambda: stream.asked == 2, "the worker to ask for chunk 1")
        job.cancel()                        # the client hung up while chunk 1 was being made
        stream.gate.release()
        rest = "".join([text async for text in lines])
        assert rest == 'data: {"i": 1}\n\n'            # no [DONE]: the stream was cut
        assert stream.made == 2 and stream.closed
        await _until(lambda: rq.stats()["running"] == 0, "the slot to free")
        done = PacedStream(2)
        _, lines = _stream_job(rq, done)
        done.gate.release(2)
        assert "".join([text async for text in lines]) == \
            'data: {"i": 0}\n\ndata: {"i": 1}\n\ndata: [DONE]\n\n'
        rq.close()

    asyncio.run(main())


def test_a_hang_up_while_waiting_leaves_the_queue_at_once():
    import asyncio
    from ignis.api.server import RequestQueue, _SSEResponse, _stream_job

    async def main():
        rq = RequestQueue(1)
        first = PacedStream()
        job1, lines1 = _stream_job(rq, first)
        first.gate.release()
        assert await lines1.__anext__() == 'data: {"i": 0}\n\n'       # running, and holding on
        waiting = PacedStream()
        job2, lines2 = _stream_job(rq, waiting)
        assert rq.stats() == {"running": 1, "waiting": 1, "parallel": 1, "max_queue": 1,
                              "abandoned": 0}
        sent = []

        async def receive():
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await asyncio.wait_for(_SSEResponse(lines2, job2)(scope, receive, send), 10)
        assert rq.stats()["waiting"] == 0 and rq.stats()["abandoned"] == 1
        assert waiting.made == 0 and job2.state == "cancelled"
        await _until(lambda: first.asked == 2, "the worker to ask for chunk 1")
        job1.cancel()
        first.gate.release()
        assert "".join([text async for text in lines1]) == 'data: {"i": 1}\n\n'
        await _until(lambda: rq.stats()["running"] == 0, "the slot to free")
        rq.close()

    asyncio.run(main())


def _asgi_call(app, method: str, path: str, body: bytes = b"",
               content_type: str = "application/json", gone: bool = False,
               ) -> tuple[int, dict, Exception | None]:
    """One request through the ASGI app in-process: (status, JSON body, exception re-raised).
    gone: the client hangs up right after sending the body."""
    import asyncio
    sent: list[dict] = []
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1), "headers": [(b"content-type", content_type.encode()),
                                                      (b"content-length", str(len(body)).encode())]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        if gone:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()      # a client that stays connected: no more messages

    async def send(message):
        sent.append(message)

    raised = None
    try:
        asyncio.run(app(scope, receive, send))
    except Exception as e:        # ServerErrorMiddleware re-raises for the server's log
        raised = e
    start = next(m for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(data), raised


def test_an_internal_failure_is_a_json_500_with_a_request_id_not_a_traceback(local, caplog):
    from ignis.api.server import build_app
    app = build_app(local._model("tiny-chat"))
    a = app.state.ignis

    def broken(**kw):
        raise RuntimeError("kernel exploded")
    a.endpoints["completions"] = (broken,) + a.endpoints["completions"][1:]
    with caplog.at_level("ERROR", logger="ignis.server"):
        status, body, raised = _asgi_call(app, "POST", "/v1/completions",
                                          json.dumps({"model": "tiny-chat", "prompt": "hi"}).encode())
    assert status == 500 and raised is None
    err = body["error"]
    assert err["type"] == "server_error" and err["code"] == "internal_error"
    # the client gets the request id, never the exception: that is in the log, under the same id
    assert "kernel exploded" not in err["message"] and "RuntimeError" not in err["message"]
    rid = err["message"].split("request id ")[1].split(")")[0]
    assert rid.startswith("req_")
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and "kernel exploded" in str(logged[0].exc_info[1])
    # the same app still answers normally
    status, body, raised = _asgi_call(app, "POST", "/v1/embeddings",
                                      json.dumps({"model": "tiny-chat", "input": "hi"}).encode())
    assert status == 200 and raised is None and len(body["data"]) == 1
    a.queue.close()


class Paced:
    """`ignis serve`'s app under uvicorn in this process, on a model whose engine makes one token
    per gate.release(): the tests know exactly how far every generation got."""

    def __init__(self, model, **config):
        import uvicorn
        from ignis.api.server import ServerConfig, build_app
        self.model = model
        self.gate = threading.Semaphore(0)
        self.calls: list[int] = []
        self.asked = 0            # forward() calls begun, including one waiting at the gate
        self.forward = model.engine.forward
        self.app = build_app(model, ServerConfig(**config))
        self.stats = self.app.state.ignis.queue.stats
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        model.engine.forward = self._paced
        self.thread.start()
        self.wait(lambda: self.server.started, "uvicorn to start")

    def _paced(self, *args, **kw):
        self.asked += 1
        assert self.gate.acquire(timeout=20), "the test never released the next token"
        self.calls.append(1)
        return self.forward(*args, **kw)

    @staticmethod
    def wait(cond, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            time.sleep(0.02)

    def open_stream(self, headers: bytes = b"") -> socket.socket:
        """A 400-token stream; returns once its 200 and headers are in (it is running or queued)."""
        body = json.dumps({"model": "tiny-chat", "prompt": "hello", "max_tokens": 500, "seed": 1,
                           "stream": True, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  + headers + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            assert part, "the server closed the connection"
            got += part
        assert got.startswith(b"HTTP/1.1 200"), got
        return s

    def feed_until_stopped(self) -> int:
        """Give a cancelled generation tokens one at a time until it stops; how many it took."""
        given = 0
        while self.stats()["running"]:
            before = len(self.calls)
            self.gate.release(1)
            given += 1
            self.wait(lambda: len(self.calls) > before or not self.stats()["running"], "a token")
            assert given < 50, "the cancelled generation does not stop"
        return given

    def close(self) -> None:
        self.model.engine.forward = self.forward
        self.gate.release(10000)
        self.server.should_exit = True
        self.thread.join(30)
        self.app.state.ignis.queue.close()


@pytest.fixture
def paced(local):
    servers = []

    def make(**config):
        servers.append(Paced(local._model("tiny-chat"), **config))
        return servers[-1]
    yield make
    for p in servers:
        p.close()


def test_a_hang_up_stops_the_generation_at_the_next_token(paced, local):
    p = paced()
    s = p.open_stream()
    p.gate.release(3)                       # the prompt and two more tokens
    p.wait(lambda: p.asked == 4, "the generation to wait for its fourth forward step")
    s.close()
    p.wait(lambda: p.stats()["abandoned"] == 1, "the server to notice the hang-up")
    assert p.stats()["running"] == 1 and len(p.calls) == 3
    # the worker looks at the hang-up each time the generation hands it text: here at the next
    # token (the detokenizer holds text back one token here, longer for an unfinished character)
    assert p.feed_until_stopped() == 1 and len(p.calls) == 4
    p.model.engine.forward = p.forward
    r = local.completions.create(model="tiny-chat", prompt="abc", max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_a_full_queue_answers_503_and_a_hang_up_in_the_queue_frees_its_place(paced):
    p = paced(max_queue=1)
    running = p.open_stream()
    p.wait(lambda: p.stats()["running"] == 1, "the first stream to start")
    queued = p.open_stream()
    assert p.stats()["waiting"] == 1
    status, err = _post(p.port, "/v1/completions", {"model": "tiny-chat", "prompt": "a"})
    assert status == 503
    assert err["error"]["type"] == "server_error" and err["error"]["code"] == "server_busy"
    status, err = _post(p.port, "/v1/embeddings", {"model": "tiny-chat", "input": "a"})
    assert status == 503
    assert _get(p.port, "/health")[1]["waiting"] == 1          # health answers, and needs no slot
    queued.close()
    p.wait(lambda: p.stats()["waiting"] == 0, "the queued stream to leave")
    assert p.stats()["running"] == 1 and p.calls == []         # without computing anything
    again = p.open_stream()                                     # its place is free again
    assert p.stats()["waiting"] == 1
    running.close()
    again.close()
    p.wait(lambda: p.stats()["abandoned"] == 3, "both hang-ups")
    assert p.feed_until_stopped() <= 2                  # the prompt, and the first token's text
    p.wait(lambda: p.stats()["running"] == p.stats()["waiting"] == 0, "the server to be idle")
    assert len(p.calls) <= 2


@pytest.mark.parametrize("args, message", [
    (["--parallel", "0"], "--parallel must be 1 or more, got 0"),
    (["--max-queue", "-1"], "--max-queue must be 0 or more, got -1"),
    (["--api-key", " "], "--api-key is empty"),
])
def test_bad_serve_options_are_one_line_errors(model_dir, args, message):
    from ignis.api.cli import main
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["serve", str(model_dir), *args]) == 2
    assert err.getvalue().strip() == f"ignis serve: error: {message}" + \
        ("; give a key or leave the option out" if "api-key" in message else "")


def test_a_hang_up_stops_a_non_streaming_generation_too(paced):
    p = paced()
    body = json.dumps({"model": "tiny-chat", "prompt": "hello", "max_tokens": 500, "seed": 1,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    p.gate.release(3)                       # the prompt and two more tokens
    p.wait(lambda: p.asked == 4, "the generation to wait for its fourth forward step")
    s.close()
    p.wait(lambda: p.stats()["abandoned"] == 1, "the server to notice the hang-up")
    # the generation stops before its next forward step: at most the one already waiting runs
    assert p.feed_until_stopped() <= 1 and len(p.calls) <= 4
    p.wait(lambda: p.stats()["running"] == 0, "the worker to be free")
    p.model.engine.forward = p.forward
    status, r = _post(p.port, "/v1/completions", {"model": "tiny-chat", "prompt": "ab", "max_tokens": 2})
    assert status == 200 and r["usage"]["completion_tokens"] == 2


def test_a_non_streaming_client_gone_before_its_turn_gets_no_work_and_no_hang(local):
    from ignis.api.server import build_app
    app = build_app(local._model("tiny-chat"))
    body = json.dumps({"model": "tiny-chat", "prompt": "hi", "max_tokens": 50}).encode()
    result: list = []
    t = threading.Thread(target=lambda: result.append(
        _asgi_call(app, "POST", "/v1/completions", body, gone=True)))
    t.start()
    t.join(30)
    assert not t.is_alive(), "the handler of a client that hung up never returned"
    status, err, _ = result[0]
    assert status == 499 and err["error"]["code"] == "client_closed_request"
    status, ok, _ = _asgi_call(app, "POST", "/v1/completions", body)      # still serving
    assert status == 200 and ok["usage"]["completion_tokens"] >= 1
    app.state.ignis.queue.close()
