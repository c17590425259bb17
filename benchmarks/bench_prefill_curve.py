"""Prefill speed against prompt length: ignis beside llama.cpp on the same GGUF file, 128 to 4096 tokens.

    python benchmarks/bench_prefill_curve.py [--model qwen2.5-coder-0.5b-instruct] [--runs 3]
                                             [--threads 2] [--lengths 128,512,1024,2048,4096]
                                             [--cases "ignis gguf,llama.cpp shipped"]

Long prompts (RAG, code context, agent histories) spend more of their prefill in attention, whose
work grows with the square of the length while the matrix products grow linearly; this shows how
much of the short-prompt speed each engine keeps. One fresh process per case and run, cases
interleaved run by run; in each, one warm-up step, then every length once (a new sequence each, the
same random ids for every engine). ignis prefills in its engine's chunks (128 tokens), llama.cpp
with n_batch 512 and flash attention, both with the given threads. Printed: median tok/s per
length, each length's share of the engine's own 128-token speed, and ignis / llama.cpp.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import llama_file, machine, versions  # noqa: E402

RUNNER = r'''
import json, sys, time
import numpy as np
case, model, threads, path, lengths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \
    [int(x) for x in sys.argv[5].split(",")]
n_ctx = max(lengths) + 16
if case.startswith("llama.cpp"):
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_batch=512, n_ubatch=512, flash_attn=True, verbose=False)
    def prefill(ids):
        llm.reset(); llm.eval(ids.tolist())
else:
    from ignis.loader.resolve import open_model
    from ignis.runtime.engine import Engine
    eng = Engine(open_model(model, progress=False), n_ctx=n_ctx, threads=threads,
                 weight_format=case.split()[1], kv_dtype="auto")
    def prefill(ids):
        eng.reset(); eng.forward(ids)
rng = np.random.default_rng(0)
prefill(rng.integers(0, 1000, 8))                   # warm-up: page the weights in
out = {}
for n in lengths:
    ids = rng.integers(0, 1000, n)
    t = time.perf_counter(); prefill(ids); out[n] = n / (time.perf_counter() - t)
print(json.dumps(out))
'''

CASES = ["ignis gguf", "llama.cpp shipped"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--lengths", default="128,512,1024,2048,4096")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"unknown case {c!r}; known: {', '.join(CASES)}")
    if "llama.cpp shipped" in cases:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp shipped: skipped (llama-cpp-python is not installed)")
            cases.remove("llama.cpp shipped")
    paths = {c: llama_file(c, args.model) if c.startswith("llama.cpp") else "" for c in cases}
    runs: dict[str, list[dict[int, float]]] = {c: [] for c in cases}
    for r in range(args.runs):
        for c in cases:
            p = subprocess.run([sys.executable, "-c", RUNNER, c, args.model, str(args.threads), paths[c],
                                ",".join(map(str, lengths))], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{c} failed:\n{p.stderr[-3000:]}")
            runs[c].append({int(k): v for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()})
            print(f"run {r + 1}/{args.runs} {c}: " + ", ".join(f"{n} {runs[c][-1][n]:.0f}" for n in lengths),
                  file=sys.stderr, flush=True)
    med = {c: {n: statistics.median(x[n] for x in runs[c]) for n in lengths} for c in cases}
    print(f"{machine()}; {versions()}; {args.model}, {args.threads} threads, medians of {args.runs} runs\n")
    head = "| prompt tokens | " + " | ".join(f"{c} tok/s | vs its {lengths[0]}" for c in cases)
    if len(cases) == 2:
        head += " | ignis / llama.cpp"
    print(head + " |")
    print("|" + "---|" * (1 + 2 * len(cases) + (len(cases) == 2)))
    for n in lengths:
        row = f"| {n} | " + " | ".join(f"{med[c][n]:.0f} | {med[c][n] / med[c][lengths[0]]:.0%}" for c in cases)
        if len(cases) == 2:
            row += f" | {med[cases[0]][n] / med[cases[1]][n]:.2f}x"
        print(row + " |")


if __name__ == "__main__":
    main()
