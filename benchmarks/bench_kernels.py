"""Kernel-level speed: GB/s of weights streamed per GEMV (decode) shape, GFLOP/s per GEMM (prefill)
shape, for every weight format, with the matmul the executor calls (ignis._core.matmul; for the
GGUF block types weight_format="gguf" reads in place, ignis._core.matmul_x16).

    python benchmarks/bench_kernels.py [--threads 2] [--kernels avx512_vnni] [--repeat 20]

Shapes are Qwen2.5-Coder-0.5B's: q/o projections (896x896), gate/up (4864x896), down (896x4864),
lm_head (151936x896). A GEMV reads the whole matrix once, so bytes-of-weights / time is the
bandwidth it reaches; the streaming-read bound of the machine is printed beside it (a plain
memory read of a buffer as large as the lm_head, numpy sum over uint64). Medians of --repeat calls.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ignis import _core  # noqa: E402
from ignis.formats import gguf_blocks  # noqa: E402
from ignis.formats.bf16 import f32_to_bf16  # noqa: E402
from ignis.formats.quant import pack_q4, pack_q8, quantize_q4, quantize_q8  # noqa: E402

SHAPES = [("attn q/o", 896, 896), ("ffn gate/up", 4864, 896), ("ffn down", 896, 4864),
          ("lm_head", 151936, 896)]
GEMM_T = (32, 128)


# the GGUF block types weight_format="gguf" reads in place (x16 kernels), per shape
GGUF_TYPES = {"attn q/o": ("Q5_0",), "ffn gate/up": ("Q5_0",), "ffn down": ("Q4_K", "Q6_K"),
              "lm_head": ("Q8_0",)}


def _gguf_layout(qtype: str, w: np.ndarray, rng: np.random.Generator) -> gguf_blocks.Layout:
    """w in a GGUF block type (the gguf package's quantizer; random valid blocks for the K-quants,
    which it cannot make), laid out for the x16 kernels."""
    import gguf
    n, k = w.shape
    if qtype in ("Q8_0", "Q5_0"):
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    else:
        per, size = gguf_blocks.BLOCK_BYTES[qtype]
        raw = rng.integers(0, 256, (n * k // per, size), dtype=np.uint8)
        d = rng.uniform(1e-3, 2e-2, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        if qtype == "Q6_K":
            raw[:, -2:] = d
        else:
            raw[:, 0:2] = raw[:, 2:4] = d
    return gguf_blocks.gguf_weight_layout(raw.reshape(n, -1), qtype, (n, k))


def _weights(fmt: str, w: np.ndarray):
    if fmt == "f32":
        return w
    if fmt == "bf16":
        return f32_to_bf16(w)
    if fmt == "q4":
        return pack_q4(quantize_q4(w))
    return pack_q8(quantize_q8(w))


def _time(fn, repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def stream_bound(repeat: int) -> float:
    """GB/s of a plain sequential read of 600 MB (numpy, one thread per core via chunks)."""
    buf = np.ones(600 * 2**20 // 8, np.uint64)
    t = _time(lambda: buf.sum(), max(3, repeat // 4))
    return buf.nbytes / t / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--kernels", default=None, help="kernel table (default: the active one)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    kt = args.kernels or _core.active_kernels()
    rng = np.random.default_rng(0)
    print(f"kernel table {kt}, {args.threads} threads; median of {args.repeat}")
    print(f"plain numpy read (one core): {stream_bound(args.repeat):.1f} GB/s")
    print(f"{'shape':<14}{'N x K':>14}{'fmt':>10}{'GEMV GB/s':>11}{'GEMV ms':>9}"
          + "".join(f"{'T=' + str(t) + ' GFLOP/s':>15}" for t in GEMM_T))
    for name, n, k in SHAPES:
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        for fmt in ("f32", "bf16", "q8", "q4") + tuple("gguf " + q for q in GGUF_TYPES[name]):
            if fmt.startswith("gguf"):
                lay = _gguf_layout(fmt.split()[1], w, rng)
                nbytes = lay.packed.nbytes
                run = lambda o, x: _core.matmul_x16(o, x, lay, threads=args.threads, kernels=kt)  # noqa: E731
            else:
                wf = _weights(fmt, w)
                nbytes = wf.nbytes
                run = lambda o, x: _core.matmul(o, x, wf, fmt=fmt, threads=args.threads,  # noqa: E731
                                                kernels=kt)
            x1 = rng.standard_normal((1, k)).astype(np.float32)
            o1 = np.empty((1, n), np.float32)
            t1 = _time(lambda: run(o1, x1), args.repeat)
            row = f"{name:<14}{f'{n}x{k}':>14}{fmt:>10}{nbytes / t1 / 1e9:>11.1f}{t1 * 1e3:>9.2f}"
            for T in GEMM_T:
                if n > 20000:
                    row += f"{'-':>15}"
                    continue
                x = rng.standard_normal((T, k)).astype(np.float32)
                o = np.empty((T, n), np.float32)
                tt = _time(lambda: run(o, x), max(3, args.repeat // 4))
                row += f"{2 * T * n * k / tt / 1e9:>15.1f}"
            print(row)

if __name__ == "__main__":
    main()
