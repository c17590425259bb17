"""The Node.js client (clients/node, npm package ignis-client) run by node's own test runner against
the tiny chat model compiled by `ignis compile` and the same model behind `ignis serve`: its local
answers are held to the official `openai` npm package's answers from the server (text,
finish_reason, usage, chunk shapes, embeddings, error status/code/param), its remote fallback
talks to the server itself, and its TypeScript declarations compile (tsc) against a usage file.

The package is installed with `npm ci` (package-lock.json pins koffi, openai, typescript) into a
copy of clients/node that is removed afterwards; node and npm are tools CI installs
(tools_required: a failure there, a skip on a machine without them)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tools_required import require_tool

from test_server import Server

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "node"
N_CTX = 256                 # tiny_chat_compiled's context: the server gets the same


@pytest.fixture(scope="module")
def node_package(tmp_path_factory):
    """clients/node (with examples/node beside it, as in the repository) copied and installed with
    npm ci; removed at the end of the module."""
    node = require_tool("node", "apt-get install nodejs npm", "the Node.js client")
    npm = require_tool("npm", "apt-get install nodejs npm", "the Node.js client")
    where = tmp_path_factory.mktemp("node-client")
    pkg = where / "clients" / "node"            # the repository's layout, for examples/node
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("node_modules"))
    shutil.copytree(ROOT / "examples" / "node", where / "examples" / "node")
    p = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"],
                       cwd=pkg, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        pytest.fail(f"npm ci in {pkg} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    yield node, pkg
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tiny_chat_dir, tmp_path_factory):
    """`ignis serve` of the model the library was compiled from: f32 weights, the same context
    (the last --ctx wins over test_server's default)."""
    s = Server(tiny_chat_dir, tmp_path_factory.mktemp("node-serve-log") / "server.log",
               "--weights", "f32", "--ctx", str(N_CTX))
    yield s
    s.stop()


def test_node_client(node_package, server, tiny_chat_compiled):
    node, pkg = node_package
    env = dict(os.environ,
               IGNIS_NODE_LIB_DIR=str(tiny_chat_compiled.directory),
               IGNIS_NODE_MODEL="tiny-chat",
               IGNIS_NODE_BASE_URL=f"http://127.0.0.1:{server.port}/v1")
    tests = sorted(str(p.relative_to(pkg)) for p in (pkg / "test").glob("*.test.mjs"))
    assert tests, f"no node tests in {pkg / 'test'}"
    p = subprocess.run([node, "--test", "--test-reporter=spec", *tests], cwd=pkg, env=env,
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    print(out)                  # shown with -rP, and on failure
    assert p.returncode == 0, f"node --test failed ({p.returncode}):\n{out}"
    # node's runner ends with counters ("ℹ pass 20"): every test ran and passed, none skipped
    counts = dict(re.findall(r"^\S+ (tests|pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert counts.get("fail") == counts.get("cancelled") == counts.get("skipped") == counts.get("todo") == "0", out
    assert counts.get("pass") == counts.get("tests") and int(counts["pass"]) >= 25, out


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "developer", "content": "日本語で"}, {"role": "user", "content": "é\u0301 <|im_end|>"}],
]


def test_node_chat_example_streams_the_servers_greedy_answer(node_package, server, tiny_chat_compiled):
    """examples/node/chat.mjs prints what the official Python client gets from `ignis serve` for
    the same greedy request; with -m and IGNIS_BASE_URL it asks the server itself."""
    node, pkg = node_package
    example = pkg.parent.parent / "examples" / "node" / "chat.mjs"
    api = server.client()
    texts = set()
    for conv, n, bias in ((CONVERSATIONS[0], 24, None), (CONVERSATIONS[1], 30, {"10": -100}),
                          (CONVERSATIONS[2], 30, {"10": -100})):
        args = [a for m in conv for a in (m["role"], m["content"])]
        extra = ["-x", json.dumps({"logit_bias": bias})] if bias else []
        p = subprocess.run([node, str(example), "-n", str(n), *extra, str(tiny_chat_compiled.directory), *args],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        want = api.chat.completions.create(model="tiny-chat", messages=conv, max_tokens=n, temperature=0,
                                           logit_bias=bias)
        assert p.stdout.decode("utf-8") == want.choices[0].message.content + "\n"
        texts.add(want.choices[0].message.content)
    assert len(texts) == 3
    # -m: a name with no library goes to IGNIS_BASE_URL (the server's own 404), else is refused here
    p = subprocess.run([node, str(example), "-m", "other", str(tiny_chat_compiled.directory), "user", "hi"],
                       capture_output=True, timeout=120,
                       env=dict(os.environ, IGNIS_BASE_URL=f"http://127.0.0.1:{server.port}/v1"))
    assert p.returncode == 1 and p.stderr.startswith(b"404 The model 'other' does not exist"), p.stderr
    p = subprocess.run([node, str(example), "-m", "other", str(tiny_chat_compiled.directory), "user", "hi"],
                       capture_output=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                if k != "IGNIS_BASE_URL"})
    assert p.returncode == 1 and b"no baseURL" in p.stderr, p.stderr
    p = subprocess.run([node, str(example), str(tiny_chat_compiled.directory), "user"], capture_output=True)
    assert p.returncode == 2 and b"usage" in p.stderr


@pytest.mark.model
@pytest.mark.slow
def test_node_chat_example_on_the_default_model(node_package, default_model_compiled):
    """The README's flow on the real default model: examples/node/chat.mjs streams the greedy
    answer the Python client gets from the same library (tests/test_native_api.py holds that one
    to the in-process engine)."""
    import ignis
    node, pkg = node_package
    example = pkg.parent.parent / "examples" / "node" / "chat.mjs"
    directory = default_model_compiled.directory
    name = json.loads((directory / "manifest.json").read_text())["model"]
    with ignis.Client(native=str(directory), native_options={"threads": 2}) as client:
        for conv, n in (([{"role": "user", "content": "Write a haiku about C."}], 32),
                        ([{"role": "system", "content": "Answer in one word."},
                          {"role": "user", "content": "Is Python a snake? Say yes or no."}], 8)):
            args = [a for m in conv for a in (m["role"], m["content"])]
            p = subprocess.run([node, str(example), "-n", str(n), str(directory), *args],
                               capture_output=True, timeout=300)
            assert p.returncode == 0, p.stderr.decode()
            want = client.chat.completions.create(model=name, messages=conv,
                                                  max_tokens=n, temperature=0)
            assert want.choices[0].message.content
            assert p.stdout.decode("utf-8") == want.choices[0].message.content + "\n"
