"""Aggregate throughput of `ignis serve` with 1, 2, 4 and 8 concurrent streams.

    python benchmarks/bench_serve.py [--model qwen2.5-coder-0.5b-instruct] [--weights q8]
                                     [--runs 3] [--tokens 64] [--threads 2]

Starts one real `ignis serve` process (--parallel 8) and, for each concurrency level in turn (levels
interleaved run by run), sends that many streaming /v1/completions requests at once over raw HTTP,
each with its own prompt, greedy, `ignore_eos`, `max_tokens` tokens. Aggregate tokens/s is every
stream's completion tokens over the wall time from the first request to the last [DONE]; also the
median time to first token. Prints medians, the speedup of each level over one stream, and the
server's own batching count (sequences per engine step).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ignis.formats import WEIGHT_FORMATS

LEVELS = (1, 2, 4, 8)
PROMPTS = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
           "Write a SQL query that counts users per country.", "What does `git rebase` do?",
           "Write a bash loop over the files in a directory.", "Describe the TCP handshake.",
           "Write a C function that sums an array of ints.", "What is a closure in JavaScript?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    return json.loads(c.getresponse().read())


def _stream(port: int, model: str, prompt: str, tokens: int, out: dict) -> None:
    """One streaming completion; records time to first token, tokens and end time."""
    try:
        _stream1(port, model, prompt, tokens, out)
    except Exception as e:      # noqa: BLE001 - reported by run_level
        out["error"] = e


def _stream1(port: int, model: str, prompt: str, tokens: int, out: dict) -> None:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and first is None and ev["choices"][0].get("text"):
            first = time.perf_counter() - t0
        if ev.get("usage"):
            out["tokens"] = ev["usage"]["completion_tokens"]
    out["ttft"] = first
    out["end"] = time.perf_counter()


_calls = 0


def run_level(port: int, model: str, n: int, tokens: int) -> dict:
    """n streams at once; every prompt is new to the server (a numbered first line), so no
    stream's prompt comes from a KV slot's cache."""
    global _calls
    _calls += 1
    outs: list[dict] = [dict() for _ in range(n)]
    threads = [threading.Thread(target=_stream, args=(
        port, model, f"Request {_calls}.{i}:\n{PROMPTS[i % len(PROMPTS)]}", tokens, outs[i]))
        for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in outs:
        if "error" in o:
            raise SystemExit(f"a stream failed: {o['error']}")
    wall = max(o["end"] for o in outs) - t0
    total = sum(o["tokens"] for o in outs)
    return {"tok_s": total / wall, "ttft_s": statistics.median(o["ttft"] for o in outs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weights", default="q8", choices=WEIGHT_FORMATS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per stream")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    port = _free_port()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "ignis", "serve", args.model, "--port", str(port),
                             "--weights", args.weights, "--threads", str(args.threads),
                             "--parallel", str(max(LEVELS)), "--ctx", "1024", "-q"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                _get(port, "/health")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"ignis serve did not start:\n{proc.stderr.read()[-3000:]}")
                time.sleep(0.2)
        run_level(port, args.model, 2, 8)                                   # warm-up: pages in the weights
        results: dict[int, list[dict]] = {n: [] for n in LEVELS}
        batching: dict[int, list[float]] = {n: [] for n in LEVELS}
        for _ in range(args.runs):
            for n in LEVELS:
                b0 = _get(port, "/health")["batching"]
                results[n].append(run_level(port, args.model, n, args.tokens))
                b1 = _get(port, "/health")["batching"]
                steps = b1["steps"] - b0["steps"]
                batching[n].append((b1["rows"] - b0["rows"]) / steps if steps else 0.0)
    finally:
        proc.terminate()
        proc.wait(30)

    sys.path.insert(0, str(root))
    from bench_generate import machine
    print(f"model {args.model}, {args.weights} weights; {machine()}; {args.threads} threads; "
          f"{args.tokens} tokens per stream; median of {args.runs} runs")
    base = statistics.median(r["tok_s"] for r in results[1])
    print(f"{'streams':>8}{'aggregate tok/s':>17}{'vs 1 stream':>13}{'per stream':>12}"
          f"{'TTFT s':>9}{'rows/step':>11}")
    summary = {}
    for n in LEVELS:
        tok = statistics.median(r["tok_s"] for r in results[n])
        ttft = statistics.median(r["ttft_s"] for r in results[n])
        rows = statistics.median(batching[n])
        summary[n] = {"tok_s": tok, "ttft_s": ttft, "rows_per_step": rows}
        print(f"{n:>8}{tok:>17.1f}{tok / base:>12.2f}x{tok / n:>12.1f}{ttft:>9.2f}{rows:>11.2f}")
    print(json.dumps({"model": args.model, "weights": args.weights, "threads": args.threads,
                      "tokens": args.tokens, "medians": summary}))


if __name__ == "__main__":
    main()
