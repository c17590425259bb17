"""Weights converted for the kernels (q8 blocks, bf16 bits), cached once per source so later loads
mmap them instead of converting again.

A cache file lives at IGNIS_HOME/convert/<key>.safetensors, one per Part of a weight format
(ignis.formats: its tag, version, packing and label come from there). The key hashes what the
conversion depends on: the part's tag and version, the source (an imported GGUF's SHA-256, else the
files' absolute path, size and mtime) and the names and shapes of the converted tensors, so a changed
source or a new format version never reads a stale file. Each converted tensor is stored as its raw
bytes (U8, or U16 for bf16) under the weight's name.
The cache is an optimisation: a cache that cannot be read or written is bypassed with a warning.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import IgnisError
from ..formats import Converted, Part
from ..loader.cache import conversion_dir, touch
from ..loader.provenance import WeightsSource, weights_source
from ..loader.safetensors import SafetensorsFile, SafetensorsWriter

_STORED = {np.dtype("u1"): "U8", np.dtype("<u2"): "U16"}     # a packing's dtype in the file


cache_dir = conversion_dir      # IGNIS_HOME/convert (loader/cache.py lists and prunes it)


def cache_key(part: Part, source: WeightsSource | None, names: Sequence[str],
              shapes: Sequence[tuple[int, ...]], *, by_path: bool = False) -> str | None:
    """The cache key, or None when the weights have no files to identify them by (in memory).

    An import of a GGUF file is identified by the file's content (its SHA-256, recorded in the
    import), so every directory holding that import -- a copy under another name, an import kept
    from an older cache layout -- shares one conversion. Other sources (and, with by_path, the
    key caches written before content keys used) by path, size and mtime."""
    if source is None:
        return None
    fmt = part.cache_name
    ident = {"format": fmt, "version": part.cache_version, "names": list(names),
             "shapes": [list(s) for s in shapes], "files": []}
    if source.sha256 is not None and not by_path:
        # the importer's versions: a re-import by another dequantizer may differ in the last bit
        ident["source_sha256"] = source.sha256
        ident["import"] = [*source.importer, [size for _, size, _ in source.files]]
        del ident["files"]
    else:
        ident["files"] = [list(f) for f in source.files]
    return f"{fmt}-{hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]}"


def load_or_convert(part: Part, weights, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                    convert: Callable[[], Converted], *, progress: bool = False,
                    source: WeightsSource | None = None) -> Converted:
    """The converted weights of one Part for `names` (None where a weight stays f32): from the
    cache when a file for exactly this source exists, else `convert()` and store the result for
    next time. A hit marks the file used (its mtime: `ignis prune` drops what was not used for
    days). `source` identifies the weights as they were opened (ModelFiles.source; else read from
    them now)."""
    from ..loader.progress import status
    source = source if source is not None else weights_source(weights)
    key = cache_key(part, source, names, shapes)
    if key is None:
        with status(f"converting the weights to {part.label}", progress):
            return convert()
    path = cache_dir() / f"{key}.safetensors"
    if not path.is_file() and source.sha256 is not None:
        got = _migrate(cache_dir() / f"{cache_key(part, source, names, shapes, by_path=True)}"
                                     f".safetensors", path, part, key, names, shapes, source)
        if got is not None:
            return got
    if path.is_file():
        got = _read(path, part, names, shapes)
        if got is not None:
            touch(path)
            return got
    gguf = None
    if part.reads_gguf:         # the blocks come from the source GGUF: bring it back if pruned
        from ..loader.registry import ensure_source
        gguf = ensure_source(Path(source.directory), progress=progress)
    with status(f"converting the weights to {part.label} (once: kept in the cache for the next "
                f"loads)", progress):
        out = convert()
        if gguf is not None:
            touch(gguf)         # read the kept GGUF's blocks: it was used now
        _write(path, part, key, names, out, source)
    return out


def _migrate(legacy: Path, path: Path, part: Part, key: str, names: Sequence[str],
             shapes: Sequence[tuple[int, ...]], source: WeightsSource) -> Converted | None:
    """A conversion of this import stored under the path-keyed name of older caches: written anew
    under its content key with this source's metadata (its SHA-256: listed and pruned with the
    import whatever becomes of the directory it was made from), then the old file removed."""
    if not legacy.is_file():
        return None
    got = _read(legacy, part, names, shapes)
    if got is not None and _write(path, part, key, names, got, source):
        legacy.unlink(missing_ok=True)
    return got


def _read(path: Path, part: Part, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> Converted | None:
    packing = part.packing
    try:
        f = SafetensorsFile(path)
        if f.metadata.get("ignis_convert") != part.cache_name:
            return None
        # a family of layouts (x16) records each weight's sub-layout id
        layouts = json.loads(f.metadata.get("layouts", "{}")) if packing.layout_type else {}
        out: Converted = []
        for n, shape in zip(names, shapes):
            if n not in f:
                out.append(None)
                continue
            raw = f.tensor(n)
            if f.info(n).dtype != _STORED[packing.dtype]:
                return None
            layout = int(layouts[n]) if packing.layout_type else 0
            if raw.nbytes != packing.packed_bytes(*shape, layout):
                raise ValueError(f"{n}: {raw.nbytes} bytes, not a {packing.name} matrix of shape "
                                 f"{list(shape)}")
            # zero copy: the mmap'd bytes are the kernel's layout
            out.append(packing.wrap(layout, raw.view(packing.dtype)))
        return out
    except (IgnisError, OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"ignis: ignoring unreadable conversion cache {path}: {e!r}", RuntimeWarning,
                      stacklevel=3)
        return None


def _write(path: Path, part: Part, key: str, names: Sequence[str], converted: Converted,
           source: WeightsSource) -> bool:
    """Store `converted` at `path`; False (with a warning) when the cache cannot be written."""
    packing = part.packing
    stored = _STORED[packing.dtype]
    specs, arrays, layouts = [], [], {}
    for n, a in zip(names, converted):
        if a is None:
            continue
        layout, a = packing.unwrap(a)
        if packing.layout_type:
            layouts[n] = layout
        raw = np.ascontiguousarray(a).view(packing.dtype)
        specs.append((n, stored, tuple(raw.shape)))
        arrays.append((n, raw))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"ignis_convert": part.cache_name, "key": key, "source": source.directory}
        if source.sha256:
            meta["source_sha256"] = source.sha256
        if layouts:
            meta["layouts"] = json.dumps(layouts)
        with SafetensorsWriter(path, specs, meta) as w:
            for n, raw in arrays:
                w.write(n, raw)
    except (IgnisError, OSError) as e:
        warnings.warn(f"ignis: could not store converted weights in {path} ({e}); they will be "
                      f"converted again on the next load", RuntimeWarning, stacklevel=3)
        return False
    return True
