"""Instructions the aarch64 matmuls execute per weight row x 32-weight block x activation row, each
NEON table against the portable twin (the generic table, as gcc -O3 compiles and vectorizes it),
counted under qemu-aarch64 -singlestep: a count of work, not a time (this machine is x86; no ARM
speed is measured here). Each figure is a difference of four runs of tests/c/kernel_check.c
--count (N = 16 and 32 rows, with and without the matmul), so setup, thread start-up and the
activation quantization cancel out.

Usage: python benchmarks/neon_icount.py [--K 256]   (needs aarch64-linux-gnu-gcc and qemu-user)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

FORMATS = ["f32", "bf16", "q8", "q4", "x16/Q8_0", "x16/Q5_0", "x16/Q4_1", "x16/Q5_1", "x16/Q4_K",
           "x16/Q5_K", "x16/Q6_K", "x16/Q3_K", "x16/Q2_K"]
TABLES = ["generic", "neon", "neon_dotprod", "neon_i8mm"]


def count(exe: Path, sysroot: str, table: str, fmt: str, T: int, N: int, K: int, run: int) -> int:
    cmd = ["qemu-aarch64", "-L", sysroot, "-cpu", "max", "-singlestep", "-d", "exec,nochain",
           "-D", "/dev/stderr", str(exe), "--count", table, fmt, str(T), str(N), str(K), str(run)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return sum(1 for line in p.stderr.splitlines() if line.startswith("Trace"))


def per_block(exe: Path, sysroot: str, table: str, fmt: str, T: int, K: int) -> float:
    c = {(n, r): count(exe, sysroot, table, fmt, T, n, K, r) for n in (16, 32) for r in (0, 1)}
    extra = (c[32, 1] - c[32, 0]) - (c[16, 1] - c[16, 0])
    return extra / (16 * (K // 32) * T)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, default=256)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    from test_c_driver import build_driver
    cc = "aarch64-linux-gnu-gcc"
    libc = subprocess.run([cc, "-print-file-name=libc.so.6"], capture_output=True, text=True).stdout
    sysroot = str(Path(libc.strip()).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(cc, "aarch64", Path(tmp), [])
        jobs = {}
        with ThreadPoolExecutor(args.jobs) as pool:
            for fmt in FORMATS:
                for T in (1, 4):
                    for table in TABLES:
                        if table == "neon_i8mm" and (T == 1 or fmt in ("f32", "bf16")):
                            continue          # the same code as neon_dotprod there
                        jobs[fmt, T, table] = pool.submit(per_block, exe, sysroot, table, fmt, T, args.K)
        res = {k: f.result() for k, f in jobs.items()}
    print(f"instructions per weight row x 32-weight block x activation row (K={args.K}, "
          f"qemu-aarch64 -cpu max -singlestep)")
    print("| format | T | generic | neon | neon_dotprod | neon_i8mm | generic / best |")
    print("|---|---|---|---|---|---|---|")
    for fmt in FORMATS:
        for T in (1, 4):
            row = [res.get((fmt, T, t)) for t in TABLES]
            best = min(v for v in row[1:] if v is not None)
            cells = ["—" if v is None else f"{v:.1f}" for v in row]
            print(f"| {fmt} | {T} | " + " | ".join(cells) + f" | {row[0] / best:.1f}x |")


if __name__ == "__main__":
    main()
