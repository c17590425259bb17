"""Weights converted for the kernels (q8 blocks, bf16 bits), cached once per source so later loads
mmap them instead of converting again.

A cache file lives at IGNIS_HOME/convert/<key>.safetensors. The key hashes what the conversion
depends on: the format and its version, the source files (absolute path, size, mtime) and the names
and shapes of the converted tensors, so a changed source or a new format version never reads a stale
file. Each converted tensor is stored as its raw bytes (U8, or U16 for bf16) under the weight's name.
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
    """The cache key, or None when the source has no files to identify it by (in-memory weights)."""
    files = getattr(weights, "files", None)
    if not files:
        return None
    h = hashlib.sha256()
    ident = {"format": fmt, "version": FORMAT_VERSIONS[fmt], "names": list(names),
             "shapes": [list(s) for s in shapes], "files": []}
    for f in files:
        st = os.stat(f.path)
        ident["files"].append([str(Path(f.path).resolve()), st.st_size, st.st_mtime_ns])
    h.update(json.dumps(ident, sort_keys=True).encode())
    return f"{fmt}-{h.hexdigest()[:32]}"


def load_or_convert(fmt: str, weights, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                    convert: Callable[[], Converted]) -> Converted:
    """The converted weights for `names` (None where a weight stays f32): from the cache when a file
    for exactly this source exists, else `convert()` and store the result for next time."""
    key = cache_key(fmt, weights, names, shapes)
    if key is None:
        return convert()
    path = cache_dir() / f"{key}.safetensors"
    if path.is_file():
        got = _read(path, fmt, names, shapes)
        if got is not None:
            return got
    out = convert()
    _write(path, fmt, key, names, out, Path(weights.files[0].path).parent)
    return out


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
           source_dir: Path) -> None:
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
        rows.append({"path": f, "format": meta.get("ignis_convert", "?"),
                     "source": meta.get("source"), "bytes": f.stat().st_size})
    return rows
