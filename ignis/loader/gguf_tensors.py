"""Where each tensor of a GGUF file lies, read from the header without decoding the metadata.

The gguf package's reader builds every metadata value (a vocabulary is hundreds of thousands of
strings: seconds); reading a tensor's blocks only needs the tensor table after it. This walks the
header as the GGUF format lays it out (little-endian; v2/v3) and skips each value by its size.

    index = tensor_index(path)            # name -> TensorLocation(type_id, dims, offset)
    raw = tensor_rows(path, index["output.weight"], rows, row_bytes)   # uint8 [rows, row_bytes]
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import GGUFError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32
_MAX_NESTING = 8
_MAX_DIMS = 4                     # GGML_MAX_DIMS
_I64_MAX = 2**63 - 1              # ggml's ne[] are int64


@dataclass(frozen=True)
class TensorLocation:
    type_id: int                  # ggml type (GGMLQuantizationType value)
    dims: tuple[int, ...]         # GGUF order: innermost (row length) first
    offset: int                   # absolute byte offset of the data in the file


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.at, self.path = buf, 0, path

    def take(self, fmt: str):
        try:
            v = struct.unpack_from("<" + fmt, self.buf, self.at)
        except (struct.error, OverflowError):
            raise GGUFError("header ends early: truncated or not a GGUF file", path=str(self.path)) from None
        self.at += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self) -> bytes:
        n = self.take("Q")
        if self.at + n > len(self.buf):
            raise GGUFError("header ends inside a string", path=str(self.path))
        s = bytes(self.buf[self.at:self.at + n])
        self.at += n
        return s

    def skip(self, n: int) -> None:
        if n > len(self.buf) - self.at:
            raise GGUFError("a metadata value runs past the end of the file", path=str(self.path))
        self.at += n

    def skip_value(self, vtype: int, depth: int = 0) -> None:
        if vtype == _STRING:
            self.skip(self.take("Q"))
        elif vtype == _ARRAY:
            if depth >= _MAX_NESTING:
                raise GGUFError(f"metadata arrays nested deeper than {_MAX_NESTING}", path=str(self.path))
            itype, count = self.take("I"), self.take("Q")
            if itype in _SCALAR_SIZES:
                self.skip(_SCALAR_SIZES[itype] * count)
            else:
                for _ in range(count):          # each item is >= 8 bytes: a bad count ends at EOF
                    self.skip_value(itype, depth + 1)
        elif vtype in _SCALAR_SIZES:
            self.skip(_SCALAR_SIZES[vtype])
        else:
            raise GGUFError(f"unknown metadata value type {vtype}", path=str(self.path))


def tensor_index(path: str | Path) -> dict[str, TensorLocation]:
    """Every tensor's type, dims and absolute data offset."""
    path = Path(path)
    if path.stat().st_size < 24:
        raise GGUFError("file is too short to be GGUF", path=str(path))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf, path)
        if c.take("4s") != b"GGUF":
            raise GGUFError("not a GGUF file", path=str(path))
        version = c.take("I")
        if version not in (2, 3):
            raise GGUFError(f"GGUF version {version} is not supported (2 and 3 are)", path=str(path))
        n_tensors, n_kv = c.take("Q"), c.take("Q")
        alignment = _DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key, vtype = c.string(), c.take("I")
            if key == b"general.alignment" and vtype == _UINT32:
                alignment = c.take("I")
                if alignment == 0 or alignment & (alignment - 1):
                    raise GGUFError(f"general.alignment is {alignment}, not a power of two",
                                    path=str(path))
            else:
                c.skip_value(vtype)
        infos: dict[str, tuple[int, tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            raw = c.string()
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise GGUFError(f"tensor name {raw[:40]!r} is not valid UTF-8", path=str(path)) from None
            n_dims = c.take("I")
            if n_dims > _MAX_DIMS:
                raise GGUFError(f"tensor has {n_dims} dimensions; GGUF allows at most {_MAX_DIMS}",
                                path=str(path), tensor=name)
            dims = tuple(c.take("Q") for _ in range(n_dims))
            if any(d > _I64_MAX for d in dims):
                raise GGUFError(f"tensor dimensions {list(dims)} exceed 2**63-1", path=str(path),
                                tensor=name)
            if name in infos:
                raise GGUFError("tensor listed twice in the tensor table", path=str(path), tensor=name)
            infos[name] = (c.take("I"), dims, c.take("Q"))
        start = -(-c.at // alignment) * alignment
        return {name: TensorLocation(t, dims, start + off) for name, (t, dims, off) in infos.items()}


def tensor_rows(path: str | Path, loc: TensorLocation, rows: int, row_bytes: int) -> np.ndarray:
    """A tensor's data as a read-only uint8 [rows, row_bytes] array mapped from the file."""
    size = Path(path).stat().st_size
    if rows < 0 or row_bytes < 0:
        raise GGUFError(f"cannot read {rows} rows of {row_bytes} bytes", path=str(path))
    if loc.offset + rows * row_bytes > size:
        raise GGUFError("tensor data runs past the end of the file", path=str(path))
    m = np.memmap(path, np.uint8, "r", offset=loc.offset, shape=(rows, row_bytes))
    return np.asarray(m)          # a plain ndarray view: slicing a memmap subclass is slow
