"""Model open time: ignis.load versus its peers on the same files, each run in a fresh process.

    python benchmarks/bench_load.py [--model qwen2.5-coder-0.5b-instruct] [--runs 7]

Two figures per case: "open" is timed inside the fresh process after the case's own imports;
"process" is the whole fresh process (interpreter start + imports + open), timed from outside.
The page cache is warm after the first run. Cases:
  ignis open_model      resolve the name, parse config + safetensors header, mmap; touch every tensor
  ignis.load            all of that, plus the tokenizer, the compiled and planned step and the C
                        executor: a model ready to generate (f32 weights, used in place)
  safetensors (numpy)   the official package: safe_open + get_tensor for every tensor (it copies)
  gguf.GGUFReader       the gguf package opening the source GGUF (mmap + metadata/tensor parse)
Prints medians, min/max and the ratio of each peer to ignis.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = {
    "ignis open_model": """
import time, ignis, ignis.loader.resolve
t0 = time.perf_counter()
m = ignis.loader.resolve.open_model({model!r}, progress=False)
for k in m.weights:
    m.weights[k].ravel()[:1].sum()           # touch: the view must be usable, not just described
t1 = time.perf_counter()
print(t1 - t0)
""",
    "ignis.load": """
import time, ignis, ignis.loader.resolve, ignis.api.model, ignis.runtime.engine
t0 = time.perf_counter()
m = ignis.load({model!r}, progress=False)
t1 = time.perf_counter()
print(t1 - t0)
""",
    "safetensors (numpy)": """
import time
from safetensors import safe_open
from ignis.loader.registry import model_dir
path = str(model_dir({model!r}) / "model.safetensors")
t0 = time.perf_counter()
with safe_open(path, framework="numpy") as f:
    for k in f.keys():
        f.get_tensor(k)
t1 = time.perf_counter()
print(t1 - t0)
""",
    "gguf.GGUFReader": """
import time, gguf
from ignis.loader.registry import gguf_path
t0 = time.perf_counter()
r = gguf.GGUFReader(str(gguf_path({model!r})))
n = len(r.tensors)
t1 = time.perf_counter()
print(t1 - t0)
""",
}


def run_once(code: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"benchmark case failed:\n{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1]), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    import ignis
    ignis.pull(args.model)                         # not timed: make sure it is imported

    opens: dict[str, list[float]] = {name: [] for name in CASES}
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):                      # interleaved, so drift hits every case alike
        for name, code in CASES.items():
            t_open, t_wall = run_once(code.format(model=args.model))
            opens[name].append(t_open)
            walls[name].append(t_wall)

    print(f"model {args.model}, {args.runs} runs each, a fresh process per run")
    for title, times in (("open, after imports", opens), ("whole process", walls)):
        base = statistics.median(times["ignis open_model"])
        print(f"\n{title} (median, min, max, ratio to ignis open_model):")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:<22} {med * 1000:>8.1f}ms {min(ts) * 1000:>8.1f}ms "
                  f"{max(ts) * 1000:>8.1f}ms {med / base:>7.1f}x")
    if args.json:
        print(json.dumps({"open": {k: statistics.median(v) for k, v in opens.items()},
                          "process": {k: statistics.median(v) for k, v in walls.items()}}))


if __name__ == "__main__":
    main()
