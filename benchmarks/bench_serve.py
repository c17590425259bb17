"""Aggregate throughput of `ignis serve` with 1, 2, 4 and 8 concurrent streams.

    python benchmarks/bench_serve.py [--model qwen2.5-coder-0.5b-instruct] [--weights q8]
                                     [--runs 3] [--tokens 64] [--threads 2]

Starts one real `ignis serve` process (--parallel 8) and, for each concurrency level in turn (levels
interleaved run by run), sends that many streaming /v1/completions requests at once over raw HTTP,
each with its own prompt, greedy, `ignore_eos`, `max_tokens` tokens. Aggregate tokens/s is every
stream's completion tokens over the wall time from the first request to the last [DONE]; also the
median time to first token. Prints medians, the speedup of each level over one stream, and the
server's own batching count (sequences per engine step).

    python benchmarks/bench_serve.py --ray [--replicas 2] [--threads-per-replica 1]

also starts `ignis serve --ray` (a local Ray instance; --replicas replicas of --parallel / replicas
slots and --threads-per-replica threads each, the same cores in all as the single process's
--threads) and measures the same levels through Ray's HTTP proxy, beside the single process. Then
the cached-token rate of Ray's request routing: 4 and 8 conversations, each with its own long
system prompt, three turns each, a turn's requests sent at once; the share of the follow-up turns' prompt
tokens that the serving replica had in a KV slot (usage.prompt_tokens_details.cached_tokens), with
Ray's prefix-cache-affinity router and with its default power-of-two choice (--no-prefix-routing).
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
CONVERSATIONS = (4, 8)     # --ray's routing workload: fewer, and as many, as the KV slots in all
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


def _start(argv: list[str], port: int, env: dict, what: str) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{what} did not start:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()       # SIGTERM: ignis serve --ray shuts Serve and its Ray instance down
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _chat(port: int, model: str, messages: list[dict], tokens: int) -> dict:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    if r.status != 200:
        raise SystemExit(f"a chat request failed: HTTP {r.status} {data}")
    return data


def cached_rate(port: int, model: str, conversations: int = 8, turns: int = 3) -> float:
    """The share of the follow-up turns' prompt tokens served from a replica's KV slot. Each
    call's conversations are new to the server (a numbered first line)."""
    global _calls
    _calls += 1
    topics = ["databases", "compilers", "networks", "operating systems", "graphics", "security",
              "distributed systems", "numerical methods"]
    convs = [[{"role": "system", "content": f"Session {_calls}.{i}: you are an expert in {topics[i % 8]}. "
                                            + "Answer briefly and precisely, with one example. " * 20}]
             for i in range(conversations)]
    asks = ["Give me one tip.", "Why does it matter?", "And a common mistake?"]
    cached = prompt = 0
    for t in range(turns):
        for conv in convs:
            conv.append({"role": "user", "content": asks[t % len(asks)]})
        outs: list[dict] = [dict() for _ in convs]

        def one(i: int) -> None:
            outs[i].update(_chat(port, model, convs[i], 16))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(convs))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for conv, out in zip(convs, outs):
            conv.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
            if t > 0:
                u = out["usage"]
                prompt += u["prompt_tokens"]
                cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return cached / prompt


def levels(port: int, model: str, runs: int, tokens: int, health: bool
           ) -> tuple[dict[int, list[dict]], dict[int, list[float]]]:
    run_level(port, model, 2, 8)                                   # warm-up: pages in the weights
    results: dict[int, list[dict]] = {n: [] for n in LEVELS}
    batching: dict[int, list[float]] = {n: [] for n in LEVELS}
    for _ in range(runs):
        for n in LEVELS:
            b0 = _get(port, "/health").get("batching") if health else None
            results[n].append(run_level(port, model, n, tokens))
            if b0 is not None:
                b1 = _get(port, "/health")["batching"]
                steps = b1["steps"] - b0["steps"]
                batching[n].append((b1["rows"] - b0["rows"]) / steps if steps else 0.0)
    return results, batching


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weights", default="q8", choices=WEIGHT_FORMATS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per stream")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ray", action="store_true", help="also ignis serve --ray, and its routing")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads-per-replica", type=int, default=1)
    args = ap.parse_args()
    if args.ray:
        ray_main(args)
        return

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



def ray_main(args: argparse.Namespace) -> None:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
               RAY_USAGE_STATS_ENABLED="0")
    common = [sys.executable, "-m", "ignis", "serve", args.model, "--weights", args.weights,
              "--ctx", "1024", "-q"]
    slots = max(LEVELS)
    per = -(-slots // args.replicas)
    single_port = _free_port()
    proc = _start(common + ["--port", str(single_port), "--threads", str(args.threads),
                            "--parallel", str(slots)], single_port, env, "ignis serve")
    try:
        single, single_rows = levels(single_port, args.model, args.runs, args.tokens, True)
        single_cached = {k: cached_rate(single_port, args.model, k) for k in CONVERSATIONS}
    finally:
        _stop(proc)
    ray_cmd = common + ["--ray", "--replicas", str(args.replicas), "--threads-per-replica",
                        str(args.threads_per_replica), "--parallel", str(per)]
    port = _free_port()
    proc = _start(ray_cmd + ["--port", str(port)], port, env, "ignis serve --ray")
    try:
        on_ray, _ = levels(port, args.model, args.runs, args.tokens, False)
        prefix_cached = {k: cached_rate(port, args.model, k) for k in CONVERSATIONS}
    finally:
        _stop(proc)
    port = _free_port()
    proc = _start(ray_cmd + ["--port", str(port), "--no-prefix-routing"], port, env,
                  "ignis serve --ray --no-prefix-routing")
    try:
        pow2_cached = {k: cached_rate(port, args.model, k) for k in CONVERSATIONS}
    finally:
        _stop(proc)

    sys.path.insert(0, str(root))
    from bench_generate import machine
    print(f"model {args.model}, {args.weights} weights; {machine()}; {args.tokens} tokens per "
          f"stream; median of {args.runs} runs")
    print(f"single: ignis serve --threads {args.threads} --parallel {slots}; ray: ignis serve --ray "
          f"--replicas {args.replicas} --threads-per-replica {args.threads_per_replica} "
          f"--parallel {per}")
    print(f"{'streams':>8}{'single tok/s':>14}{'ray tok/s':>11}{'ray/single':>12}"
          f"{'single TTFT s':>15}{'ray TTFT s':>12}")
    summary = {}
    for n in LEVELS:
        a = statistics.median(r["tok_s"] for r in single[n])
        b = statistics.median(r["tok_s"] for r in on_ray[n])
        ta = statistics.median(r["ttft_s"] for r in single[n])
        tb = statistics.median(r["ttft_s"] for r in on_ray[n])
        summary[n] = {"single_tok_s": a, "ray_tok_s": b, "single_ttft_s": ta, "ray_ttft_s": tb,
                      "single_rows_per_step": statistics.median(single_rows[n])}
        print(f"{n:>8}{a:>14.1f}{b:>11.1f}{b / a:>11.2f}x{ta:>15.2f}{tb:>12.2f}")
    print("cached share of the follow-up turns' prompt tokens (conversations x 3 turns, all of a "
          "turn at once)")
    print(f"{'conversations':>14}{'single':>9}{'ray prefix router':>19}{'ray power-of-two':>18}")
    for k in CONVERSATIONS:
        print(f"{k:>14}{single_cached[k]:>9.1%}{prefix_cached[k]:>19.1%}{pow2_cached[k]:>18.1%}")
    print(json.dumps({"model": args.model, "weights": args.weights, "replicas": args.replicas,
                      "threads_per_replica": args.threads_per_replica, "tokens": args.tokens,
                      "medians": summary, "cached_rate": {"single": single_cached,
                      "ray_prefix": prefix_cached, "ray_pow2": pow2_cached}}))


if __name__ == "__main__":
    main()
