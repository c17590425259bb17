"""The q8 weight format: blocks of 32 int8 weights with one f32 scale (w = d * q), made at load.

The layout is the C struct ig_block_q8 (csrc/ignis.h): 4-byte scale then 32 int8, 36 bytes.
Rounding is to nearest even, the scale max|w|/127, so no quantized value is -128 (the integer dot
kernels rely on that).
"""
from __future__ import annotations

import numpy as np

from .errors import RuntimeInputError

QK = 32
Q8_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK,))])
assert Q8_BLOCK.itemsize == 36


def quantize_q8(w: np.ndarray, *, rows_per_chunk: int = 4096) -> np.ndarray:
    """[N, K] float weights (K a multiple of 32) -> [N, K/32] q8 blocks. Works in row chunks so a
    large mmap'd matrix is never copied whole."""
    if w.ndim != 2 or w.shape[1] % QK:
        raise RuntimeInputError(f"q8 needs a matrix whose rows are a multiple of {QK} long, got "
                                f"shape {list(w.shape)}; keep this weight in f32")
    n, k = w.shape
    out = np.empty((n, k // QK), Q8_BLOCK)
    for r in range(0, n, rows_per_chunk):
        blk = np.asarray(w[r:r + rows_per_chunk], np.float32).reshape(-1, k // QK, QK)
        amax = np.abs(blk).max(axis=-1)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        out["d"][r:r + rows_per_chunk] = amax / np.float32(127)
        out["qs"][r:r + rows_per_chunk] = np.rint(blk * inv[..., None]).astype(np.int8)
    return out


def dequantize_q8(q: np.ndarray) -> np.ndarray:
    """[N, K/32] q8 blocks -> [N, K] f32 (what the kernels multiply with)."""
    return (q["qs"].astype(np.float32) * q["d"][..., None]).reshape(q.shape[0], -1)
