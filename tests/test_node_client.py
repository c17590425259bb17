"""The Node.js client (clients/node, npm package ignis-client) run by node's own test runner against
the tiny chat model compiled by `ignis compile` and the same model behind `ignis serve`: its local
answers are held to the official `openai` npm package's answers from the server (text,
finish_reason, usage, chunk shapes, embeddings, error status/code/param), its remote fallback
talks to the server itself, and its TypeScript declarations compile (tsc) against a usage file.

The package is installed with `npm ci` (package-lock.json pins koffi, openai, typescript) into a
copy of clients/node that is removed afterwards; node and npm are tools CI installs
(tools_required: a failure there, a skip on a machine without them)."""
from __future__ import annotations

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
    """clients/node copied and installed with npm ci; removed at the end of the module."""
    node = require_tool("node", "apt-get install nodejs npm", "the Node.js client")
    npm = require_tool("npm", "apt-get install nodejs npm", "the Node.js client")
    where = tmp_path_factory.mktemp("node-client")
    pkg = where / "ignis-client"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("node_modules"))
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
    assert p.returncode == 0, f"node --test failed ({p.returncode}):\n{out}"
    # node's runner ends with counters ("ℹ pass 20"): every test ran and passed, none skipped
    counts = dict(re.findall(r"^\S+ (tests|pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert counts.get("fail") == counts.get("cancelled") == counts.get("skipped") == counts.get("todo") == "0", out
    assert counts.get("pass") == counts.get("tests") and int(counts["pass"]) >= 15, out
