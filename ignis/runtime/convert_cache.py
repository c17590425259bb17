"""Weights converted for the kernels (q8 blocks, bf16 bits), cached once per source so later loads
mmap them instead of converting again.

A cache file lives at IGNIS_HOME/convert/<key>.safetensors. The key hashes what the conversion
depends on: the format and its version, the source (an imported GGUF's SHA-256, else the files'
absolute path, size and mtime) and the names and shapes of the converted tensors, so a changed source
or a new format version never reads a stale file. Each converted tensor is stored as its raw bytes (U8, or U16 for bf16) under the weight's name.
The cache is an optimisation: a cache that cannot be read or written is bypassed with a warning.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import IgnisError
from ..loader.provenance import read_provenance, source_record
from ..loader.provenance import source_sha256 as provenance_sha256
from ..loader.safetensors import SafetensorsFile, SafetensorsWriter

# Bump when a format's bytes change (rounding, layout): old cache files are then never matched.
# q8 3: the packed layout (quant.pack_q8); q8 4, q4 2: half scales
FORMAT_VERSIONS = {"q8": 4, "bf16": 1, "q4": 2, "q4-q8": 2, "gguf": 3}
_STORED = {"q8": ("U8", np.dtype("u1")), "bf16": ("U16", np.dtype("<u2")), "q4": ("U8", np.dtype("u1")),
           "q4-q8": ("U8", np.dtype("u1")),   # q4-q8: the weights a q4 model keeps in q8
           "gguf": ("U8", np.dtype("u1"))}    # gguf: gguf_blocks.Layout (its layout id in metadata)

Converted = list  # list[np.ndarray | None], aligned with the tape's weight names


def cache_dir() -> Path:
    from ..loader.registry import ignis_home
    return ignis_home() / "convert"


def cache_key(fmt: str, weights, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> str | None:
    """The cache key, or None when the source has no files to identify it by (in-memory weights).

    An import of a GGUF file is identified by the file's content (its SHA-256, recorded in the
    import), so every directory holding that import -- a copy under another name, an import kept
    from an older cache layout -- shares one conversion. Other sources by path, size and mtime."""
    files = getattr(weights, "files", None)
    if not files:
        return None
    h = hashlib.sha256()
    ident = {"format": fmt, "version": FORMAT_VERSIONS[fmt], "names": list(names),
             "shapes": [list(s) for s in shapes], "files": []}
    sha = source_sha256(weights)
    if sha is not None:
        prov = read_provenance(Path(files[0].path).parent) or {}
        # the importer's versions: a re-import by another dequantizer may differ in the last bit
        ident["source_sha256"] = sha
        ident["import"] = [prov.get("ignis_version"), prov.get("gguf_package_version"),
                           [os.stat(f.path).st_size for f in files]]
        del ident["files"]
    else:
        for f in files:
            st = os.stat(f.path)
            ident["files"].append([str(Path(f.path).resolve()), st.st_size, st.st_mtime_ns])
    h.update(json.dumps(ident, sort_keys=True).encode())
    return f"{fmt}-{h.hexdigest()[:32]}"


def _legacy_key(fmt: str, weights, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> str:
    """The key caches written before content keys used (path, size, mtime): found once, renamed."""
    ident = {"format": fmt, "version": FORMAT_VERSIONS[fmt], "names": list(names),
             "shapes": [list(s) for s in shapes], "files": []}
    for f in weights.files:
        st = os.stat(f.path)
        ident["files"].append([str(Path(f.path).resolve()), st.st_size, st.st_mtime_ns])
    return f"{fmt}-{hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]}"


def source_sha256(weights) -> str | None:
    """The SHA-256 of the GGUF file these weights were imported from (one model.safetensors in an
    import directory with its ignis_import.json), else None."""
    files = getattr(weights, "files", None)
    if not files or len(files) != 1:
        return None
    return provenance_sha256(read_provenance(Path(files[0].path).parent))


_DESCRIBE = {"q8": "q8", "q4": "q4", "q4-q8": "q8 (the q4 model's q8 part)", "bf16": "bf16",
             "gguf": "the GGUF file's blocks"}


def load_or_convert(fmt: str, weights, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                    convert: Callable[[], Converted], *, progress: bool = False) -> Converted:
    """The converted weights for `names` (None where a weight stays f32): from the cache when a file
    for exactly this source exists, else `convert()` and store the result for next time. A hit
    marks the file used (its mtime: `ignis prune` drops what was not used for days)."""
    from ..loader.progress import status
    key = cache_key(fmt, weights, names, shapes)
    if key is None:
        with status(f"converting the weights to {_DESCRIBE[fmt]}", progress):
            return convert()
    path = cache_dir() / f"{key}.safetensors"
    if not path.is_file() and source_sha256(weights) is not None:
        legacy = cache_dir() / f"{_legacy_key(fmt, weights, names, shapes)}.safetensors"
        if legacy.is_file():
            try:
                os.replace(legacy, path)
            except OSError:
                path = legacy
    if path.is_file():
        got = _read(path, fmt, names, shapes)
        if got is not None:
            _touch(path)
            return got
    if fmt == "gguf":           # the blocks come from the source GGUF: bring it back if pruned
        from ..loader.registry import ensure_source
        ensure_source(Path(weights.files[0].path).parent, progress=progress)
    with status(f"converting the weights to {_DESCRIBE[fmt]} (once: kept in the cache for the next "
                f"loads)", progress):
        out = convert()
        if fmt == "gguf":       # read the kept GGUF's blocks: it was used now
            from ..loader.cache import touch
            src = source_record(read_provenance(Path(weights.files[0].path).parent))
            if isinstance(src.get("path"), str):
                touch(src["path"])
        _write(path, fmt, key, names, out, Path(weights.files[0].path).parent, source_sha256(weights))
    return out


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass        # a read-only cache: last use is only for `ignis prune`


def _read(path: Path, fmt: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> Converted | None:
    stored, view = _STORED[fmt]
    try:
        f = SafetensorsFile(path)
        if f.metadata.get("ignis_convert") != fmt:
            return None
        layouts = json.loads(f.metadata.get("layouts", "{}")) if fmt == "gguf" else {}
        if fmt == "gguf":
            from .gguf_blocks import Layout, packed_x16_bytes
        out: Converted = []
        for n, shape in zip(names, shapes):
            if n not in f:
                out.append(None)
                continue
            raw = f.tensor(n)
            if f.info(n).dtype != stored:
                return None
            if fmt == "gguf":
                lay = Layout(int(layouts[n]), raw.view(view))
                if raw.size != packed_x16_bytes(lay.fmt, *shape):
                    raise ValueError(f"{n}: {raw.size} bytes, not a layout of shape {list(shape)}")
                out.append(lay)
                continue
            out.append(raw.view(view))      # zero copy: the mmap'd bytes are the kernel's layout
        return out
    except (IgnisError, OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"ignis: ignoring unreadable conversion cache {path}: {e!r}", RuntimeWarning,
                      stacklevel=3)
        return None


def _write(path: Path, fmt: str, key: str, names: Sequence[str], converted: Converted,
           source_dir: Path, source_sha: str | None = None) -> None:
    stored, _ = _STORED[fmt]
    specs, arrays, layouts = [], [], {}
    for n, a in zip(names, converted):
        if a is None:
            continue
        if fmt == "gguf":
            layouts[n] = a.fmt
            a = a.packed
        raw = np.ascontiguousarray(a).view(np.uint8 if stored == "U8" else np.uint16)
        specs.append((n, stored, tuple(raw.shape)))
        arrays.append((n, raw))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"ignis_convert": fmt, "key": key, "source": str(Path(source_dir).resolve())}
        if source_sha:
            meta["source_sha256"] = source_sha
        if layouts:
            meta["layouts"] = json.dumps(layouts)
        with SafetensorsWriter(path, specs, meta) as w:
            for n, raw in arrays:
                w.write(n, raw)
    except (IgnisError, OSError) as e:
        warnings.warn(f"ignis: could not store converted weights in {path} ({e}); they will be "
                      f"converted again on the next load", RuntimeWarning, stacklevel=3)


def list_cached() -> list[dict]:
    """Every conversion cache file: format, size, and the model directory it was made from."""
    rows = []
    for f in sorted(cache_dir().glob("*.safetensors")) if cache_dir().is_dir() else []:
        try:
            with SafetensorsFile(f) as st:
                meta = dict(st.metadata)
        except (IgnisError, OSError):
            meta = {}
        st = f.stat()
        rows.append({"path": f, "format": meta.get("ignis_convert", "?"),
                     "source": meta.get("source"), "source_sha256": meta.get("source_sha256"),
                     "bytes": st.st_size, "last_used": st.st_mtime})
    return rows
