"""`ignis serve --ray` (ignis.api.ray_serve): the OpenAI server as a Ray Serve application. A local
Ray instance (loopback, 2 CPUs, a 100 MB object store, no dashboard, its files under the test's
temp dir) serves the default model with 2 replicas x 1 thread; the official `openai` client talks
to Ray's HTTP proxy. The answers must equal the single-process ones, the errors ignis serve's;
a replica killed mid-stream must fail its streams with a retryable error while the other replica's
finish, and Ray must replace it. The quick tests run the replica's request forwarding in-process."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ignis
from ignis.api.client import APIError
from tools_required import missing_tool

openai = pytest.importorskip("openai", reason="driven with the official client (in the test extras)")
pytest.importorskip("starlette", reason="ignis serve needs the server extra: pip install 'ignis[server]'")

# Ray is imported by the tests that use it, not at collection: importing it replaces the logging
# module's record factory for the whole process.
ray = serve = None

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 512
MAX_TOKENS = 24
PROMPTS = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
           "Write a SQL query that counts users per country.", "What does `git rebase` do?",
           "Write a bash loop over the files in a directory.", "Describe the TCP handshake.",
           "Write a C function that sums an array of ints.", "What is a closure in JavaScript?"]


def _require_ray() -> None:
    global ray, serve
    try:
        import ray as _ray
        from ray import serve as _serve
    except ImportError as e:      # ignis[ray]; CI installs it with the test extras
        missing_tool(f"Ray Serve is not installed ({e}; pip install 'ignis[ray]'): ignis serve "
                     f"--ray is not checked")
    ray, serve = _ray, _serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ---- quick: options, routing text, the replica's forwarding without Ray --------------------------

def test_routing_text_is_the_prompt_in_order():
    from ignis.api.ray_serve import routing_text
    chat = {"model": "m", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]}
    assert routing_text("chat", json.dumps(chat).encode()) == "You are terse.Hi there"
    assert routing_text("completions", b'{"prompt": "abc"}') == "abc"
    assert routing_text("completions", b'{"prompt": ["ab", "c"]}') == "abc"
    assert routing_text("responses", b'{"instructions": "Be brief.", "input": "x"}') == "Be brief.x"
    # nothing to match: the request goes by the power-of-two fallback; the replica refuses it
    assert routing_text("chat", b"{not json") == ""
    assert routing_text("chat", b"[1, 2]") == ""
    assert routing_text("completions", b'{"prompt": [1, 2, 3]}') == ""


def test_build_app_refuses_options_that_do_not_fit():
    _require_ray()
    from ignis.api.ray_serve import RayServeConfigError, app_builder, build_app
    cases = [
        (dict(num_replicas=2, min_replicas=1), "not both"),
        (dict(min_replicas=3, max_replicas=2), "below min_replicas"),
        (dict(num_replicas=0), "num_replicas must be a positive integer"),
        (dict(threads_per_replica=0), "threads_per_replica must be a positive integer"),
        (dict(parallel=True), "parallel must be a positive integer"),
        (dict(min_replicas=-1), "min_replicas must be 0 or more"),
    ]
    for kwargs, message in cases:
        with pytest.raises(RayServeConfigError, match=message):
            build_app("m", **kwargs)
    with pytest.raises(RayServeConfigError, match="need 'model'"):
        app_builder({"num_replicas": 2})
    with pytest.raises(RayServeConfigError, match="unknown server setting"):
        app_builder({"model": "m", "server": {"api_kee": "x"}})
    # a good one binds without a cluster: two deployments, the replica's options as asked
    app = app_builder({"model": "m", "min_replicas": 1, "max_replicas": 3,
                       "threads_per_replica": 2, "server": {"max_queue": 5}})
    replica = app._bound_deployment.init_args[0]
    assert replica._bound_deployment.ray_actor_options["num_cpus"] == 2
    cfg = replica._bound_deployment._deployment_config
    assert cfg.autoscaling_config.min_replicas == 1 and cfg.autoscaling_config.max_replicas == 3
    assert cfg.max_ongoing_requests == 4 + 5
    assert "PrefixCacheAffinityRouter" in str(cfg.request_router_config.request_router_class)


def test_cli_ray_options_are_checked_before_anything_starts():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for argv, message in [
        (["--replicas", "2"], "--replicas needs --ray"),
        (["--ray", "--replicas", "2", "--max-replicas", "3"], "not both"),
        (["--ray", "--threads", "2"], "--threads-per-replica"),
        (["--ray", "--header-timeout", "3"], "Ray's HTTP proxy"),
        (["--ray", "--min-replicas", "3", "--max-replicas", "1"], "below --min-replicas"),
        (["--ray", "--threads-per-replica", "0"], "must be 1 or more"),
    ]:
        r = subprocess.run([sys.executable, "-m", "ignis", "serve", "no-such-model", *argv],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, (argv, r.stderr)
        assert message in r.stderr, (argv, r.stderr)


def _forward(replica, fwd) -> tuple[int, dict, bytes]:
    async def run():
        status, headers, body = None, {}, b""
        async for item in replica.handle(fwd):
            if item[0] == "start":
                status, headers = item[1], {k.decode(): v.decode() for k, v in item[2]}
            else:
                body += item[1]
        return status, headers, body
    return asyncio.run(run())


def test_the_replica_answers_as_ignis_serve_and_reports_a_dead_engine(tiny_chat_dir):
    """IgnisReplica without Ray: a forwarded request runs through ignis's own ASGI app (same
    answer as the in-process Client, same error objects), and check_health fails once the
    model's batching thread has stopped."""
    _require_ray()
    from starlette.testclient import TestClient
    from ignis.api.ray_serve import ForwardedRequest, IgnisReplica, ReplicaSpec
    from ignis.api.server import ServerConfig, build_app
    replica = IgnisReplica(ReplicaSpec(model=str(tiny_chat_dir), ctx=N_CTX, threads=1, parallel=2,
                                       server=ServerConfig(host="127.0.0.1")))
    try:
        def fwd(body: bytes, path="/v1/chat/completions", complete=True):
            return ForwardedRequest("POST", path, b"", [(b"host", b"127.0.0.1:8000"),
                                                        (b"content-type", b"application/json")],
                                    body, complete, ("127.0.0.1", 5), prompt="")
        local = ignis.Client([ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1)])
        want = local.chat.completions.create(model="tiny-chat", messages=_user("Say hi."),
                                             max_tokens=12, temperature=0)
        status, headers, body = _forward(replica, fwd(json.dumps(
            {"model": "tiny-chat", "messages": _user("Say hi."), "max_tokens": 12,
             "temperature": 0}).encode()))
        assert status == 200 and headers["x-ignis-replica"] == "local"
        assert json.loads(body)["choices"][0]["message"]["content"] == want.choices[0].message.content
        # streamed: the SSE lines as ignis serve writes them, ending with [DONE]
        status, headers, body = _forward(replica, fwd(json.dumps(
            {"model": "tiny-chat", "messages": _user("Say hi."), "max_tokens": 12,
             "temperature": 0, "stream": True}).encode()))
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in body.decode().split("\n\n")
                  if line.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e["choices"]) == want.choices[0].message.content
        assert body.decode().rstrip().endswith("data: [DONE]")
        # errors: byte for byte what ignis serve's app answers
        own = build_app(ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1),
                        ServerConfig(host="127.0.0.1"))
        with TestClient(own, base_url="http://127.0.0.1:8000") as tc:
            for body_ in [b"{oops", json.dumps({"model": "nope", "messages": _user("x")}).encode(),
                          json.dumps({"model": "tiny-chat"}).encode(),
                          json.dumps({"model": "tiny-chat", "messages": _user("x"),
                                      "bogus": 1}).encode()]:
                r = tc.post("/v1/chat/completions", content=body_,
                            headers={"content-type": "application/json"})
                status, _, got = _forward(replica, fwd(body_))
                assert (status, json.loads(got)) == (r.status_code, r.json())
        # a body cut short by the ingress's deadline: the replica's own 408
        spec_fast = ServerConfig(host="127.0.0.1", body_timeout=0.2)
        fast = IgnisReplica(ReplicaSpec(model=str(tiny_chat_dir), ctx=N_CTX, threads=1,
                                        parallel=2, server=spec_fast))
        status, _, got = _forward(fast, fwd(b'{"model": "tiny', complete=False))
        assert status == 408 and json.loads(got)["error"]["code"] == "request_timeout"
        fast.shutdown()
        replica.check_health()
        replica.model._scheduler.close()           # the engine's batching thread stops
        with pytest.raises(RuntimeError, match="batching thread"):
            replica.check_health()
    finally:
        replica.shutdown()


def test_replicas_take_the_servers_speculative_choice(tiny_chat_dir):
    """--speculative reaches every replica as ignis serve's reaches its model: checked before
    anything starts, carried by the bound spec, loaded by the replica (whose answers then report
    the guessed tokens, as speculation asked for does, and say what plain decoding says)."""
    _require_ray()
    from ignis.api.ray_serve import ForwardedRequest, IgnisReplica, ReplicaSpec, app_builder, build_app
    from ignis.api.server import ServerConfig
    from ignis.generate.speculative import SpeculativeError
    with pytest.raises(SpeculativeError, match="unknown speculative drafter"):
        build_app("m", speculative="bogus")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "ignis", "serve", "no-such-model", "--ray", "--speculative",
                        "bogus"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "unknown speculative drafter" in r.stderr, r.stderr
    bound = app_builder({"model": "m", "speculative": "prompt-lookup"})._bound_deployment.init_args[0]
    assert bound._bound_deployment.init_args[0].speculative == "prompt-lookup"
    assert build_app("m")._bound_deployment.init_args[0]._bound_deployment.init_args[0].speculative == "auto"

    body = {"model": "tiny-chat", "messages": _user("Say hi, say hi, say hi."), "max_tokens": 16,
            "temperature": 0}
    replica = IgnisReplica(ReplicaSpec(model=str(tiny_chat_dir), ctx=N_CTX, threads=1, parallel=1,
                                       speculative="prompt-lookup", server=ServerConfig(host="127.0.0.1")))
    try:
        assert replica.model.speculative.name == "prompt-lookup"
        status, _, got = _forward(replica, ForwardedRequest(
            "POST", "/v1/chat/completions", b"", [(b"host", b"127.0.0.1:8000"),
                                                   (b"content-type", b"application/json")],
            json.dumps(body).encode(), True, ("127.0.0.1", 5)))
    finally:
        replica.shutdown()
    assert status == 200
    got = json.loads(got)
    m = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1, speculative="prompt-lookup")
    try:
        want = ignis.Client([m]).chat.completions.create(**body)
    finally:
        m.weights.close()
    plain = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1, speculative="off")
    try:
        text = ignis.Client([plain]).chat.completions.create(**body).choices[0].message.content
    finally:
        plain.weights.close()
    assert got["choices"][0]["message"]["content"] == want.choices[0].message.content == text
    # the guessed tokens kept and rejected: reported where speculation was asked for. How many
    # tokens a step guesses follows the step times it measures (DraftLength), so the counts of
    # two runs may differ: their names and bounds are what both must have.
    details = want.usage.model_dump()["completion_tokens_details"]
    reported = got["usage"]["completion_tokens_details"]
    assert details is not None and reported is not None and set(reported) == set(details) == {
        "accepted_prediction_tokens", "rejected_prediction_tokens"}
    assert 0 <= reported["accepted_prediction_tokens"] < got["usage"]["completion_tokens"]
    assert reported["rejected_prediction_tokens"] >= 0
    assert got["usage"]["completion_tokens"] == want.usage.completion_tokens


# ---- a local Ray instance: 2 replicas x 1 thread of the default model ----------------------------

@pytest.fixture(scope="module")
def cluster(default_model_dir, tmp_path_factory):
    """Ray on loopback with 2 CPUs (one per replica; the ingress takes none), its session files
    under this test's temp dir and removed after; Serve's HTTP proxy on a free loopback port."""
    _require_ray()
    from ignis.api.ray_serve import build_app
    # a short path: Ray's unix sockets live under it (108 bytes at most)
    temp = Path(tmp_path_factory.mktemp("ray"))
    # what Ray's driver changes in this process, put back for the tests that run after
    saved = (logging.getLogRecordFactory(), list(logging.root.handlers), logging.root.level,
             os.environ.get("RAY_USAGE_STATS_ENABLED"))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"      # no usage report leaves the machine
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False,
             _temp_dir=str(temp), _node_ip_address="127.0.0.1", log_to_driver=False,
             namespace="ignis-test")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(str(default_model_dir), num_replicas=2, threads_per_replica=1,
                            parallel=4, ctx=N_CTX), name="ignis", route_prefix="/")
        yield {"url": f"http://127.0.0.1:{port}/v1", "model": default_model_dir.name,
               "path": default_model_dir}
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
            logging.setLogRecordFactory(saved[0])
            logging.root.handlers[:] = saved[1]
            logging.root.setLevel(saved[2])
            if saved[3] is None:
                os.environ.pop("RAY_USAGE_STATS_ENABLED", None)


@pytest.fixture(scope="module")
def single(cluster):
    """The same model in this process, one request at a time: what every replica must reproduce."""
    m = ignis.load(str(cluster["path"]), n_ctx=N_CTX, threads=1)
    yield m


def _client(cluster, retries: int = 0):
    return openai.OpenAI(base_url=cluster["url"], api_key="unused", max_retries=retries,
                         timeout=120)


def _chat(client, model, prompt, **kw):
    return client.chat.completions.create(model=model, messages=_user(prompt),
                                          max_tokens=MAX_TOKENS, temperature=0, **kw)


def _replicas() -> set[str]:
    """The running replicas of the ignis deployment (their actor names)."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::ignis#ignis-replica#")}


@pytest.mark.model
def test_chat_embeddings_and_errors_over_ray_equal_a_single_process(cluster, single):
    c = _client(cluster)
    name = cluster["model"]
    want = ignis.Client([single]).chat.completions.create(
        model=single.name, messages=_user(PROMPTS[0]), max_tokens=MAX_TOKENS, temperature=0)
    got = _chat(c, name, PROMPTS[0])
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.completion_tokens == want.usage.completion_tokens
    chunks = list(_chat(c, name, PROMPTS[0], stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) \
        == want.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == want.choices[0].finish_reason
    # embeddings: the in-process vectors
    e = c.embeddings.create(model=name, input=["a hash map", "TCP"])
    w = ignis.Client([single]).embeddings.create(model=single.name, input=["a hash map", "TCP"])
    assert [d.embedding for d in e.data] == [d.embedding for d in w.data]
    assert [m.id for m in c.models.list().data][0] == name
    # errors: the same status and error object as ignis serve answers
    with pytest.raises(openai.NotFoundError) as ex:
        _chat(c, "no-such-model", "x")
    assert ex.value.body["code"] == "model_not_found" and ex.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as ex:
        c.chat.completions.create(model=name, messages=_user("x"), max_tokens=-1)
    with pytest.raises(APIError) as mine:      # what ignis serve answers: the Client's error
        ignis.Client([single]).chat.completions.create(model=single.name, messages=_user("x"),
                                                       max_tokens=-1)
    assert (ex.value.status_code, ex.value.body) == (mine.value.status_code, mine.value.body)
    with pytest.raises(openai.BadRequestError) as ex:
        c.chat.completions.create(model=name, messages=_user("x"), extra_body={"bogus": 1})
    assert ex.value.body["code"] == "unknown_parameter"


@pytest.mark.model
def test_eight_concurrent_streams_equal_single_process_output(cluster, single):
    local = ignis.Client([single])
    want = [local.chat.completions.create(model=single.name, messages=_user(p),
                                          max_tokens=MAX_TOKENS, temperature=0)
            .choices[0].message.content for p in PROMPTS]

    def stream(p: str) -> tuple[str, str]:
        raw = _client(cluster).chat.completions.with_raw_response.create(
            model=cluster["model"], messages=_user(p), max_tokens=MAX_TOKENS, temperature=0,
            stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices)
        return text, raw.headers["x-ignis-replica"]
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(stream, PROMPTS))
    assert [t for t, _ in got] == want
    assert len({r for _, r in got}) == 2, "both replicas served the streams"


@pytest.mark.model
def test_a_conversation_goes_back_to_the_replica_holding_its_prefix(cluster):
    """Ray's prefix-cache-affinity router: a follow-up that extends an earlier prompt lands on the
    replica that served it, whose KV slot then reports the shared prefix as cached tokens."""
    c = _client(cluster)
    for i in range(3):
        system = f"Conversation {i}. " + "You answer questions about software. " * 12
        first = c.chat.completions.with_raw_response.create(
            model=cluster["model"], max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."}])
        where = first.headers["x-ignis-replica"]
        answer = first.parse().choices[0].message.content
        follow = c.chat.completions.with_raw_response.create(
            model=cluster["model"], max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."},
                      {"role": "assistant", "content": answer},
                      {"role": "user", "content": "And then?"}])
        assert follow.headers["x-ignis-replica"] == where
        # the conversation's number comes first: another replica would hold only the
        # template's opening tokens of it
        cached = follow.parse().usage.prompt_tokens_details.cached_tokens
        assert cached >= first.parse().usage.prompt_tokens // 2, cached


def _health_by_replica(cluster, want: set[str] | None = None) -> dict[str, dict]:
    """/health of each replica (the ingress sends each call to one of them), until `want` (or 2)
    replicas have answered."""
    import http.client
    port = int(cluster["url"].rsplit(":", 1)[1].split("/")[0])
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while (len(seen) < 2 if want is None else not want <= seen.keys()):
        assert time.monotonic() < deadline, f"replicas answering /health: {sorted(seen)}"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/health")
        r = c.getresponse()
        seen[r.getheader("x-ignis-replica")] = json.loads(r.read())
        c.close()
    return seen


@pytest.mark.model
def test_a_client_that_hangs_up_stops_its_generation_on_the_replica(cluster):
    """The hang-up travels proxy -> ingress -> replica: the replica's ignis app counts the request
    as abandoned (its slot freed at the next token), as ignis serve does."""
    import http.client
    before = _health_by_replica(cluster)
    port = int(cluster["url"].rsplit(":", 1)[1].split("/")[0])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": cluster["model"], "messages": _user(PROMPTS[3]), "max_tokens": 400,
         "temperature": 0, "stream": True, "ignore_eos": True}),
        {"Content-Type": "application/json"})
    r = c.getresponse()
    where = r.getheader("x-ignis-replica")
    assert r.status == 200 and r.read(6) == b"data: "
    c.close()                                     # mid-stream, hundreds of tokens to go
    deadline = time.monotonic() + 60
    while True:
        now = _health_by_replica(cluster, {where})[where]
        if now["abandoned"] == before[where]["abandoned"] + 1 and now["running"] == 0:
            break
        assert time.monotonic() < deadline, f"the replica did not stop the stream: {now}"
        time.sleep(0.5)


@pytest.mark.model
def test_a_killed_replica_fails_its_streams_and_is_replaced(cluster):
    before = _replicas()
    assert len(before) == 2
    # long streams, so that they are running when the replica dies
    raws = [_client(cluster).chat.completions.with_raw_response.create(
        model=cluster["model"], messages=_user(p), max_tokens=300, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) for p in PROMPTS[:4]]
    streams = [(r.headers["x-ignis-replica"], iter(r.parse())) for r in raws]
    for _, s in streams:
        next(s)                                   # every stream has begun
    victim = streams[0][0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)

    def finish(item) -> str:
        _, s = item
        try:
            for _ in s:
                pass
        except openai.APIError as e:
            return (e.body or {}).get("code") if isinstance(e.body, dict) else str(e)
        return "finished"
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(streams)) as ex:
        ends = list(ex.map(finish, streams))
    assert time.monotonic() - t0 < 110, "a stream hung instead of failing"
    for (where, _), end in zip(streams, ends):
        assert end == ("replica_unavailable" if where == victim else "finished"), (where, end)
    # new requests succeed (a request routed to the dead replica before Ray notices is a 503
    # with Retry-After, which the client retries)
    for p in PROMPTS[:4]:
        r = _client(cluster, retries=3).chat.completions.create(
            model=cluster["model"], messages=_user(p), max_tokens=4, temperature=0)
        assert r.choices[0].message.content
    # Ray starts a replica in the dead one's place
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = _replicas()
        status = serve.status().applications["ignis"].deployments["ignis-replica"]
        if victim not in now and status.replica_states.get("RUNNING") == 2 and len(now) == 2:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the killed replica was not replaced: {serve.status()}")
    assert len(now - before) == 1
