"""Moved to ignis.formats.quant (the q8 and q4 blocks belong to the weight formats). Kept as a
re-export because ignis/_core.pyx (packed_q8_bytes, packed_q4_bytes), tests/test_kernels.py and
benchmarks/bench_kernels.py import it from here; new code imports ignis.formats.quant."""
from ..formats.quant import (GRIDS, PACK_ROWS, Q8_BLOCK, QK, dequantize_q8, pack_q4, pack_q8,
                             packed_q4_bytes, packed_q8_bytes, quantize_activations, quantize_q4,
                             quantize_q8, unpack_q4, unpack_q8)

__all__ = ["GRIDS", "PACK_ROWS", "Q8_BLOCK", "QK", "dequantize_q8", "pack_q4", "pack_q8",
           "packed_q4_bytes", "packed_q8_bytes", "quantize_activations", "quantize_q4",
           "quantize_q8", "unpack_q4", "unpack_q8"]
