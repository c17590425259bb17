"""A compiled model (ignis compile) beside the Python path: compile time, library size, time to
first token from process start, decode speed.

    python benchmarks/bench_native.py [--model qwen2.5-coder-0.5b-instruct] [--weights auto]
                                      [--runs 5] [--decode 64] [--dir DIR]

Compiles the model into DIR (a temporary directory by default; timed once), builds
benchmarks/native_ttft.c against the library, then runs fresh processes, interleaved run by run:
  native   the C program (native_ttft.c): ignis_open + greedy ids of the prompt until the first
           token; then decode speed from two warm calls (1 and --decode ids from the prompt)
  python   python -c: import ignis, ignis.load (weights already imported and converted, as after a
           first use) and Model.generate(ids, max_tokens=1, temperature=0); then decode speed from
           a --decode token generate (its generate_seconds: the prompt is cached)
Time to first token is the wall time the parent sees from starting the process to reading the
first token's line; open/load and first-token times are measured inside. Both run the same prompt
ids (a chat prompt), weight format, KV storage and default thread count. Medians.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MESSAGES = [{"role": "user", "content": "Write a Python function that checks whether a string is a "
                                        "palindrome, ignoring case and punctuation."}]

RUNNER = r'''
import sys, time
t0 = time.perf_counter()
import ignis
model, fmt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = [int(x) for x in sys.argv[4:]]
m = ignis.load(model, weight_format=fmt, progress=False)
t1 = time.perf_counter()
r = m.generate(ids, max_tokens=1, temperature=0)
t2 = time.perf_counter()
print(f"first {r.token_ids[0]} open_ms {(t1 - t0) * 1e3:.1f} "
      f"first_ms {(t2 - t1) * 1e3:.1f}", flush=True)
if n > 1:
    r = m.generate(ids, max_tokens=n, temperature=0)
    # generate_seconds: from the first sampled token to the end (the prompt was cached)
    print(f"decode {len(r.token_ids) - 1} ms {r.generate_seconds * 1e3:.1f}")
'''


def run(cmd, env=None) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = p.stdout.readline()
    ttft = (time.perf_counter() - t0) * 1e3
    rest, err = p.communicate()
    if p.returncode != 0 or not first.startswith("first"):
        raise SystemExit(f"{cmd[0]} failed: {err[-2000:]}")
    f = first.split()
    out = {"ttft_ms": ttft, "open_ms": float(f[3]), "first_ms": float(f[5])}
    for line in rest.splitlines():
        if line.startswith("decode"):
            d = line.split()
            out["decode_n"], out["decode_ms"] = int(d[1]), float(d[3])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--dir", default=None, help="compile into DIR (kept) instead of a temporary one")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import ignis
    from ignis.native import compile_model

    tmp = None
    out_dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ignis-native-"))
    try:
        r = compile_model(args.model, out_dir / "model", weights=args.weights, progress=False)
        print(f"compile: {r.seconds:.1f} s; library {r.library_bytes / 2**20:.2f} MB without weights; "
              f"weights.bin {r.weights_bytes / 2**20:.0f} MB ({r.weight_format})")
        cc = os.environ.get("CC", "cc")
        exe = out_dir / "native_ttft"
        lib = r.library.name[3:].rsplit(".", 1)[0]
        subprocess.run([cc, "-O2", str(HERE / "native_ttft.c"), f"-I{r.directory}", f"-L{r.directory}",
                        f"-l{lib}", f"-Wl,-rpath,{r.directory}", "-o", str(exe)], check=True)
        m = ignis.load(args.model, weight_format=r.weight_format, progress=False)
        ids = m.chat_prompt_ids(MESSAGES)
        del m
        ids_s = [str(i) for i in ids]
        cases = {
            "native": [str(exe), str(r.directory), str(args.decode), *ids_s],
            "python": [sys.executable, "-c", RUNNER, args.model, r.weight_format, str(args.decode), *ids_s],
        }
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        got: dict[str, list[dict]] = {k: [] for k in cases}
        for _ in range(args.runs):
            for name, cmd in cases.items():
                got[name].append(run(cmd, env))
        print(f"prompt {len(ids)} tokens; {args.runs} fresh processes per case, medians")
        print(f"{'case':8} {'ttft ms':>9} {'open/load ms':>13} {'first tok ms':>13} {'decode tok/s':>13}")
        med = {}
        for name, rows in got.items():
            m_ = {k: statistics.median(r_[k] for r_ in rows) for k in rows[0]}
            med[name] = m_
            tps = ""
            if "decode_ms" in m_:
                tps = f"{m_['decode_n'] / m_['decode_ms'] * 1e3:.1f}"
            print(f"{name:8} {m_['ttft_ms']:9.0f} {m_['open_ms']:13.0f} {m_['first_ms']:13.0f} {tps:>13}")
        print(f"native/python time to first token: {med['native']['ttft_ms'] / med['python']['ttft_ms']:.2f}x; "
              f"open+first token: {(med['native']['open_ms'] + med['native']['first_ms']) / (med['python']['open_ms'] + med['python']['first_ms']):.2f}x")
    finally:
        if not args.dir:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
