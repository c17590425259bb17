"""Strict safetensors reader (mmap, zero-copy NumPy views), sharded checkpoints, and a streaming,
atomic writer. Written from the format's rules; the official `safetensors` package is only the
reference the tests compare against.

Layout: 8-byte little-endian u64 header length N, N bytes of UTF-8 JSON, then the data region.
Each JSON entry is {"dtype", "shape", "data_offsets": [begin, end]} relative to the data region;
"__metadata__" is an optional str -> str map. The entries must tile the data region exactly.
"""
from __future__ import annotations

import difflib
import json
import math
import mmap
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IgnisError, ModelNotFoundError, SafetensorsError

__all__ = [
    "MAX_HEADER_SIZE", "DTYPE_SIZES", "NUMPY_DTYPES", "TensorInfo", "SafetensorsFile", "WeightStore",
    "SafetensorsWriter", "TensorNotFoundError", "UnsupportedDtypeError", "load_checkpoint",
    "save_file", "SINGLE_FILE", "INDEX_FILE",
]

# The official implementation refuses headers above 100,000,000 bytes (decimal), reading and writing.
MAX_HEADER_SIZE = 100_000_000
_U64_MAX = 2**64 - 1
_INTP_MAX = int(np.iinfo(np.intp).max)      # NumPy's limit on an array's size in bytes

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Every dtype ignis can lay out in a file, with its element size in bytes.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1,
    "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
# The NumPy view each dtype is read as. NumPy has no bfloat16: BF16 is handed out as its raw
# uint16 bits (ignis.formats.bf16.bf16_to_f32 widens). FP8 types have no NumPy view at all; use SafetensorsFile.raw().
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I32": np.dtype("<i4"), "U32": np.dtype("<u4"), "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"), "U64": np.dtype("<u8"), "F64": np.dtype("<f8"), "C64": np.dtype("<c8"),
}
# Defined by the format but packed below one byte per element; ignis cannot address them.
_SUB_BYTE_DTYPES = {"F4", "F6_E2M3", "F6_E3M2"}
_ENTRY_FIELDS = ("dtype", "shape", "data_offsets")
# numpy dtype -> safetensors name, for save_file (uint16 means U16; pass dtypes= to say BF16).
_FROM_NUMPY = {dt: name for name, dt in NUMPY_DTYPES.items() if name != "BF16"}


class TensorNotFoundError(IgnisError, KeyError):
    """A tensor name that is not in the file / checkpoint. A KeyError, so Mapping.get works."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None,
                 close_matches: Sequence[str] = ()):
        self.path = str(path) if path is not None else None
        self.tensor = tensor
        self.close_matches = tuple(close_matches)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:          # KeyError would repr() the message, quotes and all
        return self.message


class UnsupportedDtypeError(SafetensorsError):
    """A valid safetensors dtype that ignis cannot view as a NumPy array."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                  # safetensors name: "F32", "BF16", ...
    shape: tuple[int, ...]
    offset: int                 # absolute byte offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# --- header parsing ----------------------------------------------------------------------------

class _DuplicateKey(Exception):
    def __init__(self, key: str, container: dict[str, Any], doc: Any):
        self.key = key
        self.container = container      # the object holding the key twice
        self.doc = doc                  # the whole document (to find the container's owner)

    def owner(self) -> str | None:
        """Top-level key whose value holds the duplicate; None when it is the document itself."""
        if self.container is self.doc or not isinstance(self.doc, dict):
            return None
        return next((k for k, v in self.doc.items() if v is self.container), None)


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; JSON (and the official serde parser) does not.
    raise ValueError(f"{name} is not valid JSON")


def _loads_strict(text: str) -> Any:
    """json.loads that refuses NaN/Infinity and duplicate keys at any depth."""
    dups: list[tuple[str, dict[str, Any]]] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                dups.append((k, out))
            out[k] = v
        return out

    doc = json.loads(text, object_pairs_hook=hook, parse_constant=_reject_constant)
    if dups:
        # The outermost object is built last; a duplicate there is the one that names a tensor.
        key, container = dups[-1] if dups[-1][1] is doc else dups[0]
        raise _DuplicateKey(key, container, doc)
    return doc


def _is_u64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U64_MAX


def _check_text(s: str) -> bool:
    """True when s can be written back as UTF-8 (JSON escapes can smuggle in lone surrogates)."""
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _parse_header(raw: bytes, file_size: int, header_len: int, path: str
                  ) -> tuple[dict[str, str], list[TensorInfo]]:
    """Validate the JSON header against the file; return metadata and entries in file order."""
    def fail(msg: str, tensor: str | None = None) -> SafetensorsError:
        return SafetensorsError(msg, path=path, tensor=tensor)

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(f"header is not valid UTF-8 (byte {e.start} of the header); "
                   "the file is corrupt or not a safetensors file") from None
    try:
        header = _loads_strict(text)
    except _DuplicateKey as e:
        owner = e.owner()
        if e.container is e.doc:
            raise fail(f"tensor name {e.key!r} appears twice in the header; the file is "
                       "ambiguous", e.key) from None
        where = "__metadata__" if owner == "__metadata__" else "one entry"
        raise fail(f"header JSON has the key {e.key!r} twice in {where}; the file is ambiguous",
                   None if owner == "__metadata__" else owner) from None
    except ValueError as e:         # JSONDecodeError is a ValueError
        raise fail(f"header is not valid JSON: {e}") from None
    except RecursionError:
        raise fail("header JSON is nested too deeply to be a safetensors header") from None
    if not isinstance(header, dict):
        raise fail(f"header JSON must be an object, got {type(header).__name__}")

    metadata: dict[str, str] = {}
    data_size = file_size - 8 - header_len
    entries: list[tuple[int, int, TensorInfo]] = []
    for name, entry in header.items():
        if not _check_text(name):
            raise fail("a tensor name is not valid Unicode (lone surrogate escape)")
        if name == "__metadata__":
            if entry is None:
                continue
            if not isinstance(entry, dict):
                raise fail(f"__metadata__ must be an object of strings, got {type(entry).__name__}")
            for k, v in entry.items():
                if not isinstance(v, str):
                    raise fail(f"__metadata__ value for {k!r} must be a string, got "
                               f"{type(v).__name__} {v!r}")
                if not (_check_text(k) and _check_text(v)):
                    raise fail(f"__metadata__ entry {k!r} is not valid Unicode")
            metadata = dict(entry)
            continue
        if not isinstance(entry, dict):
            raise fail(f"entry must be an object with dtype/shape/data_offsets, got "
                       f"{type(entry).__name__}", name)
        for f in _ENTRY_FIELDS:
            if f not in entry:
                raise fail(f"entry has no {f!r} field", name)
        extra = sorted(set(entry) - set(_ENTRY_FIELDS))
        if extra:
            raise fail(f"entry has unknown field(s) {extra}; only dtype, shape and data_offsets "
                       "are allowed", name)
        dtype = entry["dtype"]
        if not isinstance(dtype, str) or (dtype not in DTYPE_SIZES and dtype not in _SUB_BYTE_DTYPES):
            raise fail(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_SIZES))}", name)
        if dtype in _SUB_BYTE_DTYPES:
            raise UnsupportedDtypeError(
                f"dtype {dtype} packs several elements per byte; ignis cannot load it "
                "(convert the checkpoint to F32/F16/BF16)", path=path, tensor=name)
        shape = entry["shape"]
        if not isinstance(shape, list):
            raise fail(f"shape must be a list of non-negative integers, got {shape!r}", name)
        numel = 1
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int):
                raise fail(f"shape {shape!r} has a non-integer dimension {d!r}", name)
            if d < 0:
                raise fail(f"shape {shape!r} has a negative dimension {d}", name)
            # The official reader multiplies left to right in u64 with checked arithmetic; Python
            # ints never overflow, so the same running bound is checked by hand.
            numel *= d
            if numel > _U64_MAX:
                raise fail(f"shape {shape!r}: element count overflows 64 bits; the header is "
                           "corrupt", name)
        nbytes = numel * DTYPE_SIZES[dtype]
        if nbytes > _U64_MAX:
            raise fail(f"shape {shape!r} x {DTYPE_SIZES[dtype]} bytes per element overflows 64 "
                       "bits; the header is corrupt", name)
        offs = entry["data_offsets"]
        if not (isinstance(offs, list) and len(offs) == 2):
            raise fail(f"data_offsets must be [begin, end], got {offs!r}", name)
        begin, end = offs
        if not (_is_u64(begin) and _is_u64(end)):
            raise fail(f"data_offsets {offs!r} must be two integers in [0, 2**64)", name)
        if begin > end:
            raise fail(f"data_offsets {offs!r} begin after they end", name)
        if end > data_size:
            raise fail(f"data_offsets {offs!r} reach past the end of the data region "
                       f"({data_size} bytes); the file is truncated or the header is wrong", name)
        if end - begin != nbytes:
            raise fail(f"data_offsets {offs!r} span {end - begin} bytes but dtype {dtype} with "
                       f"shape {shape} needs {nbytes}", name)
        entries.append((begin, end, TensorInfo(name, dtype, tuple(shape), 8 + header_len + begin,
                                               nbytes)))

    # Sorted by offsets (as the official reader does), the entries must tile [0, data_size).
    entries.sort(key=lambda e: (e[0], e[1]))
    pos, prev = 0, None
    for begin, end, info in entries:
        if begin < pos:
            raise fail(f"data [{begin}, {end}) overlaps tensor {prev!r} which ends at {pos}",
                       info.name)
        if begin > pos:
            raise fail(f"{begin - pos} byte gap before this tensor's data (offset {pos} to "
                       f"{begin} is not covered by any tensor)", info.name)
        pos, prev = end, info.name
    if pos != data_size:
        raise fail(f"{data_size - pos} trailing bytes after the last tensor are not covered by "
                   "any tensor; the data region must be covered exactly")
    return metadata, [e[2] for e in entries]


def _close_matches(name: str, names: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(name, names, n=5, cutoff=0.6)


def _not_found(name: str, names: Sequence[str], where: str, path: str | None) -> TensorNotFoundError:
    close = _close_matches(name, names)
    hint = f"; close names: {', '.join(close)}" if close else f" ({len(names)} tensors in it)"
    return TensorNotFoundError(f"tensor {name!r} is not in {where}{hint}", path=path, tensor=name,
                               close_matches=close)


# --- reader ------------------------------------------------------------------------------------

class SafetensorsFile:
    """One validated .safetensors file, memory-mapped read-only.

    keys() lists tensors in file order (by data offset). tensor() returns zero-copy, read-only
    NumPy views into the mapping; they stay valid after close() (the mapping lives as long as
    any view does).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        p = str(self.path)
        self._mmap: mmap.mmap | None = None
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise ModelNotFoundError(f"safetensors file not found: {p}") from None
        except IsADirectoryError:
            raise SafetensorsError("is a directory, not a .safetensors file "
                                   "(use load_checkpoint() for a model directory)", path=p) from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SafetensorsError(f"file is {size} bytes, too short to hold the 8-byte header "
                                       "length; it is truncated or not a safetensors file", path=p)
            n = int.from_bytes(f.read(8), "little")
            if n > MAX_HEADER_SIZE:
                raise SafetensorsError(f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit; "
                                       "the file is corrupt or not a safetensors file", path=p)
            if 8 + n > size:
                raise SafetensorsError(f"header length {n} reaches past the end of the file "
                                       f"({size} bytes); the file is truncated", path=p)
            raw = f.read(n)
            self.metadata, infos = _parse_header(raw, size, n, p)
            self.header_size = n
            self.file_size = size
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._infos: dict[str, TensorInfo] = {i.name: i for i in infos}

    # --- mapping-like surface
    def keys(self) -> list[str]:
        return list(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def __repr__(self) -> str:
        state = "closed" if self._mmap is None else f"{len(self)} tensors"
        return f"SafetensorsFile({str(self.path)!r}, {state})"

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise _not_found(name, list(self._infos), str(self.path), str(self.path)) from None

    def _buffer(self) -> mmap.mmap:
        if self._mmap is None:
            raise SafetensorsError("file is closed", path=str(self.path))
        return self._mmap

    def tensor(self, name: str) -> np.ndarray:
        """Zero-copy read-only view of `name` (BF16 as raw uint16 bits)."""
        info = self.info(name)
        dt = NUMPY_DTYPES.get(info.dtype)
        if dt is None:
            raise UnsupportedDtypeError(f"dtype {info.dtype} has no NumPy equivalent; read its "
                                        "bytes with .raw(name)", path=str(self.path), tensor=name)
        if info.numel == 0 and math.prod(d for d in info.shape if d) * dt.itemsize > _INTP_MAX:
            # The format allows any dimension beside a 0 (the tensor is empty), but NumPy refuses
            # a shape whose other dimensions' bytes overflow its index type, even with no elements.
            raise SafetensorsError(f"empty tensor of shape {list(info.shape)} cannot be a NumPy "
                                   f"array: its nonzero dimensions times {dt.itemsize} bytes exceed "
                                   f"{_INTP_MAX}; the header is corrupt", path=str(self.path),
                                   tensor=name)
        arr = np.frombuffer(self._buffer(), dtype=dt, count=info.numel, offset=info.offset)
        return arr.reshape(info.shape)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a zero-copy read-only uint8 view (works for every dtype)."""
        info = self.info(name)
        return np.frombuffer(self._buffer(), dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def close(self) -> None:
        if self._mmap is None:
            return
        try:
            self._mmap.close()
        except BufferError:
            # Views handed out still reference the mapping; it is unmapped when the last one dies.
            pass
        self._mmap = None

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WeightStore(Mapping[str, np.ndarray]):
    """All tensors of a checkpoint (one file or shards) as name -> zero-copy read-only array.

    Iteration order: shard files in index order of first appearance, tensors in file order.
    """

    def __init__(self, files: Sequence[SafetensorsFile], where: Mapping[str, int], root: Path):
        self.files: tuple[SafetensorsFile, ...] = tuple(files)
        self._where = dict(where)        # tensor name -> index into files
        self.root = root

    def __getitem__(self, name: str) -> np.ndarray:
        return self.file_of(name).tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def file_of(self, name: str) -> SafetensorsFile:
        try:
            return self.files[self._where[name]]
        except KeyError:
            raise _not_found(name, list(self._where), f"the checkpoint in {self.root}",
                             str(self.root)) from None

    def info(self, name: str) -> TensorInfo:
        return self.file_of(name).info(name)

    @property
    def metadata(self) -> dict[str, str]:
        """__metadata__ of the first file (shards of one checkpoint normally share it)."""
        return dict(self.files[0].metadata) if self.files else {}

    @property
    def nbytes(self) -> int:
        return sum(self.info(n).nbytes for n in self._where)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> "WeightStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WeightStore({str(self.root)!r}, {len(self)} tensors in {len(self.files)} file(s))"


def load_checkpoint(model_dir: str | os.PathLike[str]) -> WeightStore:
    """Open `model.safetensors` or the shards listed by `model.safetensors.index.json`.

    A path to a single .safetensors file is accepted too. The single file wins when both exist
    (as in Hugging Face transformers).
    """
    root = Path(model_dir)
    if root.is_file():
        f = SafetensorsFile(root)
        return WeightStore([f], {n: 0 for n in f}, root)
    if not root.is_dir():
        raise ModelNotFoundError(f"model directory not found: {root}")
    single = root / SINGLE_FILE
    if single.exists():
        f = SafetensorsFile(single)
        return WeightStore([f], {n: 0 for n in f}, root)
    index = root / INDEX_FILE
    if not index.exists():
        raise ModelNotFoundError(f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}; "
                                 "it is not a safetensors checkpoint")
    return _load_sharded(root, index)


def _load_sharded(root: Path, index: Path) -> WeightStore:
    ip = str(index)

    def fail(msg: str, tensor: str | None = None) -> SafetensorsError:
        return SafetensorsError(msg, path=ip, tensor=tensor)

    try:
        doc = _loads_strict(index.read_bytes().decode("utf-8"))
    except OSError as e:
        raise fail(f"index cannot be read: {e.strerror or e}") from None
    except _DuplicateKey as e:
        raise fail(f"index JSON has the key {e.key!r} twice", tensor=e.key) from None
    except (ValueError, RecursionError) as e:       # UnicodeDecodeError is a ValueError
        raise fail(f"index is not valid UTF-8 JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise fail("index must be a JSON object with a 'weight_map' object (tensor name -> shard file)")
    weight_map: dict[str, Any] = doc["weight_map"]
    if not weight_map:
        raise fail("weight_map is empty")

    shard_names: list[str] = []
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise fail(f"shard for this tensor must be a file name, got {shard!r}", name)
        # Shards must sit beside the index: a name with a directory part could point anywhere.
        if (shard in (".", "..") or "/" in shard or "\\" in shard or "\0" in shard
                or Path(shard).name != shard):
            raise fail(f"shard name {shard!r} is not a plain file name in the model directory", name)
        if shard not in shard_names:
            shard_names.append(shard)

    files: list[SafetensorsFile] = []
    try:
        for shard in shard_names:
            sp = root / shard
            if not sp.is_file():
                raise fail(f"shard {shard!r} listed in the index does not exist in {root}")
            files.append(SafetensorsFile(sp))
        idx = {s: i for i, s in enumerate(shard_names)}
        where: dict[str, int] = {}
        for i, f in enumerate(files):
            for name in f:
                listed = weight_map.get(name)
                if listed is None:
                    raise fail(f"tensor is in shard {shard_names[i]!r} but not in the index's "
                               "weight_map; index and shards disagree", name)
                if name in where:
                    raise fail(f"tensor is stored in two shards, {shard_names[where[name]]!r} and "
                               f"{shard_names[i]!r}", name)
                if idx[listed] != i:
                    raise fail(f"index says the tensor is in {listed!r} but it is in "
                               f"{shard_names[i]!r}", name)
                where[name] = i
        missing = [n for n in weight_map if n not in where]
        if missing:
            raise fail(f"{len(missing)} tensor(s) listed in the index are not in their shard: "
                       f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", missing[0])
    except BaseException:
        for f in files:
            f.close()
        raise
    return WeightStore(files, where, root)


# --- writer ------------------------------------------------------------------------------------

class SafetensorsWriter:
    """Streams tensors into a new .safetensors file; the file appears only when complete.

    The header is computed from `specs` up front. Data is laid out by decreasing element size
    (stable, so spec order otherwise) so every tensor starts at a multiple of its element size
    (the header is padded to 8 bytes, as the official writer does). write() may be called in any
    order, once per tensor; data goes to a temporary file in the target directory that close()
    renames into place only after every tensor was written. On error nothing is left behind.
    """

    def __init__(self, path: str | os.PathLike[str], specs: Sequence[tuple[str, str, Sequence[int]]],
                 metadata: Mapping[str, str] | None = None, *, fsync: bool = True):
        self.path = Path(path)
        p = str(self.path)
        self._fsync = fsync
        if metadata is not None:
            if not isinstance(metadata, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise SafetensorsError("metadata must map strings to strings", path=p)
        seen: set[str] = set()
        norm: list[tuple[str, str, tuple[int, ...]]] = []
        for spec in specs:
            name, dtype, shape = spec
            if not isinstance(name, str) or not name or name == "__metadata__":
                raise SafetensorsError(f"invalid tensor name {name!r}", path=p)
            if name in seen:
                raise SafetensorsError("tensor name given twice", path=p, tensor=name)
            seen.add(name)
            if dtype not in DTYPE_SIZES:
                raise SafetensorsError(f"cannot write dtype {dtype!r}; writable: "
                                       f"{', '.join(sorted(DTYPE_SIZES))}", path=p, tensor=name)
            shape_t = tuple(shape)
            if not all(_is_u64(d) for d in shape_t):
                raise SafetensorsError(f"shape {shape_t} must be non-negative integers",
                                       path=p, tensor=name)
            norm.append((name, dtype, shape_t))
        order = sorted(range(len(norm)), key=lambda i: -DTYPE_SIZES[norm[i][1]])
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        self._slots: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        pos = 0
        for i in order:
            name, dtype, shape = norm[i]
            nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
            self._slots[name] = (dtype, shape, pos, nbytes)
            pos += nbytes
        hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        hb += b" " * (-len(hb) % 8)
        if len(hb) > MAX_HEADER_SIZE:
            raise SafetensorsError(f"header would be {len(hb)} bytes, above the {MAX_HEADER_SIZE}-byte "
                                   "limit readers enforce", path=p)
        self._data_start = 8 + len(hb)
        self._total = self._data_start + pos
        self._written: set[str] = set()
        self._file = None
        self._tmp: str | None = None
        self._committed = False
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                         dir=self.path.parent)
        try:
            os.fchmod(fd, 0o644)         # mkstemp creates 0600; the result is an ordinary file
            self._file = os.fdopen(fd, "wb")
            self._file.write(len(hb).to_bytes(8, "little"))
            self._file.write(hb)
        except BaseException:
            self.abort()
            raise

    @property
    def names(self) -> list[str]:
        """Tensor names in file order."""
        return list(self._slots)

    @property
    def pending(self) -> list[str]:
        return [n for n in self._slots if n not in self._written]

    def write(self, name: str, array: np.ndarray) -> None:
        p = str(self.path)
        if self._file is None:
            raise SafetensorsError("writer is closed" if self._committed else
                                   "writer was aborted; nothing was written", path=p, tensor=name)
        slot = self._slots.get(name)
        if slot is None:
            raise _not_found(name, list(self._slots), "this writer's specs", p)
        if name in self._written:
            raise SafetensorsError("tensor written twice", path=p, tensor=name)
        dtype, shape, pos, nbytes = slot
        if not isinstance(array, np.ndarray):
            raise SafetensorsError(f"expected a numpy array, got {type(array).__name__}",
                                   path=p, tensor=name)
        want = NUMPY_DTYPES.get(dtype, np.dtype("u1"))      # FP8 kinds are written as raw bytes
        if array.dtype != want:
            raise SafetensorsError(f"array dtype {array.dtype} does not match {dtype} (expects "
                                   f"{want}{', the raw bits' if dtype == 'BF16' else ''})",
                                   path=p, tensor=name)
        if tuple(array.shape) != shape:
            raise SafetensorsError(f"array shape {tuple(array.shape)} does not match the declared "
                                   f"{shape}", path=p, tensor=name)
        if not array.flags.c_contiguous:
            raise SafetensorsError("array is not C-contiguous (use np.ascontiguousarray)",
                                   path=p, tensor=name)
        try:
            self._file.seek(self._data_start + pos)
            if nbytes:
                self._file.write(memoryview(array.reshape(-1).view(np.uint8)))
        except BaseException:
            self.abort()
            raise
        self._written.add(name)

    def close(self) -> None:
        """Finish: rename into place if every tensor was written, else remove and refuse."""
        if self._file is None:
            if self._committed:
                return
            # e.g. a write() failed (disk full) and the caller carried on: never report success
            raise SafetensorsError("writer was aborted after an error; no file was created",
                                   path=str(self.path))
        missing = self.pending
        if missing:
            self.abort()
            raise SafetensorsError(f"{len(missing)} tensor(s) never written ({', '.join(missing[:5])}"
                                   f"{' ...' if len(missing) > 5 else ''}); no file was created",
                                   path=str(self.path), tensor=missing[0])
        try:
            self._file.truncate(self._total)     # no-op unless trailing tensors are empty
            if self._fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self._tmp, self.path)
            self._tmp = None
            self._committed = True
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop everything written so far; the target path is left untouched."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # A writer dropped without close() must not leave a temp file behind.
        if getattr(self, "_tmp", None) is not None:
            self.abort()


def save_file(tensors: Mapping[str, np.ndarray], path: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None, *,
              dtypes: Mapping[str, str] | None = None) -> None:
    """Write `tensors` atomically. dtypes overrides the inferred name (e.g. {"w": "BF16"} for
    uint16 arrays holding bfloat16 bits)."""
    dtypes = dict(dtypes or {})
    specs = []
    for name, a in tensors.items():
        if not isinstance(a, np.ndarray):
            raise SafetensorsError(f"expected a numpy array, got {type(a).__name__}",
                                   path=str(path), tensor=name)
        dt = dtypes.get(name) or _FROM_NUMPY.get(a.dtype)
        if dt is None:
            raise SafetensorsError(f"numpy dtype {a.dtype} has no safetensors equivalent "
                                   "(little-endian only)", path=str(path), tensor=name)
        specs.append((name, dt, a.shape))
    with SafetensorsWriter(path, specs, metadata) as w:
        for name, a in tensors.items():
            # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
            w.write(name, a if a.flags.c_contiguous else a.copy(order="C"))

