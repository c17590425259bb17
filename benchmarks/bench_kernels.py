"""Kernel-level speed: GB/s of weights streamed per GEMV (decode) shape, GFLOP/s per GEMM (prefill)
shape, for every weight format, with the matmul the executor calls (ignis._core.matmul; for the
GGUF block types weight_format="gguf" reads in place, ignis._core.matmul_x16).

    python benchmarks/bench_kernels.py [--threads 2] [--kernels avx512_vnni] [--repeat 20]
    python benchmarks/bench_kernels.py --model FILE.gguf [--threads 1,2] [--repeat 10]
    python benchmarks/bench_kernels.py --roof [--prefill FILE.gguf] [--rows 512] [--threads 1,2]

--roof: the compute roof (vnni_roof.c): 512-bit vpdpbusd, vpdpwssd and vdpbf16ps retired per second
with the operands in registers, one thread and every thread at once, as GOPS per core (a multiply
and an add per product: vpdpbusd 128 operations, vpdpwssd and vdpbf16ps 64). With --prefill, every
distinct prefill GEMM shape of that GGUF file (its matmul weights but the output projection, which
a prefill runs for the last row only) as weight_format="gguf" runs it: --rows activation rows (the
x16 quantization included), GOPS (2 x rows x N x K / time) and the fraction of the vpdpbusd roof of
as many cores. The x16 kernels make two vpdpbusd per product (16-bit activations), so 50% of that
roof is their ceiling; the vpdpwssd column is the roof for 16-bit x 16-bit products.

--model: the decode GEMVs of one GGUF file, as weight_format="gguf" runs it: every matmul weight of
the file in its x16 layout (the tied embedding as the output projection), in one huge-page buffer
like the engine's, called one after another with one activation row, as a decode step does. Per
GGUF block type: MB read per token, ms per token, GB/s; the whole pass's tok/s if decode were only
these matmuls; and the read bandwidth of the machine (read_bw.c) measured in the same run.

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


def _file_layouts(path: str) -> list[tuple[str, str, gguf_blocks.Layout, int, int]]:
    """(name, GGUF type, x16 layout, N, K) of every matmul weight of a GGUF file, in file order (the
    token embedding only when it is also the output projection, as it is when no output.weight)."""
    import gguf
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    out = []
    for t in r.tensors:
        if len(t.shape) != 2 or t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        k, n = (int(v) for v in t.shape)
        raw = np.asarray(t.data).reshape(n, -1)
        out.append((t.name, t.tensor_type.name, gguf_blocks.gguf_weight_layout(raw, t.tensor_type.name,
                                                                              (n, k)), n, k))
    return out


def _huge_copy(layouts):
    """The layouts' bytes moved into one anonymous mapping with huge pages (as the engine keeps its
    weights), each 64-byte aligned."""
    import mmap
    total = sum(-(-lay.packed.nbytes // 64) * 64 for _, _, lay, _, _ in layouts) + (2 << 20)
    buf = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(buf, np.uint8)
    off = (-a.ctypes.data) % 64
    moved = []
    for name, q, lay, n, k in layouts:
        v = a[off:off + lay.packed.nbytes]
        v[:] = lay.packed
        moved.append((name, q, gguf_blocks.Layout(lay.fmt, v), n, k))
        off += -(-lay.packed.nbytes // 64) * 64
    return moved, buf


def model_decode(path: str, threads: list[int], repeat: int, kt: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_threads import ReadBandwidth
    layouts, _buf = _huge_copy(_file_layouts(path))
    rng = np.random.default_rng(0)
    xs = {k: rng.standard_normal((1, k)).astype(np.float32) for k in {k for *_, k in layouts}}
    outs = [np.empty((1, n), np.float32) for _, _, _, n, _ in layouts]
    read = ReadBandwidth()
    bw = {t: read(t) for t in (1, 2)}
    print(f"{Path(path).name}: {len(layouts)} matmul weights, kernel table {kt}, median of {repeat} passes")
    print("read bandwidth (read_bw.c): " + ", ".join(f"{t} thread{'s' * (t > 1)} {g:.1f} GB/s"
                                                      for t, g in bw.items()))
    types = sorted({q for _, q, *_ in layouts})
    for th in threads:
        calls = [(lambda o=o, x=xs[k], lay=lay: _core.matmul_x16(o, x, lay, threads=th, kernels=kt))
                 for (_, _, lay, _, k), o in zip(layouts, outs)]
        per = [[] for _ in calls]
        whole = []
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            for i, c in enumerate(calls):
                t = time.perf_counter()
                c()
                per[i].append(time.perf_counter() - t)
            whole.append(time.perf_counter() - t0)
        per = [statistics.median(p[1:]) for p in per]
        total_b = sum(lay.packed.nbytes for _, _, lay, _, _ in layouts)
        t_pass = statistics.median(whole[1:])
        print(f"\n{th} thread{'s' * (th > 1)}: pass {t_pass * 1e3:.2f} ms = {1 / t_pass:.1f} tok/s "
              f"matmuls only, {total_b / 1e6:.1f} MB, {total_b / t_pass / 1e9:.1f} GB/s "
              f"({total_b / t_pass / 1e9 / bw.get(th, bw[max(bw)]) * 100:.0f}% of the read bandwidth)")
        print(f"{'type':<8}{'shape N x K':>16}{'calls':>7}{'MB':>9}{'ms/token':>10}{'GB/s':>8}")
        groups: dict[tuple[str, int, int], list[int]] = {}
        for i, (_, q, _, n, k) in enumerate(layouts):
            groups.setdefault((q, n, k), []).append(i)
        for (q, n, k), idx in sorted(groups.items(), key=lambda kv: -sum(per[i] for i in kv[1])):
            b = sum(layouts[i][2].packed.nbytes for i in idx)
            t = sum(per[i] for i in idx)
            print(f"{q:<8}{f'{n} x {k}':>16}{len(idx):>7}{b / 1e6:>9.1f}{t * 1e3:>10.3f}{b / t / 1e9:>8.1f}")
        for q in types:
            idx = [i for i, l in enumerate(layouts) if l[1] == q]
            b = sum(layouts[i][2].packed.nbytes for i in idx)
            t = sum(per[i] for i in idx)
            print(f"  {q:<8} all: {b / 1e6:7.1f} MB  {t * 1e3:7.3f} ms  {b / t / 1e9:6.1f} GB/s")


ROOF_OPS = {"vpdpbusd": 128, "vpdpwssd": 64, "vdpbf16ps": 64}   # operations per 512-bit instruction


def roof(threads: list[int]) -> dict[tuple[str, int], float]:
    """GOPS per core of each dot instruction, at each thread count (vnni_roof.c, compiled here)."""
    import ctypes
    import subprocess
    import tempfile
    so = Path(tempfile.mkdtemp(prefix="ignis-roof-")) / "vnni_roof.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-march=native", "-shared", "-fPIC", "-pthread", "-o", str(so),
                    str(Path(__file__).resolve().parent / "vnni_roof.c")], check=True)
    lib = ctypes.CDLL(str(so))
    lib.roof_insn_per_s.restype = ctypes.c_double
    lib.roof_insn_per_s.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]
    out = {}
    for which, (name, ops) in enumerate(ROOF_OPS.items()):
        for th in threads:
            rate = statistics.median(lib.roof_insn_per_s(which, 1_000_000, th) for _ in range(3))
            out[name, th] = rate * ops / 1e9
    return out


def prefill_roofline(path: str | None, threads: list[int], rows: int, repeat: int, kt: str) -> None:
    r = roof(threads)
    print(f"compute roof (vnni_roof.c), GOPS per core; kernel table {kt}")
    print(f"{'instruction':<12}" + "".join(f"{f'{t} thread' + 's' * (t > 1):>12}" for t in threads))
    for name in ROOF_OPS:
        print(f"{name:<12}" + "".join(f"{r[name, t]:>12.0f}" for t in threads))
    if not path:
        return
    layouts = [lay for lay in _file_layouts(path) if not lay[0].startswith(("output.", "token_embd."))]
    shapes: dict[tuple[str, int, int], tuple[gguf_blocks.Layout, int]] = {}
    for _, q, lay, n, k in layouts:
        shapes[q, n, k] = (lay, shapes.get((q, n, k), (lay, 0))[1] + 1)
    rng = np.random.default_rng(0)
    print(f"\n{Path(path).name}: prefill GEMMs, {rows} rows, median of {repeat}; % of the vpdpbusd roof "
          f"of as many cores (x16's ceiling: 50%)")
    print(f"{'type':<6}{'N x K':>13}{'calls':>6}" + "".join(f"{f'{t}T ms':>9}{f'{t}T GOPS':>10}{f'{t}T roof':>9}"
                                                          for t in threads))
    total = {t: 0.0 for t in threads}
    ops_all = 0.0
    for (q, n, k), (lay, calls) in sorted(shapes.items(), key=lambda kv: (kv[0][1] * kv[0][2], kv[0][0])):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        o = np.empty((rows, n), np.float32)
        ops = 2.0 * rows * n * k
        ops_all += ops * calls
        row = f"{q:<6}{f'{n}x{k}':>13}{calls:>6}"
        for t in threads:
            s = _time(lambda: _core.matmul_x16(o, x, lay, threads=t, kernels=kt), repeat)
            total[t] += s * calls
            row += f"{s * 1e3:>9.2f}{ops / s / 1e9:>10.0f}{ops / s / 1e9 / (t * r['vpdpbusd', t]):>9.1%}"
        print(row)
    print(f"{'all':<6}{'':>13}{len(layouts):>6}" + "".join(
        f"{total[t] * 1e3:>9.1f}{ops_all / total[t] / 1e9:>10.0f}"
        f"{ops_all / total[t] / 1e9 / (t * r['vpdpbusd', t]):>9.1%}" for t in threads))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=None,
                    help="threads (default: all cores); with --model a list, default 1,2")
    ap.add_argument("--kernels", default=None, help="kernel table (default: the active one)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--model", default=None, help="a GGUF file: its decode GEMVs, per block type")
    ap.add_argument("--roof", action="store_true", help="the compute roof (vnni_roof.c)")
    ap.add_argument("--prefill", default=None, metavar="FILE.gguf",
                    help="with --roof: that file's prefill GEMMs as a fraction of the roof")
    ap.add_argument("--rows", type=int, default=512, help="activation rows of --prefill's GEMMs")
    args = ap.parse_args()
    kt = args.kernels or _core.active_kernels()
    if args.roof:
        ths = [int(t) for t in str(args.threads).split(",")] if args.threads else [1, 2]
        return prefill_roofline(args.prefill, ths, args.rows, min(args.repeat, 5), kt)
    if args.model:
        ths = [int(t) for t in str(args.threads).split(",")] if args.threads else [1, 2]
        return model_decode(args.model, ths, args.repeat, kt)
    rng = np.random.default_rng(0)
    args.threads = int(args.threads or os.cpu_count() or 1)
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
