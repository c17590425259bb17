"""The records a weight format declares (one `FORMAT = WeightFormat(...)` per module of
ignis/formats): what the runtime and the conversion cache read instead of branching on a format's
name.

A format (what `weight_format=` takes) converts some of a model's matmul weights into one or more
packings (the layouts the kernels read, each an entry of the C kernel tables' traits, by its id);
each list of converted weights is a Part: one conversion-cache file. The Executor takes one packed
form per weight, merged from the parts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:   # types only: every layer reads the format records, so they import no layer
    from ..models.family import Family

# What a converter returns for one Part: per weight (the tape's order) its packed form, or None
# where the weight stays f32.
Converted = list


@dataclass(frozen=True)
class Packing:
    """A layout the matmul kernels read a weight in: the Python side of one IG_PACK_* of csrc/ignis.h
    (its index in every kernel table's wformat traits), whose size macro `packed_bytes` mirrors
    (tests/test_formats.py holds the two to _core.packed_bytes)."""
    name: str                       # the C name (ig_packing_name, _core.packing_ids()): "q8"
    c_id: int                       # its IG_PACK_* id (0: f32); the Executor's packed entries carry it
    dtype: np.dtype                 # element type of the arrays (uint8 bytes, uint16 bf16 bits)
    # bytes of an [n, k] matrix; `layout` is the sub-layout of a family of layouts (x16: IG_WX_*),
    # 0 for the others
    packed_bytes: Callable[[int, int, int], int]
    # None: an entry is the array itself; else entries are this type, holding the sub-layout id
    # in .fmt and the array in .packed (formats.gguf_blocks.Layout)
    layout_type: type | None = None

    def unwrap(self, entry: Any) -> tuple[int, np.ndarray]:
        """An entry of a converted list -> (sub-layout id, array)."""
        return (entry.fmt, entry.packed) if self.layout_type is not None else (0, entry)

    def wrap(self, layout: int, array: np.ndarray) -> Any:
        """The inverse of unwrap."""
        return self.layout_type(layout, array) if self.layout_type is not None else array


@dataclass(frozen=True)
class Part:
    """One list of converted weights of a format: one packing, cached as one file."""
    cache_name: str                 # the cache's tag (file name prefix, key, metadata): "q4-q8"
    # Bump when the bytes change (rounding, layout): old cache files are then never matched.
    cache_version: int
    packing: Packing
    label: str                      # what the progress line converts to: "q8 (the q4 model's q8 part)"
    # converted from the GGUF file the model was imported from (brought back first if pruned)
    reads_gguf: bool = False


@dataclass(frozen=True)
class ConvertInput:
    """What a converter reads: the model's weights as the compiled step orders them."""
    names: Sequence[str]            # the tape's weight names
    weights: Sequence[np.ndarray]   # the same weights as f32 (mmaps where the file is f32)
    matmul: frozenset[int]          # indices of the matrices a matmul reads: the ones to convert
    model: Any                      # ModelFiles: .weights (the file's own dtypes), .path, .config
    family: Family                  # output_weights, permuted_heads


@dataclass(frozen=True)
class WeightFormat:
    name: str                       # what weight_format= and --weights take
    description: str                # one line for help texts
    # the converted lists it hands the executor (none: the f32 weights themselves)
    parts: tuple[Part, ...] = ()
    # ConvertInput -> {Part.cache_name: Converted}; all parts at once (q4 splits one pass in two)
    convert: Callable[[ConvertInput], Mapping[str, Converted]] | None = None
    # True when convert() only views the model's files (a BF16 checkpoint's own bits): nothing
    # worth caching
    zero_copy: Callable[[ConvertInput], bool] = field(default=lambda inp: False)

    def __post_init__(self):
        # the cache's `ignis rm --format` and `prune --keep-latest` group files by this prefix
        for p in self.parts:
            if p.cache_name != self.name and not p.cache_name.startswith(self.name + "-"):
                raise ValueError(f"format {self.name!r}: part {p.cache_name!r} must be named "
                                 f"{self.name!r} or {self.name + '-...'!r}")
        if bool(self.parts) != (self.convert is not None):
            raise ValueError(f"format {self.name!r}: a converter exactly when it has parts")

    @property
    def matmuls(self) -> tuple[str, ...]:
        """The matmul kernels it runs on (_core.kernel_tables()' names: "matmul_x16"): a kernel
        table that has only the portable C twin of one runs this format slowly."""
        return tuple(dict.fromkeys(f"matmul_{p.packing.name}" for p in self.parts)) or ("matmul_f32",)
