"""Decode against the memory-bandwidth bound, on a busy computer, and from process to process.

    python benchmarks/bench_threads.py [--model qwen2.5-coder-0.5b-instruct] [--runs 3]
                                       [--parts bound,busy,spread] [--compare /work/main]
                                       [--formats f32,q8,q4,gguf]

bound   read bandwidth of this machine (benchmarks/read_bw.c: 4 streams per thread, 64-byte loads,
        prefetch, over 1 GB of 2 MB pages; the best of 5 passes) at 1 and 2 threads, and decode
        tok/s per weight format at 1 and 2 threads as a fraction of the bound: tok/s x bytes of
        weights the matmuls read per token / GB/s, each decode process against the read bandwidth
        at its thread count measured just before and just after it (--formats: which ones).
busy    one busy loop (a second process spinning, placed by the scheduler): gguf decode with the
        default thread count, --threads 1 and 2. The default must not be slower than one thread.
        Each process's line shows the pool's counters over its timed steps (jobs on several
        threads, jobs run reduced, late joins, backoffs and why).
spread  gguf decode in 10 fresh processes at the default thread count: min / median / max,
        with the packed weights on 2 MB pages (the default) and left in the mmapped cache
        (IGNIS_HUGEPAGES=0), and how many jobs of each process the pool ran on fewer threads.
Every decode runs in a fresh process: load, a warm-up, then 128 greedy steps after a 16-token
prompt, the KV cache stored as ignis.load stores it (kv_dtype "auto": f16 on the x86 tables;
the bound table's KV column). --compare DIR runs the same decode cases with the ignis checkout in DIR too (say, main
before this change), interleaved run by run, and prints the ratio. Medians unless said otherwise.
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FORMATS = ("f32", "q8", "q4", "gguf")

# the pool's counters over the timed steps (an older checkout may lack some)
POOL_COUNTS = ("jobs", "reduced_jobs", "late_joins", "backoffs", "failed_probes", "slow_probes",
               "shared_windows", "entered", "sleeps")

RUNNER = r'''
import json, sys, time
from pathlib import Path
import numpy as np
from ignis import _core
from ignis.runtime.engine import Engine, _matmul_weights
from ignis.loader.resolve import open_model
fmt, model, threads, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
files = open_model(model, progress=False)
eng = Engine(files, n_ctx=1024, threads=None if threads == "default" else int(threads),
             weight_format=fmt, kv_dtype="auto")
tape = eng.step_info.tape
mm = _matmul_weights(tape, eng._weights)
nbytes = sum(p[2].nbytes if p is not None else eng._weights[i].nbytes
             for i, p in enumerate(eng._packed) if i in mm)
prompt = np.arange(100, 116)
tok = int(np.argmax(eng.forward(prompt)[0]))
for _ in range(8):
    tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
eng.reset()
tok = int(np.argmax(eng.forward(prompt)[0]))
s0 = _core.pool_stats()
t = time.perf_counter()
for _ in range(n):
    tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
dt = time.perf_counter() - t
s1 = _core.pool_stats()
pool = {k: s1[k] - s0[k] for k in POOL_COUNTS if k in s1}
import ignis
print(json.dumps({"tok_s": n / dt, "bytes": nbytes, "threads": eng.options.threads, "pool": pool,
                  "kv": eng.options.kv_dtype,
                  "tree": str(Path(ignis.__file__).parents[1])}))
'''


def decode(tree: Path, fmt: str, model: str, threads: str, env: dict | None = None,
           n: int = 128) -> dict:
    e = dict(os.environ, PYTHONPATH=str(tree), **(env or {}))
    # run in the tree: `python -c` puts the working directory ahead of PYTHONPATH, so started
    # from a checkout's root every --compare case imported that checkout's ignis, not DIR's
    r = subprocess.run([sys.executable, "-c", f"POOL_COUNTS = {POOL_COUNTS!r}\n" + RUNNER, fmt,
                        model, threads, str(n)], env=e, cwd=str(tree),
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"decode {fmt} threads={threads} in {tree} failed:\n{r.stderr[-2000:]}")
    import json
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if Path(out["tree"]).resolve() != tree.resolve():
        raise SystemExit(f"decode meant for {tree} imported ignis from {out['tree']}")
    return out


class ReadBandwidth:
    """read_bw.c compiled here, over one 1 GB buffer of 2 MB pages kept for the whole run, so the
    bound can be measured right beside each decode (this host's bandwidth drifts by a third within
    the hour, and two vCPUs placed on one CCD or on two differ 1.5x: RESULTS.md)."""

    def __init__(self) -> None:
        with tempfile.TemporaryDirectory(prefix="ignis-bw-") as tmp:
            so = Path(tmp) / "read_bw.so"
            cc = os.environ.get("CC", "cc")
            subprocess.run([cc, "-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-o",
                            str(so), str(HERE / "read_bw.c")], check=True)
            self.lib = ctypes.CDLL(str(so))   # mapped: the file can go with its directory
        self.lib.read_gbps.restype = ctypes.c_double
        self.lib.read_gbps.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        self.n, huge = 1 << 30, 2 << 20
        self.buf = mmap.mmap(-1, self.n + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.buf.madvise(mmap.MADV_HUGEPAGE)
        import numpy as np
        a = np.frombuffer(self.buf, np.uint8)
        a[:] = 1
        self.p = a.ctypes.data + (-a.ctypes.data) % huge
        self._keep = a

    def __call__(self, threads: int) -> float:
        """GB/s on `threads` threads: the best of 5 passes."""
        return self.lib.read_gbps(self.p, self.n, threads, 5)


def busy_loop() -> subprocess.Popen:
    """A second process spinning, left to the scheduler (as `python -c "while 1: pass" &`)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parts", default="bound,busy,spread")
    ap.add_argument("--formats", default=",".join(FORMATS), help="weight formats of the bound part")
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="another ignis checkout to run the decode cases with too")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    formats = [f for f in args.formats.split(",") if f]
    if not set(formats) <= set(FORMATS):
        ap.error(f"--formats: each one of {', '.join(FORMATS)}")
    trees = [("this", ROOT)] + ([("compare", Path(args.compare).resolve())] if args.compare else [])

    if "bound" in parts:
        read = ReadBandwidth()
        bw0 = {t: read(t) for t in (1, 2)}
        print(f"read bandwidth at the start: {bw0[1]:.1f} GB/s on 1 thread, {bw0[2]:.1f} GB/s on 2")
        print("each decode against the read bandwidth measured just before and just after it (the mean "
              "of the two);\nmedians over the runs, and the range of the run-by-run fraction")
        print(f"{'tree':<8} {'format':<6} {'thr':>3} {'MB/token':>9} {'tok/s':>7} {'GB/s':>6} "
              f"{'bound':>7} {'of bound':>8} {'range':>11} {'KV':>4}")
        res: dict = {}
        for _ in range(args.runs):
            for fmt in formats:
                for t in (1, 2):
                    for name, tree in trees:
                        before = read(t)
                        r = decode(tree, fmt, args.model, str(t))
                        r["gbps"] = (before + read(t)) / 2
                        res.setdefault((name, fmt, t), []).append(r)
        for fmt in formats:
            for t in (1, 2):
                for name, _ in trees:
                    rs = res[(name, fmt, t)]
                    nb = rs[0]["bytes"]
                    frac = [r["tok_s"] * nb / (r["gbps"] * 1e9) for r in rs]
                    gbps = med([r["gbps"] for r in rs])
                    print(f"{name:<8} {fmt:<6} {t:>3} {nb / 1e6:>9.1f} {med([r['tok_s'] for r in rs]):>7.1f} "
                          f"{gbps:>6.1f} {gbps * 1e9 / nb:>7.1f} {med(frac):>7.0%} "
                          f"{min(frac):>5.0%}-{max(frac):.0%}".ljust(11) + f" {rs[0].get('kv', '?'):>4}")

    if "busy" in parts:
        print("\ngguf decode beside a busy loop (tok/s; pool counters over the timed steps):")
        res = {}
        hog = busy_loop()
        try:
            for run in range(args.runs):
                for t in ("default", "1", "2"):
                    for name, tree in trees:
                        r = decode(tree, "gguf", args.model, t)
                        res.setdefault((name, t), []).append(r["tok_s"])
                        pool = " ".join(f"{k}={v}" for k, v in r.get("pool", {}).items())
                        print(f"  run {run} {name:<8} {t:>7} {r['tok_s']:6.1f}   {pool}", flush=True)
        finally:
            hog.kill()
            hog.wait()
        print("  min / median / max:")
        for name, _ in trees:
            d, one, two = (res[(name, t)] for t in ("default", "1", "2"))
            mmm = lambda xs: f"{min(xs):5.1f} /{med(xs):6.1f} /{max(xs):6.1f}"  # noqa: E731
            print(f"  {name:<8} default {mmm(d)}   --threads 1 {mmm(one)}   --threads 2 {mmm(two)}"
                  f"   default / one thread {med(d) / med(one):.2f} (runs: "
                  + " ".join(f"{a / b:.2f}" for a, b in zip(d, one)) + ")")

    if "spread" in parts:
        print("\ngguf decode over 10 fresh processes (tok/s):")
        cases = [("this", ROOT, {}), ("this, IGNIS_HUGEPAGES=0", ROOT, {"IGNIS_HUGEPAGES": "0"})]
        cases += [("compare", tree, {}) for name, tree in trees if name == "compare"]
        res, reduced = {}, {}
        for _ in range(10):
            for name, tree, env in cases:
                r = decode(tree, "gguf", args.model, "default", env)
                res.setdefault(name, []).append(r["tok_s"])
                reduced.setdefault(name, []).append(r.get("pool", {}).get("reduced_jobs", 0))
        for name, _, _ in cases:
            xs = res[name]
            print(f"  {name:<26} min {min(xs):6.1f}  median {med(xs):6.1f}  max {max(xs):6.1f}  "
                  f"(max/min {max(xs) / min(xs):.2f})  jobs run reduced per process: "
                  + " ".join(map(str, reduced[name])))


if __name__ == "__main__":
    main()
