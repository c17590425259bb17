"""weight_format="bf16": matmul weights read as bfloat16 (a BF16 checkpoint's own bits, else f32
rounded to nearest even once at load); products and sums stay f32. Also the bf16 <-> f32 helpers
(NumPy has no bfloat16: bits are uint16)."""
from __future__ import annotations

import numpy as np

from .base import ConvertInput, Converted, Packing, Part, WeightFormat


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 (exact: bf16 is the top half of an f32)."""
    a = np.asarray(a)
    if a.dtype != np.uint16:
        raise TypeError(f"bf16_to_f32 expects uint16 bits, got {a.dtype}")
    return (a.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays a quiet NaN."""
    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


BF16 = Packing("bf16", c_id=1, dtype=np.dtype("<u2"),
               packed_bytes=lambda n, k, layout=0: 2 * n * k)
PART = Part("bf16", cache_version=1, packing=BF16, label="bf16")


def _is_bf16(inp: ConvertInput, name: str) -> bool:
    info = getattr(inp.model.weights, "info", None)     # a WeightStore knows each file dtype
    # the tape's constants (rope frequencies from the config) are in no checkpoint file
    return info is not None and name in inp.model.weights and info(name).dtype == "BF16"


def convert(inp: ConvertInput, rows_per_chunk: int = 8192) -> dict[str, Converted]:
    """bf16 bits for every matmul matrix: a BF16 checkpoint's own (zero copy), else rounded from
    f32 in row chunks (the rounding needs a wide temporary)."""
    out: Converted = []
    for i, name in enumerate(inp.names):
        if i not in inp.matmul:
            out.append(None)
        elif _is_bf16(inp, name):
            out.append(np.ascontiguousarray(inp.model.weights[name]))
        else:
            w = inp.weights[i]
            h = np.empty(w.shape, np.uint16)
            for r in range(0, w.shape[0], rows_per_chunk):
                h[r:r + rows_per_chunk] = f32_to_bf16(w[r:r + rows_per_chunk])
            out.append(h)
    return {PART.cache_name: out}


FORMAT = WeightFormat(
    "bf16", "bf16 (the f32 weights rounded to bfloat16, or a BF16 checkpoint's own)",
    parts=(PART,), convert=convert,
    # a BF16 checkpoint's own bits: views of its files, nothing to cache
    zero_copy=lambda inp: any(_is_bf16(inp, n) for n in inp.names))
