"""`ignis serve --ray` (ignis.api.ray_serve): the OpenAI server as a Ray Serve application. A local
Ray instance (loopback, 2 CPUs, a 100 MB object store, no dashboard, its files under the test's
temp dir) serves the default model with 2 replicas x 1 thread; the official `openai` client talks
to Ray's HTTP proxy. The answers must equal the single-process ones, the errors ignis serve's;
a replica killed mid-stream must fail its streams with a retryable error while the other replica's
finish, and Ray must replace it. The quick tests run the replica's request forwarding in-process."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ignis
from tools_required import missing_tool

openai = pytest.importorskip("openai", reason="driven with the official client (in the test extras)")
pytest.importorskip("starlette", reason="ignis serve needs the server extra: pip install 'ignis[server]'")

try:
    import ray
    from ray import serve
except ImportError as e:      # ignis[ray]; CI installs it with the test extras
    ray = serve = None
    _RAY_MISSING = str(e)

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 512
MAX_TOKENS = 24
PROMPTS = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
           "Write a SQL query that counts users per country.", "What does `git rebase` do?",
           "Write a bash loop over the files in a directory.", "Describe the TCP handshake.",
           "Write a C function that sums an array of ints.", "What is a closure in JavaScript?"]


def _require_ray() -> None:
    if ray is None:
        missing_tool(f"Ray Serve is not installed ({_RAY_MISSING}; pip install 'ignis[ray]'): "
                     f"ignis serve --ray is not checked")


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
