"""KV cache precision: f32 against f16 (IEEE half, widened as attention reads it), the two questions
that choose the default.

    python benchmarks/bench_kv.py [--model qwen2.5-coder-0.5b-instruct] [--weights auto] [--runs 3]
                                  [--depths 512,2048,4000] [--threads 2]

1. Agreement: greedy continuations (64 tokens) of the ten reference prompts of
   tests/reference/make_logits_reference.py with each KV precision: how many are identical, and
   where the others first differ.
2. Speed: decode tok/s with the cache already holding `depth` positions (a prefill of random
   ordinary tokens, then 32 greedy steps timed), f32 and f16 interleaved run by run; medians and the
   f16/f32 ratio. The KV cache is read once per step per layer, so its share of the bytes a step
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


def decode_rate(eng, depth: int, vocab: int) -> float:
    eng.reset()
    rng = np.random.default_rng(depth)
    ids = rng.integers(100, min(vocab, 20000), depth).astype(np.int32)
    logits = eng.forward(ids)
    t0 = time.perf_counter()
    for _ in range(STEPS):
        logits = eng.forward(np.array([int(np.argmax(logits[0]))], np.int32))
    return STEPS / (time.perf_counter() - t0)


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

    print(f"\ndecode tok/s after `depth` cached positions (median of {args.runs}, {STEPS} steps):")
    print(f"  {'depth':>6} {'f32 KV':>9} {'f16 KV':>9} {'f16/f32':>8}")
    vocab = files.config.vocab_size
    for depth in depths:
        rates: dict[str, list[float]] = {"f32": [], "f16": []}
        for _ in range(args.runs):
            for kv in ("f32", "f16"):
                rates[kv].append(decode_rate(engines[kv], depth, vocab))
        m32, m16 = statistics.median(rates["f32"]), statistics.median(rates["f16"])
        print(f"  {depth:>6} {m32:>9.2f} {m16:>9.2f} {m16 / m32:>7.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
