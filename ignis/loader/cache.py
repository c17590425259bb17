"""What the cache (IGNIS_HOME) holds, how much each part takes and when it was last used, and how to
shrink it: `ignis models`, `ignis rm`, `ignis prune`.

The cache holds, per model, its import (models/gguf-<sha256[:16]>/, or models/<name>/ from older
layouts, or any model directory placed there), the kept GGUF of a registry model (gguf/<name>.gguf),
its weight conversions (convert/<fmt>-<key>.safetensors) and its compiled tokenizer tables
(tokenizers/<hash of the directory>-*.bin). Last use is a file's mtime: loading a model touches its
ignis_import.json, reading a conversion touches the conversion, reading a kept GGUF (an import, a
conversion from its blocks) touches the GGUF -- one utime per load, nothing per token.

Removal never leaves a directory that loads as a valid import: an import is renamed aside in one step
(while holding its import lock), then deleted; a process that has the model open keeps its mapped
files until it exits. Nothing outside IGNIS_HOME is ever deleted: a symlink is removed as a link.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import IgnisError, ModelNotFoundError
from . import registry
from .provenance import PROVENANCE_FILE, read_provenance, source_sha256

DAY = 86400.0


class CacheError(IgnisError, ValueError):
    """A cache command was asked something it cannot do (a bad format, a path outside the cache)."""


@dataclass(frozen=True)
class CacheEntry:
    kind: str                   # "import", "gguf" (a kept source), "conversion", "tokenizer"
    path: Path
    bytes: int
    last_used: float            # seconds since the epoch
    format: str | None = None   # conversions: q8, bf16, q4, q4-q8, gguf
    keep: str | None = None     # why `ignis prune` keeps it whatever its age (None: it may go)
    orphaned: bool = False      # can never be read again (its source is gone): prune drops it

    @property
    def label(self) -> str:
        if self.kind == "import":
            return f"import {self.path.name}"
        if self.kind == "gguf":
            return f"gguf {self.path.name} (kept source)"
        if self.kind == "conversion":
            return f"convert {self.format}"
        return "tokenizer tables"


@dataclass
class CachedModel:
    """Everything in the cache that belongs to one model (one GGUF content, or one directory)."""
    names: list[str]                    # what `ignis rm` accepts: registry names, directory names
    entries: list[CacheEntry] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.names[0] if self.names else "(orphaned)"

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)


# --- last use -----------------------------------------------------------------------------------

def mark_used(path: str | Path) -> None:
    """Record that a cached model directory was loaded now (its ignis_import.json's mtime). Cheap:
    one utime; does nothing outside IGNIS_HOME or without the file."""
    p = Path(path) / PROVENANCE_FILE
    try:
        if _inside(p, registry.ignis_home()):
            os.utime(p)
    except OSError:
        pass            # read-only cache: last use only serves `ignis prune`


def touch(path: str | Path) -> None:
    try:
        if _inside(Path(path), registry.ignis_home()):
            os.utime(path)
    except OSError:
        pass


# --- listing ------------------------------------------------------------------------------------

def _inside(p: Path, home: Path) -> bool:
    """Whether `p` itself (not what a symlink at p points to) lies in `home`."""
    try:
        parent = p.parent.resolve()
        root = home.resolve()
    except OSError:
        return False
    return parent == root or root in parent.parents


def _tree_bytes(p: Path) -> int:
    """Bytes under `p`, never following symlinks (a link counts as nothing)."""
    if p.is_symlink() or not p.is_dir():
        try:
            return 0 if p.is_symlink() else p.stat().st_size
        except OSError:
            return 0
    total = 0
    for root, dirs, files in os.walk(p):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, f)):
                total += st.st_size
    return total


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _sha_of(prov: dict | None) -> str | None:
    return source_sha256(prov)


def _tokenizer_source(directory: Path) -> str:
    # as ignis.tokenizer.compiled.source_key names a directory's tables
    return hashlib.sha256(str(Path(os.path.abspath(directory))).encode("utf-8", "surrogatepass")
                          ).hexdigest()[:16]


def _packages_installed(entry: registry.RegistryEntry) -> bool:
    try:
        registry.locate_parts(entry)
        return True
    except ModelNotFoundError:
        return False


def scan() -> list[CachedModel]:
    """Every model the cache holds something of, with its entries (sizes, last use), largest first."""
    from ..runtime.convert_cache import list_cached
    home = registry.ignis_home()
    groups: dict[str, CachedModel] = {}
    by_dir: dict[str, str] = {}         # resolved import directory -> group key

    def group(key: str) -> CachedModel:
        if key not in groups:
            entry = registry.entry_for_sha256(key)
            groups[key] = CachedModel(names=[entry.name] if entry else [])
        return groups[key]

    models = home / "models"
    imported: set[str] = set()
    for d in sorted(models.iterdir()) if models.is_dir() else []:
        if d.name.startswith(".") or not (d.is_dir() or d.is_symlink()):
            continue
        prov = read_provenance(d)
        sha = _sha_of(prov)
        key = sha or str(d.resolve())
        g = group(key)
        g.names.append(d.name)
        by_dir[str(d.resolve())] = key
        by_dir[str(d.absolute())] = key
        if sha and registry.find_import(sha) is not None:
            imported.add(sha)
        last = _mtime(d / PROVENANCE_FILE) if (d / PROVENANCE_FILE).is_file() else _mtime(d)
        g.entries.append(CacheEntry("import", d, _tree_bytes(d), last))
        tok = home / "tokenizers"
        if tok.is_dir():
            for t in tok.glob(f"{_tokenizer_source(d)}-*.bin"):
                g.entries.append(CacheEntry("tokenizer", t, _tree_bytes(t), _mtime(t)))

    kept = home / "gguf"
    for f in sorted(kept.glob("*.gguf")) if kept.is_dir() else []:
        entry = registry.REGISTRY.get(f.stem)
        key = entry.sha256 if entry else str(f.resolve())
        keep = None
        if entry is None:
            keep = "not a registry model's file"
        elif entry.sha256 not in imported:
            keep = "the only source of this model (no import)"
        elif not _packages_installed(entry):
            keep = "its packages are not installed: it could not be rebuilt"
        g = group(key)
        if not g.names:
            g.names.append(f.stem)
        g.entries.append(CacheEntry("gguf", f, _tree_bytes(f), _mtime(f), keep=keep))

    for c in list_cached():
        sha = c.get("source_sha256")
        src = c.get("source") or ""
        key = sha if isinstance(sha, str) and len(sha) == 64 else by_dir.get(src, src)
        orphaned = key == src and not Path(src).is_dir()   # keyed by a path that is gone
        g = group(key)
        if not g.names and not orphaned and src:
            g.names.append(src)
        g.entries.append(CacheEntry("conversion", c["path"], c["bytes"], c["last_used"],
                                    format=c["format"], orphaned=orphaned))
    out = list(groups.values())
    for g in out:
        g.names = list(dict.fromkeys(g.names))
    return sorted(out, key=lambda g: (-g.bytes, g.name))


# --- what rm and prune would remove -------------------------------------------------------------

CONVERSION_FORMATS = {"q8": ("q8",), "bf16": ("bf16",), "q4": ("q4", "q4-q8"), "gguf": ("gguf",)}


def find_model(spec: str, *, progress: bool = False) -> CachedModel:
    """The cached model `spec` names: a registry name, a directory name under models/ (as `ignis
    models` lists it), a .gguf file (matched by content) or a model directory (by path)."""
    models = scan()
    for m in models:
        if spec in m.names:
            return m
    p = Path(spec).expanduser()
    if p.is_file():
        from .resolve import _known_digest
        from .provenance import file_sha256
        sha = _known_digest(p) or file_sha256(p, progress=progress, desc=f"hashing {p.name}")
        entry = registry.entry_for_sha256(sha)
        for m in models:
            if any(e.kind == "import" and _sha_of(read_provenance(e.path)) == sha for e in m.entries) \
                    or (entry is not None and entry.name in m.names):
                return m
    elif p.is_dir():
        target = str(p.resolve())
        for m in models:
            if target in m.names or any(e.kind == "import" and str(e.path.resolve()) == target
                                        for e in m.entries):
                return m
    raise ModelNotFoundError(f"nothing in the cache ({registry.ignis_home()}) is {spec!r}; "
                             "`ignis models` lists what is there")


def plan_rm(spec: str, fmt: str | None = None, *, progress: bool = False) -> list[CacheEntry]:
    """What `ignis rm SPEC [--format FMT]` removes: everything of the model, or its conversions to FMT."""
    if fmt is not None and fmt not in CONVERSION_FORMATS:
        raise CacheError(f"--format must be one of {', '.join(CONVERSION_FORMATS)} (f32 is the import "
                         f"itself: `ignis rm MODEL` removes it), got {fmt!r}")
    model = find_model(spec, progress=progress)
    if fmt is None:
        return list(model.entries)
    return [e for e in model.entries if e.kind == "conversion" and e.format in CONVERSION_FORMATS[fmt]]


def plan_prune(*, days: float | None = None, keep_latest: bool = False,
               now: float | None = None) -> list[CacheEntry]:
    """What `ignis prune` removes: conversions and kept GGUFs not used for `days` days, and/or every
    conversion of a model but its most recently used format (q4 and its q8 part count as one);
    conversions that can never be read again always. Imports are never pruned (`ignis rm` them),
    nor a kept GGUF that is the only way to load or rebuild its model."""
    if days is None and not keep_latest:
        raise CacheError("say what to prune: --days N (not used for N days) and/or --keep-latest")
    if days is not None and (days != days or days < 0):
        raise CacheError(f"--days must be a number of days >= 0, got {days}")
    now = time.time() if now is None else now
    out: list[CacheEntry] = []
    for m in scan():
        convs = [e for e in m.entries if e.kind == "conversion"]
        drop = {id(e) for e in convs if e.orphaned}
        if days is not None:
            cutoff = now - days * DAY
            drop |= {id(e) for e in m.entries if e.kind in ("conversion", "gguf") and e.keep is None
                     and e.last_used < cutoff}
        if keep_latest and convs:
            family = lambda e: "q4" if e.format == "q4-q8" else e.format   # noqa: E731
            latest = family(max(convs, key=lambda e: e.last_used))
            newest_file = {}
            for e in sorted(convs, key=lambda e: -e.last_used):
                newest_file.setdefault(e.format, e)
            drop |= {id(e) for e in convs if family(e) != latest or newest_file[e.format] is not e}
        out += [e for e in m.entries if id(e) in drop]
    return out


# --- removal ------------------------------------------------------------------------------------

def remove(entries: list[CacheEntry]) -> int:
    """Delete `entries` (as planned above); returns the bytes freed. Refuses anything outside
    IGNIS_HOME."""
    home = registry.ignis_home()
    for e in entries:
        if not _inside(e.path, home):
            raise CacheError(f"refusing to delete {e.path}: it is not inside the cache {home}")
    freed = 0
    for e in sorted(entries, key=lambda e: e.kind != "import"):   # imports first: never half valid
        if e.kind == "import":
            _remove_dir(e.path)
        elif e.kind == "gguf":
            # pull assembles and reads a kept GGUF under its model's import lock: not while that runs
            entry = registry.REGISTRY.get(e.path.stem)
            with registry.import_lock(registry.import_dir(entry.sha256) if entry else e.path):
                _unlink(e.path)
        else:
            _unlink(e.path)
        freed += e.bytes
    return freed


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass


def _remove_dir(d: Path) -> None:
    if d.is_symlink():
        d.unlink()                      # the link only: what it points to is not the cache's
        return
    with registry.import_lock(d):
        trash = d.parent / f".{d.name}.removing-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(d, trash)
        except FileNotFoundError:
            return
        except OSError:
            # Cannot rename (odd filesystems): make it invalid first, then delete in place.
            (d / PROVENANCE_FILE).unlink(missing_ok=True)
            trash = d
        shutil.rmtree(trash, ignore_errors=True)
        if trash.exists():
            raise CacheError(f"could not delete all of {trash} (set aside, no longer loadable); "
                             "remove it by hand")


def describe_age(last_used: float, now: float | None = None) -> str:
    age = (time.time() if now is None else now) - last_used
    if age < DAY:
        return "today"
    n = int(age // DAY)
    return f"{n} day{'s' if n != 1 else ''} ago"


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.1f} {unit}"
    return f"{n} B"
