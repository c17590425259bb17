"""Static tensor types of the IR: a shape whose sizes are ints or symbols, and a dtype.

Symbols stand for sizes that vary between steps of one compiled graph: ``T`` (tokens in this step)
and ``R`` (rows that need logits). A plan binds them to concrete upper bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

import numpy as np

Dim = Union[int, str]

# dtype name -> (bytes per element, numpy dtype used by the interpreter for this type)
DTYPES: dict[str, tuple[int, type]] = {
    "f32": (4, np.float32),
    "i32": (4, np.int32),
}
SYMBOLS = ("T", "R")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: str = "f32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        for d in self.shape:
            if isinstance(d, bool) or not (isinstance(d, str) and d in SYMBOLS
                                           or isinstance(d, int) and d >= 0):
                raise ValueError(f"bad dimension {d!r} in shape {self.shape}: use a non-negative int "
                                 f"or one of the symbols {SYMBOLS}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][0]

    def concrete_shape(self, bounds: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with every symbol replaced by its bound (KeyError names a missing symbol)."""
        return tuple(d if isinstance(d, int) else int(bounds[d]) for d in self.shape)

    def nbytes(self, bounds: Mapping[str, int]) -> int:
        n = self.itemsize
        for d in self.concrete_shape(bounds):
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def f32(*shape: Dim) -> TensorType:
    return TensorType(tuple(shape), "f32")


def i32(*shape: Dim) -> TensorType:
    return TensorType(tuple(shape), "i32")
