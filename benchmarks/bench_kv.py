"""KV cache precision: f32 against f16 (IEEE half, widened as attention reads it), the two questions
that choose the default.

    python benchmarks/bench_kv.py [--model qwen2.5-coder-0.5b-instruct] [--weights auto] [--runs 3]
                                  [--depths 512,2048,4000] [--threads 2]

1. Agreement: greedy continuations (64 tokens) of the ten reference prompts of
   tests/reference/make_logits_reference.py with each KV precision: how many are identical, and
   where the others first differ.
2. Speed: the prefill of `depth` random ordinary tokens, then decode tok/s with the cache holding
   them (32 greedy steps timed), f32 and f16 interleaved run by run; medians and the f16/f32
   ratios. The KV cache is read once per step per layer, so its share of the bytes a step
   moves grows with depth: at depth 4000 the default model's f32 cache is 4000 x 24 layers x 2 x
   128 x 4 bytes = 98 MB against ~400 MB of gguf weights.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reference"))
from make_logits_reference import GREEDY, PROMPTS  # noqa: E402  the reference prompts

STEPS = 32


def greedy(eng, ids: list[int], n: int, eos: set[int]) -> list[int]:
    eng.reset()
    logits = eng.forward(np.array(ids, np.int32))
    out: list[int] = []
    for _ in range(n):
        t = int(np.argmax(logits[0]))
        out.append(t)
        if t in eos:
            break
        logits = eng.forward(np.array([t], np.int32))
    return out


def rates(eng, depth: int, vocab: int) -> tuple[float, float]:
    """(prefill tok/s of the `depth` positions, decode tok/s of the steps after them)"""
    eng.reset()
    rng = np.random.default_rng(depth)
    ids = rng.integers(100, min(vocab, 20000), depth).astype(np.int32)
    t0 = time.perf_counter()
    logits = eng.forward(ids)
    t1 = time.perf_counter()
    for _ in range(STEPS):
        logits = eng.forward(np.array([int(np.argmax(logits[0]))], np.int32))
    return depth / (t1 - t0), STEPS / (time.perf_counter() - t1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--depths", default="512,2048,4000")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]

    import ignis
    from ignis.runtime import Engine
    model = ignis.load(args.model, weight_format=args.weights, n_ctx=16, progress=False)
    files, tok = model.files, model.tokenizer
    n_ctx = max(depths) + STEPS + 1
    engines = {kv: Engine(files, n_ctx=n_ctx, threads=args.threads, kv_dtype=kv,
                          weight_format=model.weight_format) for kv in ("f32", "f16")}
    print(f"model {args.model}, weights {model.weight_format}, kernels "
          f"{engines['f32'].options.kernels}, threads {engines['f32'].options.threads}")

    eos = set(model.eos_token_ids)
    same = 0
    print(f"\ngreedy agreement, {GREEDY} tokens per prompt:")
    for name, text in PROMPTS:
        ids = tok.encode(text)
        a, b = (greedy(engines[kv], ids, GREEDY, eos) for kv in ("f32", "f16"))
        if a == b:
            same += 1
            print(f"  {name:<14} identical ({len(a)} tokens)")
        else:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  {name:<14} differs from token {first}")
    print(f"  {same}/{len(PROMPTS)} identical")

    print(f"\nprefill of `depth` positions, then decode tok/s after them (medians of {args.runs}, "
          f"{STEPS} decode steps):")
    print(f"  {'depth':>6} {'prefill f32':>12} {'f16':>9} {'f16/f32':>8}   {'decode f32':>11} {'f16':>9} "
          f"{'f16/f32':>8}")
    vocab = files.config.vocab_size
    for depth in depths:
        got: dict[str, list[tuple[float, float]]] = {"f32": [], "f16": []}
        for _ in range(args.runs):
            for kv in ("f32", "f16"):
                got[kv].append(rates(engines[kv], depth, vocab))
        p32, p16 = (statistics.median(r[0] for r in got[kv]) for kv in ("f32", "f16"))
        d32, d16 = (statistics.median(r[1] for r in got[kv]) for kv in ("f32", "f16"))
        print(f"  {depth:>6} {p32:>12.1f} {p16:>9.1f} {p16 / p32:>7.3f}x   {d32:>11.2f} {d16:>9.2f} "
              f"{d16 / d32:>7.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
