"""The q8 and q4 weight formats: blocks of 32 weights with one scale (w = d * q), made at load.

quantize_q8 / quantize_q4 return the blocks as records of the C struct ig_block_q8 (csrc/ignis.h:
a 4-byte scale then 32 int8, 36 bytes); pack_q8 / pack_q4 lay them out for the kernels, with the
scales stored as IEEE half, so the quantizers round every scale to a half first and then the
integers against it. q8: rounding to nearest even, scale max|w|/127, so no integer is -128 (the
integer dot kernels rely on that).

Weights that came from a GGUF file are often already on a coarser grid: a Q5_0 block is d*k with
k in -16..15 (its largest magnitude always -16*d), a Q4_0 block d*k with k in -8..7. Such a block is
stored exactly, as scale max|w|/16 (or /8) and the integer k, so converting those files to q8 loses
nothing; Q8_0 blocks are exact with the usual /127 scale. Blocks on no such grid (f32 checkpoints,
K-quants with per-sub-block scales or offsets) get the usual rounding.
"""
from __future__ import annotations

import numpy as np

from ..errors import RuntimeInputError

QK = 32
GRIDS = (16, 8)          # k_max of the GGUF block formats whose blocks convert exactly (Q5_0, Q4_0)
Q8_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK,))])
assert Q8_BLOCK.itemsize == 36


def quantize_q8(w: np.ndarray, *, rows_per_chunk: int = 4096) -> np.ndarray:
    """[N, K] float weights (K a multiple of 32) -> [N, K/32] q8 blocks. Works in row chunks so a
    large mmap'd matrix is never copied whole."""
    n, k = _check_matrix(w, "q8")
    out = np.empty((n, k // QK), Q8_BLOCK)
    for r in range(0, n, rows_per_chunk):
        blk = np.asarray(w[r:r + rows_per_chunk], np.float32).reshape(-1, k // QK, QK)
        amax = np.abs(blk).max(axis=-1)
        d = _half(amax / np.float32(127))
        with np.errstate(divide="ignore", invalid="ignore"):
            qs = np.clip(np.rint(np.where(d[..., None] > 0, blk / d[..., None], 0)), -127, 127)
        exact = _exact(blk, d, qs) | (amax == 0)
        for m in GRIDS:
            if exact.all():
                break
            dm = _half(amax / np.float32(m))
            with np.errstate(divide="ignore", invalid="ignore"):
                km = np.rint(blk / dm[..., None])
            hit = ~exact & _exact(blk, dm, km) & (np.abs(km).max(axis=-1) <= 127)
            d = np.where(hit, dm, d)
            qs = np.where(hit[..., None], km, qs)
            exact |= hit
        out["d"][r:r + rows_per_chunk] = d
        out["qs"][r:r + rows_per_chunk] = qs.astype(np.int8)
    return out


def quantize_activations(x: np.ndarray) -> np.ndarray:
    """[T, K] activations -> [T, K/32] blocks exactly as the executor quantizes them before a q8 or
    q4 matmul (ig_quantize_q8_rows_ref): f32 scale max|x|/127, x * (127/max|x|) rounded to nearest
    even; max|x| compared as bits (a NaN wins, ig_block_amax), and all zeros where 127/max|x| is 0
    or not finite (zero, denormal or tiny maxima, inf or NaN). The NumPy twin, for tests and
    references."""
    blk = np.ascontiguousarray(x, np.float32).reshape(x.shape[0], -1, QK)
    amax = (blk.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=-1).view(np.float32)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.float32(127) / amax
        live = (d > 0) & (inv > 0) & np.isfinite(inv)
        inv = np.where(live, inv, np.float32(0)).astype(np.float32)
        qs = np.where(live[..., None], np.rint(blk * inv[..., None]), 0)
    out = np.empty(blk.shape[:2], Q8_BLOCK)
    out["d"] = d
    out["qs"] = qs.astype(np.int8)
    return out


def _check_matrix(w: np.ndarray, fmt: str) -> tuple[int, int]:
    if w.ndim != 2 or w.shape[1] % QK:
        raise RuntimeInputError(f"{fmt} needs a matrix whose rows are a multiple of {QK} long, got "
                                f"shape {list(w.shape)}; keep this weight in f32")
    return w.shape


def _half(d: np.ndarray) -> np.ndarray:
    """Scales rounded to IEEE half (what the packed formats store), as f32."""
    with np.errstate(over="ignore"):
        return d.astype(np.float16).astype(np.float32)


def _exact(blk: np.ndarray, d: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per block: d * k reproduces every weight bit for bit (what the kernels will multiply by)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.all((k * d[..., None]).astype(np.float32) == blk, axis=-1)


PACK_ROWS = 4              # rows per packed group (csrc/ignis.h, IG_Q8P_ROWS)


def packed_q8_bytes(n: int, k: int) -> int:
    """Bytes of an [n, k] matrix in packed q8 (IG_Q8P_BYTES)."""
    return _packed_bytes(n, k, QK)


def pack_q8(q: np.ndarray) -> np.ndarray:
    """[N, K/32] q8 blocks -> the packed layout the matmul kernels stream (csrc/ignis.h): groups of
    4 rows, each the 4 rows' scales block by block as IEEE half (padded to 64 bytes), then their
    integers block by block, stored plus 128 as u8. The last group is padded with zero rows.
    Exact for blocks from quantize_q8 (their scales are halves already)."""
    return _pack(q, QK, lambda k: (k + 128).astype(np.uint8))


def unpack_q8(p: np.ndarray, n: int, k: int) -> np.ndarray:
    """The packed layout back to [n, k/32] q8 blocks (for tests and inspection)."""
    return _unpack(p, n, k, QK, lambda u: u.astype(np.int16) - 128)


# The packed layout both formats share: groups of PACK_ROWS rows; per group the scales (half,
# block-major, padded to 64 bytes), then per block each row's `row_bytes` encoded integers.

def _scale_bytes(nb: int) -> int:
    return (nb * 8 + 63) // 64 * 64


def _packed_bytes(n: int, k: int, row_bytes: int) -> int:
    nb = k // QK
    return -(-n // PACK_ROWS) * (_scale_bytes(nb) + nb * PACK_ROWS * row_bytes)


def _pack(q: np.ndarray, row_bytes: int, encode) -> np.ndarray:
    """encode: [rows, nb, 32] int16 integers -> [rows, nb, row_bytes] uint8."""
    n, nb = q.shape
    groups = -(-n // PACK_ROWS)
    d = np.zeros((groups * PACK_ROWS, nb), np.float32)
    ks = np.zeros((groups * PACK_ROWS, nb, QK), np.int16)
    d[:n], ks[:n] = q["d"], q["qs"]
    sb = _scale_bytes(nb)
    out = np.zeros((groups, sb + nb * PACK_ROWS * row_bytes), np.uint8)
    out[:, :nb * 8] = d.astype(np.float16).reshape(groups, PACK_ROWS, nb).transpose(0, 2, 1) \
        .reshape(groups, -1).view(np.uint8)
    out[:, sb:] = encode(ks).reshape(groups, PACK_ROWS, nb, row_bytes).transpose(0, 2, 1, 3) \
        .reshape(groups, -1)
    return out.reshape(-1)


def _unpack(p: np.ndarray, n: int, k: int, row_bytes: int, decode) -> np.ndarray:
    """decode: [rows, nb, row_bytes] uint8 -> [rows, nb, 32] integers."""
    nb = k // QK
    groups = -(-n // PACK_ROWS)
    sb = _scale_bytes(nb)
    g = np.asarray(p, np.uint8).reshape(groups, sb + nb * PACK_ROWS * row_bytes)
    d = np.ascontiguousarray(g[:, :nb * 8]).view(np.float16).astype(np.float32) \
        .reshape(groups, nb, PACK_ROWS)
    u = g[:, sb:].reshape(groups, nb, PACK_ROWS, row_bytes).transpose(0, 2, 1, 3) \
        .reshape(-1, nb, row_bytes)
    out = np.empty((groups * PACK_ROWS, nb), Q8_BLOCK)
    out["d"] = d.transpose(0, 2, 1).reshape(-1, nb)
    out["qs"] = decode(u).astype(np.int8)
    return out[:n]


def dequantize_q8(q: np.ndarray) -> np.ndarray:
    """[N, K/32] q8 blocks -> [N, K] f32 (what the kernels multiply with)."""
    return (q["qs"].astype(np.float32) * q["d"][..., None]).reshape(q.shape[0], -1)


# ---- q4: 4-bit blocks, w = d * k with k in -8..7 (packed like q8, csrc/ignis.h) -------------------

_Q4_SCALES = (1.0, 0.96, 0.92, 0.88, 1.04)   # multiples of the Q4_0 scale tried per block


def quantize_q4(w: np.ndarray, *, rows_per_chunk: int = 4096) -> np.ndarray:
    """[N, K] float weights (K a multiple of 32) -> [N, K/32] blocks (Q8_BLOCK records holding
    k in -8..7). The base scale is GGUF Q4_0's (the value of largest magnitude maps to -8), so a
    Q4_0 block converts exactly; a few smaller and larger scales are tried too and the one with
    the least squared error kept, which lowers the error of f32 weights."""
    n, k = _check_matrix(w, "q4")
    out = np.empty((n, k // QK), Q8_BLOCK)
    for r in range(0, n, rows_per_chunk):
        blk = np.asarray(w[r:r + rows_per_chunk], np.float32).reshape(-1, k // QK, QK)
        idx = np.abs(blk).argmax(axis=-1)
        signed_max = np.take_along_axis(blk, idx[..., None], axis=-1)[..., 0]
        base = signed_max / np.float32(-8)
        best_d = best_k = best_err = None
        for s in _Q4_SCALES:
            d = _half((base * np.float32(s)).astype(np.float32))
            with np.errstate(divide="ignore", invalid="ignore"):
                kq = np.clip(np.rint(np.where(d[..., None] != 0, blk / d[..., None], 0)), -8, 7)
            err = ((kq * d[..., None] - blk) ** 2).sum(axis=-1)
            if best_err is None:
                best_d, best_k, best_err = d, kq, err
            else:
                better = err < best_err
                best_d = np.where(better, d, best_d)
                best_k = np.where(better[..., None], kq, best_k)
                best_err = np.minimum(err, best_err)
        out["d"][r:r + rows_per_chunk] = best_d
        out["qs"][r:r + rows_per_chunk] = best_k.astype(np.int8)
    return out


def packed_q4_bytes(n: int, k: int) -> int:
    """Bytes of an [n, k] matrix in packed q4 (IG_Q4P_BYTES)."""
    return _packed_bytes(n, k, 16)


def pack_q4(q: np.ndarray) -> np.ndarray:
    """[N, K/32] blocks with k in -8..7 -> packed q4 (csrc/ignis.h): groups of 4 rows, the scales
    block by block as IEEE half (padded to 64 bytes), then per block and row 16 bytes, byte i holding
    k[i] + 8 in its low nibble and k[i + 16] + 8 in its high one."""
    if q["qs"].size and (q["qs"].min() < -8 or q["qs"].max() > 7):
        raise RuntimeInputError("q4 blocks hold integers in -8..7")

    def nibbles(ks: np.ndarray) -> np.ndarray:
        u = (ks + 8).astype(np.uint8)
        return u[..., :16] | (u[..., 16:] << 4)
    return _pack(q, 16, nibbles)


def unpack_q4(p: np.ndarray, n: int, k: int) -> np.ndarray:
    """Packed q4 back to [n, k/32] blocks (for tests and inspection)."""
    return _unpack(p, n, k, 16,
                   lambda nib: np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int16) - 8)
