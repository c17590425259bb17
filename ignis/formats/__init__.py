"""Weight formats: the forms a model's matmul weights can run in, one module each (f32, bf16, q8,
q4, gguf), each declaring one `FORMAT = WeightFormat(...)` record (formats/base.py). FORMATS is the
registry the runtime, the conversion cache, the CLI and the benchmarks read.

Every layer may read the records (the loader's cache commands list conversion files by their
tags), so a format module imports nothing of ignis at its top but ignis.errors and its siblings; a
converter imports what it reads (the loader) when it runs."""
from __future__ import annotations

from . import bf16, f32, gguf, q4, q8
from .base import ConvertInput, Converted, Packing, Part, WeightFormat

FORMATS: dict[str, WeightFormat] = {m.FORMAT.name: m.FORMAT for m in (f32, bf16, q8, q4, gguf)}
WEIGHT_FORMATS = tuple(FORMATS)     # ("f32", "bf16", "q8", "q4", "gguf"): CLI choices
# every conversion-cache tag, with its part (a format may have several: q4 and q4-q8)
PARTS: dict[str, Part] = {p.cache_name: p for f in FORMATS.values() for p in f.parts}
# every packing the kernels read (csrc/ignis.h IG_PACK_*, each kernel table's wformat), by its C id
PACKINGS: dict[int, Packing] = {p.c_id: p for p in (f32.F32, *(part.packing for part in PARTS.values()))}

__all__ = ["FORMATS", "WEIGHT_FORMATS", "PARTS", "PACKINGS", "WeightFormat", "Part", "Packing",
           "ConvertInput", "Converted"]
