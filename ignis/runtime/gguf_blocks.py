"""Moved to ignis.formats.gguf_blocks (a GGUF file's blocks in the x16 layouts belong to the gguf
weight format). Kept as a re-export because ignis/_core.pyx (packed_x16_bytes) and
benchmarks/bench_kernels.py import it from here; new code imports ignis.formats.gguf_blocks."""
from ..formats.gguf_blocks import (BLOCK_BYTES, LOW6, QK_K, TYPE_IDS, WX_Q4K, WX_Q5, WX_Q6K, WX_Q8,
                                   X16_BLOCK, Layout, decode_q4_0, decode_q4_k, decode_q5_0,
                                   decode_q6_k, decode_q8_0, dequantize_layout, gguf_weight_layout,
                                   pack_x16_q4k, pack_x16_q5, pack_x16_q6k, packed_x16_bytes)

__all__ = ["BLOCK_BYTES", "LOW6", "QK_K", "TYPE_IDS", "WX_Q4K", "WX_Q5", "WX_Q6K", "WX_Q8",
           "X16_BLOCK", "Layout", "decode_q4_0", "decode_q4_k", "decode_q5_0", "decode_q6_k",
           "decode_q8_0", "dequantize_layout", "gguf_weight_layout", "pack_x16_q4k", "pack_x16_q5",
           "pack_x16_q6k", "packed_x16_bytes"]
