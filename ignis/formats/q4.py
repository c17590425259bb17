"""weight_format="q4": matmul matrices as 4-bit blocks of 32 with one half scale (formats.quant),
but the output projection, which stays q8; activations quantized as for q8."""
from __future__ import annotations

import numpy as np

from . import q8
from .base import ConvertInput, Converted, Packing, Part, WeightFormat
from .quant import pack_q4, packed_q4_bytes, quantize_q4

Q4P = Packing("q4", c_id=3, dtype=np.dtype(np.uint8),
              packed_bytes=lambda n, k, layout=0: packed_q4_bytes(n, k))   # IG_Q4P_BYTES
# q4 2, q4-q8 2: half scales
PART_Q8 = Part("q4-q8", cache_version=2, packing=q8.Q8P, label="q8 (the q4 model's q8 part)")
PART = Part("q4", cache_version=2, packing=Q4P, label="q4")


def convert(inp: ConvertInput) -> dict[str, Converted]:
    """Every matmul matrix in q4 but the output projection (the family's output_weights), which
    stays q8: it decides every token and is the most sensitive to rounding (llama.cpp's 4-bit
    mixes keep it wider too). None elsewhere and for rows not a multiple of 32."""
    keep_q8 = inp.family.output_weights
    in_q8: Converted = [None] * len(inp.weights)
    in_q4: Converted = [None] * len(inp.weights)
    for i, name in enumerate(inp.names):
        if not q8.convertible(inp, i):
            continue
        if name in keep_q8:
            in_q8[i] = q8.to_q8(inp.weights[i])
        else:
            in_q4[i] = pack_q4(quantize_q4(inp.weights[i]))
    return {PART_Q8.cache_name: in_q8, PART.cache_name: in_q4}


FORMAT = WeightFormat("q4", "q4 (4-bit blocks of 32, one scale each; the output projection in q8)",
                      parts=(PART_Q8, PART), convert=convert)
