"""Prefill and decode speed: ignis (f32, q8) beside PyTorch transformers (f32, bf16) on the same model.

    python benchmarks/bench_generate.py [--model qwen2.5-coder-0.5b-instruct] [--runs 3] [--threads 2]

Every case runs in a fresh process (so peak RSS is its own), the cases interleaved run by run so that
machine drift hits all of them alike. In each process: load, one warm-up step, then
  prefill 128 / 512   one forward pass over a prompt of that many tokens, empty cache   -> tokens/s
  decode 128          greedy, one token per step after a 16-token prompt               -> tokens/s
Both engines are driven the same way: forward, argmax, feed back (no sampling, no detokenizing).
Prints medians per case and the ratio of each case to ignis f32; peers missing from this machine
(torch not installed) are listed as skipped, not guessed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

PREFILL = (128, 512)
DECODE = 128

RUNNER = r'''
import json, resource, sys, time
import numpy as np
case, model_name, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
t0 = time.perf_counter()
if case.startswith("ignis"):
    import ignis
    from ignis.runtime.engine import Engine
    from ignis.loader.resolve import open_model
    files = open_model(model_name, progress=False)
    eng = Engine(files, n_ctx=1024, threads=threads, weight_format=case.split()[1])
    vocab = files.config.vocab_size
    def prefill(ids):
        eng.reset(); return eng.forward(ids)
    def decode(prompt, n):
        eng.reset(); tok = int(np.argmax(eng.forward(prompt)[0]))
        t = time.perf_counter()
        for _ in range(n):
            tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
        return time.perf_counter() - t
else:
    import torch
    from transformers import AutoModelForCausalLM
    from ignis.loader.registry import pull
    torch.set_num_threads(threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[case.split()[1]]
    m = AutoModelForCausalLM.from_pretrained(str(pull(model_name, progress=False)), dtype=dtype)
    m.eval()
    vocab = m.config.vocab_size
    @torch.inference_mode()
    def prefill(ids):
        return m(torch.tensor(ids)[None], use_cache=True).logits
    @torch.inference_mode()
    def decode(prompt, n):
        out = m(torch.tensor(prompt)[None], use_cache=True)
        past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        t = time.perf_counter()
        for _ in range(n):
            out = m(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        return time.perf_counter() - t
load = time.perf_counter() - t0
prefill(rng.integers(0, 1000, 8))                   # warm-up: page the weights in
res = {"load_s": load}
for n in %(prefill)s:
    ids = rng.integers(0, 1000, n)
    t = time.perf_counter(); prefill(ids); res[f"prefill{n}"] = n / (time.perf_counter() - t)
res["decode%(decode)d"] = %(decode)d / decode(rng.integers(0, 1000, 16), %(decode)d)
res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(res))
''' % {"prefill": repr(PREFILL), "decode": DECODE}

CASES = ["ignis f32", "ignis q8", "transformers f32", "transformers bf16"]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from ignis import _core
    return f"{cpu}, {os.cpu_count()} cores, ignis kernels {_core.active_kernels()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        skipped = [c for c in cases if c.startswith("transformers")]
        cases = [c for c in cases if not c.startswith("transformers")]
        print(f"skipped (torch/transformers not installed): {', '.join(skipped)}")

    import ignis
    ignis.pull(args.model)
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(args.runs):
        for c in cases:
            out = subprocess.run([sys.executable, "-c", RUNNER, c, args.model, str(args.threads)],
                                 capture_output=True, text=True, timeout=1800)
            if out.returncode != 0:
                raise SystemExit(f"case {c!r} failed:\n{out.stderr[-3000:]}")
            results[c].append(json.loads(out.stdout.strip().splitlines()[-1]))

    print(f"model {args.model}; {machine()}; {args.threads} threads; median of {args.runs} runs, "
          f"a fresh process per run")
    keys = [f"prefill{n}" for n in PREFILL] + [f"decode{DECODE}"]
    med = {c: {k: statistics.median(r[k] for r in rs) for k in keys + ["load_s", "peak_rss_mb"]}
           for c, rs in results.items()}
    base = med.get("ignis f32")
    head = "".join(f"{k + ' tok/s':>18}" for k in keys)
    print(f"{'case':<20}{head}{'load s':>9}{'peak RSS MB':>13}")
    for c in cases:
        row = "".join(f"{med[c][k]:>12.1f}" + (f" ({med[c][k] / base[k]:.2f}x)" if base else "")
                      for k in keys)
        print(f"{c:<20}{row}{med[c]['load_s']:>9.2f}{med[c]['peak_rss_mb']:>13.0f}")
    print("(ratios are against ignis f32 in this run)")
    print(json.dumps({"model": args.model, "threads": args.threads, "medians": med}))


if __name__ == "__main__":
    main()
