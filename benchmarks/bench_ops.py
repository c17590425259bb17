"""Where a decode step's time goes, per op: the executor's per-instruction profile (Executor.profile,
csrc/executor.c ig_model_profile) over greedy decode, at each thread count, side by side.

    python benchmarks/bench_ops.py [--model gemma3-270m] [--weights gguf] [--threads 1,2] [--tokens 128]
                                   [--depth 16] [--kv auto|f32|f16]

Each thread count runs in a fresh process (the pool starts with the first job that wants threads):
load, a --depth-token prompt (random ordinary tokens: the KV cache then holds that many positions),
8 unmeasured decode steps, then --tokens steps of forward + argmax as
bench_generate.py drives them. Instructions of the same op and node name in every layer (blk.N.
stripped) are summed; per group: us per token at each thread count, the share of the step, and the
speed-up from the first thread count to the last. "outside the tape" is the wall time per token
not spent in the step's instructions: Python's forward, the logits copy, argmax.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, re, sys, time
import numpy as np
from ignis.runtime.engine import Engine
from ignis.loader.resolve import open_model
model, weights, threads, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
depth, kv = int(sys.argv[5]), sys.argv[6]
eng = Engine(open_model(model, progress=False), n_ctx=max(1024, depth + n + 64), threads=threads,
             weight_format=weights, kv_dtype=kv)
rng = np.random.default_rng(0)
tok = int(np.argmax(eng.forward(rng.integers(0, 1000, depth))[0]))
for _ in range(8):
    tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
names = eng._exec.instructions
ns = np.zeros(len(names), np.int64)
eng._exec.profile(ns)
t = time.perf_counter()
for _ in range(n):
    tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
wall = time.perf_counter() - t
eng._exec.profile(None)
groups = {}
for (op, name), v in zip(names, ns):
    key = f"{op} {re.sub(r'blk[.][0-9]+[.]', '', name)}"
    c, us = groups.get(key, (0, 0.0))
    groups[key] = (c + 1, us + v / n / 1e3)
print(json.dumps({"wall_us": wall / n * 1e6, "tape_us": float(ns.sum()) / n / 1e3, "groups": groups,
                  "kv": eng.options.kv_dtype}))
'''


def run(model: str, weights: str, threads: int, tokens: int, depth: int, kv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, model, weights, str(threads), str(tokens),
                        str(depth), kv],
                       capture_output=True, text=True, env=env, cwd=str(ROOT))
    if r.returncode != 0:
        raise SystemExit(f"bench_ops: the {threads}-thread run failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--weights", default="gguf")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tokens", type=int, default=128, help="profiled decode steps")
    ap.add_argument("--depth", type=int, default=16,
                    help="prompt tokens before the decode steps (positions already in the KV cache)")
    ap.add_argument("--kv", default="auto", choices=("f32", "f16", "auto"),
                    help="KV cache storage (auto, the default: what ignis.load stores, f16 on the "
                         "AVX-512 and AVX2 tables)")
    args = ap.parse_args()
    if args.depth < 1 or args.tokens < 1:
        ap.error(f"--depth and --tokens must be at least 1, got {args.depth} and {args.tokens}")
    counts = [int(t) for t in args.threads.split(",")]
    res = {t: run(args.model, args.weights, t, args.tokens, args.depth, args.kv) for t in counts}
    keys = sorted(res[counts[0]]["groups"], key=lambda k: -res[counts[0]]["groups"][k][1])
    kv = res[counts[0]].get("kv", args.kv)
    print(f"{args.model} ({args.weights}, KV {kv}), {args.tokens} decode steps after a "
          f"{args.depth}-token prompt, us per token per op group")
    head = f"{'op node':44s}{'n':>4}" + "".join(f"{f'{t}T us':>10}{'share':>7}" for t in counts)
    print(head + (f"{f'{counts[0]}T/{counts[-1]}T':>8}" if len(counts) > 1 else ""))
    for k in keys:
        row = f"{k[:44]:44s}{res[counts[0]]['groups'][k][0]:>4}"
        for t in counts:
            us = res[t]["groups"][k][1]
            row += f"{us:>10.1f}{us / res[t]['tape_us']:>7.1%}"
        if len(counts) > 1:
            last = res[counts[-1]]["groups"][k][1]
            row += f"{res[counts[0]]['groups'][k][1] / last:>8.2f}" if last > 0 else f"{'':>8}"
        print(row)
    for label, key in (("tape (every instruction)", "tape_us"), ("wall per token", "wall_us")):
        print(f"{label:48s}" + "".join(f"{res[t][key]:>10.1f}{'':>7}" for t in counts))
    print(f"{'outside the tape':48s}" + "".join(
        f"{res[t]['wall_us'] - res[t]['tape_us']:>10.1f}{'':>7}" for t in counts))
    print(f"{'tok/s':48s}" + "".join(f"{1e6 / res[t]['wall_us']:>10.1f}{'':>7}" for t in counts))


if __name__ == "__main__":
    main()
