"""weight_format="q8": every matmul matrix quantized at load to blocks of 32 int8 with one half
scale (formats.quant), activations quantized per block for the integer dot products."""
from __future__ import annotations

import numpy as np

from .base import ConvertInput, Converted, Packing, Part, WeightFormat
from .quant import QK, pack_q8, packed_q8_bytes, quantize_q8

Q8P = Packing("q8", c_id=2, dtype=np.dtype(np.uint8),
              packed_bytes=lambda n, k, layout=0: packed_q8_bytes(n, k))   # IG_Q8P_BYTES
# q8 3: the packed layout (quant.pack_q8); q8 4: half scales
PART = Part("q8", cache_version=4, packing=Q8P, label="q8")


def convertible(inp: ConvertInput, i: int) -> bool:
    """A matmul matrix whose rows are whole blocks (the others stay f32)."""
    return i in inp.matmul and inp.weights[i].shape[1] % QK == 0


def to_q8(w: np.ndarray) -> np.ndarray:
    return pack_q8(quantize_q8(w))


def convert(inp: ConvertInput) -> dict[str, Converted]:
    """Packed q8 for every matmul matrix; None for the rest and for matrices whose rows are not a
    multiple of 32 (those stay f32)."""
    return {PART.cache_name: [to_q8(inp.weights[i]) if convertible(inp, i) else None
                              for i in range(len(inp.weights))]}


FORMAT = WeightFormat("q8", "q8 (int8 blocks of 32, one scale each)", parts=(PART,),
                      convert=convert)
