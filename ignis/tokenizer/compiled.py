"""The compiled-tokenizer cache: what is slow to rebuild from a 7-11 MB tokenizer.json (parsing it,
checking ~150k merges, spelling ~150k tokens as bytes), stored once in a compact binary file so that
later loads of the same files skip it (Qwen2.5 on a 2-core VM: ~0.45 s -> ~0.15 s; what remains is
mostly building the ~150k-entry Python objects: vocabulary dicts, merge tuples, token bytes).

A cache file lives at IGNIS_HOME/tokenizers/<source>-<identity>.bin. <source> hashes the model
directory; <identity> hashes what the tables depend on: FORMAT_VERSION, the absolute path, size and
mtime_ns of tokenizer.json and tokenizer_config.json, and of the modules that derive the tables. A
changed file therefore never matches a stale cache, and writing a new file for a directory removes
that directory's older ones.

File layout (all integers native-endian int32; the header records the byte order):

    8s  magic b"IGNISTOK"      u32 FORMAT_VERSION     u32 header length     u32 CRC-32 of the rest
    header (UTF-8 JSON): key, counts, section offsets, the separator of vocab_text, and `spec`:
        tokenizer.json without model.vocab and model.merges (the pipeline, added tokens, options)
    sections (8-byte aligned):
        vocab_text   the vocabulary's tokens in file order, UTF-8, joined by a character none holds
        vocab_ids    their ids
        merge_left, merge_right, merge_new, merge_rank   bpe.MergeTable's columns
        bytes_ends   per id, where its bytes end in bytes_blob (the running sum of their lengths)
        bytes_holes  the ids without a token (their bytes are empty)
        bytes_blob   every id's bytes, concatenated

The cache is an optimisation: a file that cannot be read, is damaged (bad CRC, counts that do not
add up) or cannot be written is bypassed with a RuntimeWarning and the tokenizer is built from the
JSON files as if there were no cache. No pickle: reading a cache file never runs code from it.
"""
from __future__ import annotations

import hashlib
import json
import operator
import os
import struct
import sys
import warnings
from array import array
from dataclasses import dataclass
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ignis.paths import CACHE_PREFIX, ignis_home, open_cache_file, pack_cache_file, write_atomic
from ignis.tokenizer.bpe import MergeTable
from ignis.tokenizer.errors import CompiledCacheError

if TYPE_CHECKING:
    from ignis.tokenizer.tokenizer import Tokenizer

# Bump whenever what is stored, or how it is derived from the JSON, changes.
FORMAT_VERSION = 2
MAGIC = b"IGNISTOK"
_PREFIX = CACHE_PREFIX                  # magic, format version, header length, CRC-32
_INT = "i"
_ALIGN = 8
# Characters tried, in order, as the separator of vocab_text: the first that no token holds.
_SEPARATORS = "".join(chr(c) for c in range(0x20)) + "\ufffe\uffff"
# The modules whose code derives the stored tables: editing one invalidates every cache file.
_DERIVING_MODULES = ("bpe.py", "spm_bpe.py", "bytelevel.py", "decoders.py", "tokenizer.py",
                     "compiled.py")
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class CacheKey:
    """Where a tokenizer's cache file is, and the identity its header must repeat."""
    source: str         # hash of the model directory: one live cache file per directory
    identity: str       # hash of FORMAT_VERSION and the files' identities

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.source}-{self.identity}.bin"


@dataclass(frozen=True)
class CompiledTables:
    """What a cache file holds, ready for Tokenizer._from_compiled."""
    spec: dict[str, Any]
    tokens: list[str]
    ids: array                  # int32, the vocabulary's ids in file order
    merges: MergeTable
    token_bytes: "TokenBytes"
    holes: list[int]
    token_to_id_is_vocab_and_added: bool


def cache_dir() -> Path:
    return ignis_home() / "tokenizers"


def _identity(path: Path) -> list[Any]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [str(path), None]
    return [str(path), st.st_size, st.st_mtime_ns]


def source_key(tokenizer_json: Path, tokenizer_config: Path) -> CacheKey | None:
    """The cache key of a model directory's tokenizer files, or None when tokenizer.json is not
    there (or cannot be looked at): loading then reports the problem, and nothing is cached."""
    try:
        tj = Path(os.path.abspath(tokenizer_json))
        if not tj.is_file():
            return None
        ident = {"format": FORMAT_VERSION, "byteorder": sys.byteorder,
                 "files": [_identity(tj), _identity(Path(os.path.abspath(tokenizer_config)))],
                 "code": [_identity(_HERE / m) for m in _DERIVING_MODULES]}
    except OSError:
        return None
    source = hashlib.sha256(str(tj.parent).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    identity = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    return CacheKey(source, identity)


# ---------------------------------------------------------------- read

def read(key: CacheKey) -> CompiledTables | None:
    """The tables stored for key, or None when there is no such file (a miss) or it is unusable
    (then with a RuntimeWarning)."""
    path = key.path
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        _warn(f"ignoring unreadable tokenizer cache {path}: {exc.strerror or exc}")
        return None
    try:
        return _parse(data, key)
    except (CompiledCacheError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            RecursionError, struct.error) as exc:
        # ValueError covers bad JSON and bad UTF-8 as well.
        _warn(f"ignoring damaged tokenizer cache {path} ({exc}); the tokenizer files are parsed "
              f"instead and the cache is written again")
        return None


def warn_unusable(key: CacheKey, exc: Exception) -> None:
    """The tables parsed but do not make a tokenizer: say so (loading goes on from the JSON)."""
    _warn(f"ignoring tokenizer cache {key.path} that does not fit its tokenizer files ({exc}); "
          f"the tokenizer files are parsed instead and the cache is written again")


def _parse(data: bytes, key: CacheKey) -> CompiledTables:
    header, payload = open_cache_file(data, MAGIC, FORMAT_VERSION, CompiledCacheError,
                                      "tokenizer cache")
    if header.get("key") != key.identity:
        raise CompiledCacheError("written for other tokenizer files")
    if header.get("byteorder") != sys.byteorder or header.get("itemsize") != array(_INT).itemsize:
        raise CompiledCacheError("written on a machine with another integer layout")
    sections = header["sections"]

    def blob(name: str) -> memoryview:
        start, size = sections[name]
        if not (isinstance(start, int) and isinstance(size, int) and 0 <= start
                and 0 <= size and start + size <= len(payload)):
            raise CompiledCacheError(f"section {name} lies outside the file")
        return payload[start:start + size]

    def ints(name: str) -> array:
        out = array(_INT)
        raw = blob(name)
        if len(raw) % out.itemsize:
            raise CompiledCacheError(f"section {name} is not a whole number of integers")
        out.frombytes(raw)
        return out

    counts = header["counts"]
    n_vocab, n_merges, n_ids = counts["vocab"], counts["merges"], counts["ids"]
    text = bytes(blob("vocab_text")).decode("utf-8", "surrogatepass")
    tokens = text.split(header["sep"]) if n_vocab else []
    ids = ints("vocab_ids")
    merges = MergeTable(ints("merge_left"), ints("merge_right"), ints("merge_new"),
                        ints("merge_rank"))
    _expect("vocabulary tokens", len(tokens), n_vocab)
    _expect("vocabulary ids", len(ids), n_vocab)
    for column in ("left", "right", "new", "rank"):
        _expect(f"merge {column} ids", len(getattr(merges, column)), n_merges)
    if n_vocab and (min(ids) < 0 or max(ids) >= n_ids):
        raise CompiledCacheError(f"a vocabulary id lies outside 0..{n_ids - 1}")
    token_bytes, holes = _token_bytes(ints("bytes_ends"), ints("bytes_holes").tolist(),
                                      bytes(blob("bytes_blob")), n_ids)
    spec = header["spec"]
    if not isinstance(spec, dict):
        raise CompiledCacheError("stored tokenizer spec is not an object")
    return CompiledTables(spec, tokens, ids, merges, token_bytes, holes,
                          header["token_to_id_is_vocab_and_added"] is True)


def _token_bytes(ends: array, holes: list[int], blob: bytes,
                 n_ids: int) -> tuple["TokenBytes", list[int]]:
    """The id -> bytes table: blob cut at ends, None at the holes (checked whole, cut on use)."""
    import numpy as np
    _expect("byte offsets", len(ends), n_ids)
    e = np.frombuffer(ends, np.int32) if len(ends) else np.zeros(0, np.int32)
    if len(e) and (e[0] < 0 or int(e[-1]) != len(blob) or bool((e[1:] < e[:-1]).any())):
        raise CompiledCacheError("byte offsets do not run up to the end of the stored bytes")
    if len(set(holes)) != len(holes):
        raise CompiledCacheError("a hole is listed twice")
    for h in holes:
        if not 0 <= h < n_ids or (ends[h - 1] if h else 0) != ends[h]:
            raise CompiledCacheError(f"hole {h} is not an empty id of 0..{n_ids - 1}")
    return TokenBytes(blob, ends, frozenset(holes)), holes


class TokenBytes(Sequence):
    """A cached tokenizer's id -> bytes table (None for the ids without a token), as the list a
    fresh build makes but without its ~150k bytes objects: an entry is cut out of the blob when it
    is asked for (decoding a few tokens never builds the rest); iterating, slicing or comparing
    builds the list once."""
    __slots__ = ("_blob", "_ends", "_holes", "_list")

    def __init__(self, blob: bytes, ends: array, holes: frozenset[int]):
        self._blob = blob
        self._ends = ends           # per id, where its bytes end in blob
        self._holes = holes
        self._list: list[bytes | None] | None = None

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        i = operator.index(i)
        n = len(self._ends)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token id out of range")
        if i in self._holes:
            return None
        return self._blob[self._ends[i - 1] if i else 0:self._ends[i]]

    def tolist(self) -> list[bytes | None]:
        if self._list is None:
            ends = self._ends
            table: list[bytes | None] = list(map(self._blob.__getitem__,
                                                 map(slice, [0, *ends], ends)))
            for h in self._holes:
                table[h] = None
            self._list = table
        return self._list

    def __iter__(self):
        return iter(self.tolist())

    def __contains__(self, value) -> bool:
        if value is None:
            return bool(self._holes)
        return value in self.tolist()

    def __eq__(self, other) -> bool:
        if isinstance(other, (TokenBytes, list)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None         # type: ignore[assignment]  (mutable-looking, as a list)

    @property
    def holes(self) -> frozenset[int]:
        return self._holes


def _expect(what: str, got: int, want: Any) -> None:
    if got != want:
        raise CompiledCacheError(f"{got} {what}, the header says {want!r}")


# ---------------------------------------------------------------- write

def write(key: CacheKey, tokenizer_json: dict[str, Any], tok: "Tokenizer") -> None:
    """Store tok's tables for key (atomically: a temp file in the same directory, then rename),
    and remove the directory's older cache files. Any failure is a warning, never an error."""
    path = key.path
    try:
        data = _serialize(key, tokenizer_json, tok)
    except (CompiledCacheError, ValueError, OverflowError, TypeError) as exc:
        # e.g. an id past int32, or a tokenizer.json holding values JSON cannot store again
        _warn(f"cannot cache this tokenizer ({exc}); it will be parsed again on the next load")
        return
    try:
        write_atomic(path, data)
    except OSError as exc:
        _warn(f"could not store the tokenizer cache in {path.parent} ({exc.strerror or exc}); the "
              f"tokenizer files will be parsed again on the next load")
        return
    _remove_stale(key)


def _remove_stale(key: CacheKey) -> None:
    """Cache files of the same directory under an older identity can never match again."""
    for old in key.path.parent.glob(f"{key.source}-*.bin"):
        if old.name != key.path.name:
            try:
                old.unlink()
            except OSError:
                pass


def _serialize(key: CacheKey, tokenizer_json: dict[str, Any], tok: "Tokenizer") -> bytes:
    model = tok.model
    tokens = list(model.vocab)
    joined = "".join(tokens)
    sep = next((c for c in _SEPARATORS if c not in joined), None)
    if sep is None:
        raise CompiledCacheError("no separator character is free in the vocabulary")
    table = list(tok._bytes)
    holes = [i for i, b in enumerate(table) if b is None] if None in table else []
    present = [b"" if b is None else b for b in table] if holes else table
    sections: dict[str, bytes] = {
        "vocab_text": sep.join(tokens).encode("utf-8", "surrogatepass"),
        "vocab_ids": array(_INT, model.vocab.values()).tobytes(),
        "merge_left": array(_INT, model.merge_table.left).tobytes(),
        "merge_right": array(_INT, model.merge_table.right).tobytes(),
        "merge_new": array(_INT, model.merge_table.new).tobytes(),
        "merge_rank": array(_INT, model.merge_table.rank).tobytes(),
        "bytes_ends": array(_INT, accumulate(map(len, present))).tobytes(),
        "bytes_holes": array(_INT, holes).tobytes(),
        "bytes_blob": b"".join(present),
    }
    offsets: dict[str, list[int]] = {}
    parts: list[bytes] = []
    pos = 0
    for name, raw in sections.items():
        offsets[name] = [pos, len(raw)]
        pad = -len(raw) % _ALIGN
        parts += [raw, b"\0" * pad]
        pos += len(raw) + pad
    spec_model = {k: v for k, v in tokenizer_json["model"].items() if k not in ("vocab", "merges")}
    spec_model.setdefault("type", "BPE")    # it was inferred from the merges, which are not kept
    header = {
        "key": key.identity, "byteorder": sys.byteorder, "itemsize": array(_INT).itemsize,
        "sep": sep, "counts": {"vocab": len(tokens), "merges": len(model.merge_table),
                               "ids": len(table)},
        "sections": offsets, "spec": {**tokenizer_json, "model": spec_model},
        "token_to_id_is_vocab_and_added": tok._token_to_id_is_vocab_and_added(),
    }
    head = json.dumps(header, allow_nan=True).encode("ascii")
    head += b" " * (-(len(head) + _PREFIX.size) % _ALIGN)
    return pack_cache_file(MAGIC, FORMAT_VERSION, head, b"".join(parts))


def _warn(message: str) -> None:
    warnings.warn(f"ignis: {message}", RuntimeWarning, stacklevel=4)
