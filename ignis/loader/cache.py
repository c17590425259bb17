"""What the cache (IGNIS_HOME) holds, how much each part takes and when it was last used, and how to
shrink it: `ignis models`, `ignis rm`, `ignis prune`.

The cache holds, per model, its import (models/gguf-<sha256[:32]>/, or gguf-<sha256[:16]>/ or
models/<name>/ from older layouts, or any model directory placed there), the kept GGUF of a registry model (gguf/<name>.gguf),
its weight conversions (convert/<fmt>-<key>.safetensors) and its compiled tokenizer tables
(tokenizers/<hash of the directory>-*.bin). Last use is a file's mtime: loading a model touches its
ignis_import.json, reading a conversion touches the conversion, reading a kept GGUF (an import, a
conversion from its blocks) touches the GGUF -- one utime per load, nothing per token.

Removal never leaves a directory that loads as a valid import: an import is renamed aside in one step
(while holding its import lock), then deleted; a process that has the model open keeps its mapped
files until it exits. Only the direct entries of the cache's subdirectories are ever deleted (a
subdirectory may be a symlink to another disk); a symlink entry is removed as a link. What a killed
import or conversion left (hidden temporary files and directories) is listed, and pruned once it is
an hour old.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import IgnisError, ModelNotFoundError
from ..formats import FORMATS
from . import registry
from .provenance import PROVENANCE_FILE, gguf_digest, read_provenance, source_sha256

DAY = 86400.0
SUBDIRS = ("models", "gguf", "convert", "tokenizers", "steps")
LEFTOVER_AGE = 3600.0      # a temporary file untouched this long belongs to a killed process


class CacheError(IgnisError, ValueError):
    """A cache command was asked something it cannot do (a bad format, a path outside the cache)."""


@dataclass(frozen=True)
class CacheEntry:
    kind: str                   # "import", "gguf" (a kept source), "conversion", "tokenizer",
                                # "step" (a compiled step), "leftover" (of a killed import or
                                # conversion)
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
            return f"convert {self.format}" if self.format else "convert (unreadable)"
        if self.kind == "leftover":
            return f"leftover {self.path.parent.name}/{self.path.name}"
        if self.kind == "step":
            return "compiled step"
        return "tokenizer tables"


@dataclass
class CachedModel:
    """Everything in the cache that belongs to one model (one GGUF content, or one directory)."""
    names: list[str]                    # what `ignis rm` accepts: registry names, directory names
    entries: list[CacheEntry] = field(default_factory=list)
    title: str = "(orphaned)"           # the name shown when it has none (nothing `ignis rm` takes)

    @property
    def name(self) -> str:
        return self.names[0] if self.names else self.title

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)


# --- last use -----------------------------------------------------------------------------------

def mark_used(model_dir: str | Path) -> None:
    """Record that a cached model directory was loaded now (its ignis_import.json's mtime)."""
    if not Path(model_dir).is_symlink():
        touch(Path(model_dir) / PROVENANCE_FILE, entry=Path(model_dir))


def touch(path: str | Path, *, entry: str | Path | None = None) -> None:
    """Set `path`'s mtime (last use) to now when `entry` (default: `path`) is an entry of the cache.
    Cheap: one utime per load, nothing per token; fails silently (a read-only cache)."""
    try:
        if _in_cache(Path(entry if entry is not None else path)):
            os.utime(path)
    except OSError:
        pass            # last use only serves `ignis prune`


# --- listing ------------------------------------------------------------------------------------

def conversion_dir() -> Path:
    """Where the runtime caches converted weights (runtime/convert_cache.py writes there)."""
    return registry.ignis_home() / "convert"


def list_conversions() -> list[dict]:
    """Every conversion cache file: format, size, and the model directory it was made from."""
    from .safetensors import SafetensorsFile
    rows = []
    d = conversion_dir()
    for f in sorted(d.glob("*.safetensors")) if d.is_dir() else []:
        try:
            with SafetensorsFile(f) as st:
                meta = dict(st.metadata)
        except (IgnisError, OSError):
            meta = {}
        st = f.stat()
        rows.append({"path": f, "format": meta.get("ignis_convert"),   # None: unreadable
                     "source": meta.get("source"), "source_sha256": meta.get("source_sha256"),
                     "bytes": st.st_size, "last_used": st.st_mtime})
    return rows


def _in_cache(p: Path) -> bool:
    """Whether `p` is an entry of one of the cache's subdirectories (models/, gguf/, ...): its
    parent is that subdirectory, compared as normalised absolute paths, or both resolved (so a
    subdirectory linked to another disk, or a linked IGNIS_HOME, still counts)."""
    home = registry.ignis_home()
    parent = Path(os.path.normpath(os.path.abspath(p))).parent
    roots = [Path(os.path.normpath(os.path.abspath(home / d))) for d in SUBDIRS]
    if parent in roots:
        return True
    try:
        return parent.resolve() in [r.resolve() for r in roots]
    except OSError:
        return False


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


def _leftovers(home: Path) -> list[tuple[Path, Path | None]]:
    """Hidden temporary files and directories that killed imports, removals and conversions left
    (models/.gguf-*.importing-*, gguf/.NAME.gguf.*.tmp, convert/.*.safetensors.*.tmp, the
    compiled-step cache's steps/.*.bin.*.tmp, ...), each
    with the import whose lock a running writer of it holds (None: no lock guards it)."""
    out = []
    for sub in SUBDIRS:
        d = home / sub
        for p in sorted(d.iterdir()) if d.is_dir() else []:
            if not p.name.startswith(".") or p.name == ".gguf-index":     # the digest index stays
                continue
            target = None
            if sub == "models" and (m := _MODELS_TEMP.match(p.name)):
                target = d / m.group(1)
            elif sub == "gguf" and (m := _GGUF_TEMP.match(p.name)):
                entry = registry.REGISTRY.get(m.group(1))
                target = registry.import_dir(entry.sha256) if entry else None
            out.append((p, target))
    return out


_MODELS_TEMP = re.compile(r"\.(.+)\.(?:importing|removing|old)-\d+-[0-9a-f]+")
_GGUF_TEMP = re.compile(r"\.(.+)\.gguf\..*")


def _newest_mtime(p: Path) -> float:
    """The latest mtime in `p` (a directory being written to is recent though it is old)."""
    newest = _mtime(p)
    if p.is_dir() and not p.is_symlink():
        for root, _, files in os.walk(p):
            for f in files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, f)).st_mtime)
                except OSError:
                    pass
    return newest


def scan() -> list[CachedModel]:
    """Every model the cache holds something of, with its entries (sizes, last use), largest first."""
    home = registry.ignis_home()
    groups: dict[str, CachedModel] = {}
    by_dir: dict[str, str] = {}         # resolved import directory -> group key

    def group(key: str) -> CachedModel:
        if key not in groups:
            entry = registry.entry_for_sha256(key)
            groups[key] = CachedModel(names=[entry.name] if entry else [])
        return groups[key]

    models = home / "models"
    imported: set[str] = set()          # SHA-256s with a finished import
    present: set[str] = set()           # SHA-256s with a directory in models/
    for d in sorted(models.iterdir()) if models.is_dir() else []:
        if d.name.startswith(".") or not (d.is_dir() or d.is_symlink()):
            continue                    # leftovers: below
        prov = read_provenance(d)
        sha = source_sha256(prov)
        key = sha or str(d.resolve())
        g = group(key)
        g.names.append(d.name)
        by_dir[str(d.resolve())] = key
        by_dir[str(d.absolute())] = key
        present.add(key)
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

    for c in list_conversions():
        sha = c.get("source_sha256")
        src = c.get("source")
        if isinstance(sha, str) and len(sha) == 64:
            # no import of that file left, nor a registry model to pull it again: never read again
            key = sha
            orphaned = sha not in present and registry.entry_for_sha256(sha) is None
        elif isinstance(src, str) and src:
            key = by_dir.get(src, src)
            orphaned = key == src and not Path(src).is_dir()   # keyed by a path that is gone
        else:
            key, orphaned = "", True            # unreadable: never read again, prune drops it
        g = group(key)
        if not g.names and not orphaned and src:
            g.names.append(src)
        g.entries.append(CacheEntry("conversion", c["path"], c["bytes"], c["last_used"],
                                    format=c["format"], orphaned=orphaned))

    now = time.time()
    for p, target in _leftovers(home):
        last = _newest_mtime(p)
        keep = None
        if target is not None and registry.import_locked(target):
            keep = "its import is running"
        elif now - last < LEFTOVER_AGE:
            keep = "less than an hour old: may be in progress"
        groups.setdefault("(leftovers)", CachedModel(names=[], title="(interrupted)")).entries.append(
            CacheEntry("leftover", p, _tree_bytes(p), last, keep=keep, orphaned=keep is None))
    out = list(groups.values())
    for g in out:
        g.names = list(dict.fromkeys(g.names))
    return sorted(out, key=lambda g: (-g.bytes, g.name))


def scan_steps() -> CachedModel | None:
    """The compiled-step cache (steps/*.bin) as one group, or None when it holds nothing. A step is
    keyed by a config and the options that shape it, not by a model (two models of one architecture
    and size share theirs), so it belongs to no model: `ignis rm` leaves it, `ignis prune --days`
    takes it when unused that long (a load reads it back in a millisecond or compiles it again in
    ~0.05 s)."""
    d = registry.ignis_home() / "steps"
    files = [f for f in sorted(d.glob("*.bin")) if f.is_file() and not f.is_symlink()] \
        if d.is_dir() else []
    if not files:
        return None
    return CachedModel(names=[], title="(compiled steps)",
                       entries=[CacheEntry("step", f, _tree_bytes(f), _mtime(f)) for f in files])


# --- what rm and prune would remove -------------------------------------------------------------

# per weight format, the cache tags of its parts (ignis.formats: the records import no layer, so
# the loader may read them)
CONVERSION_FORMATS = {f.name: tuple(p.cache_name for p in f.parts) for f in FORMATS.values() if f.parts}


def find_model(spec: str, *, progress: bool = False) -> CachedModel:
    """The cached model `spec` names: a registry name, a directory name under models/ (as `ignis
    models` lists it), a .gguf file (matched by content) or a model directory (by path)."""
    models = scan()
    for m in models:
        if spec in m.names:
            return m
    p = Path(spec).expanduser()
    if p.is_file():
        sha = gguf_digest(p, progress=progress)
        entry = registry.entry_for_sha256(sha)
        for m in models:
            if any(e.kind == "import" and source_sha256(read_provenance(e.path)) == sha
                   for e in m.entries) \
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
    """What `ignis prune` removes: conversions, kept GGUFs and compiled steps not used for `days`
    days, and/or every
    conversion of a model but its most recently used format (q4 and its q8 part count as one);
    conversions that can never be read again and leftovers of killed processes over an hour old
    always. Imports are never pruned (`ignis rm` them),
    nor a kept GGUF that is the only way to load or rebuild its model."""
    if days is None and not keep_latest:
        raise CacheError("say what to prune: --days N (not used for N days) and/or --keep-latest")
    if days is not None and not days >= 0:         # also refuses NaN
        raise CacheError(f"--days must be 0 or more, got {days:g}")
    now = time.time() if now is None else now
    out: list[CacheEntry] = []
    steps = scan_steps()
    for m in scan() + ([steps] if steps else []):
        convs = [e for e in m.entries if e.kind == "conversion" and not e.orphaned]
        drop = {id(e) for e in m.entries if e.orphaned}
        if days is not None:
            cutoff = now - days * DAY
            drop |= {id(e) for e in m.entries if e.kind in ("conversion", "gguf", "step")
                     and e.keep is None and e.last_used < cutoff}
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
    """Delete `entries` (as planned above); returns the bytes freed. Refuses anything that is not
    an entry of the cache's subdirectories."""
    for e in entries:
        if not _in_cache(e.path):
            raise CacheError(f"refusing to delete {e.path}: it is not inside the cache "
                             f"{registry.ignis_home()}")
    freed = 0
    for e in sorted(entries, key=lambda e: e.kind != "import"):   # imports first: never half valid
        if e.kind == "import":
            if not registry.remove_import(e.path):
                raise CacheError(f"could not delete all of {e.path} (set aside, no longer "
                                 "loadable); remove it by hand")
        elif e.kind == "gguf":
            # pull assembles and reads a kept GGUF under its model's import lock: not while that runs
            entry = registry.REGISTRY.get(e.path.stem)
            with registry.import_lock(registry.import_dir(entry.sha256) if entry else e.path):
                _unlink(e.path)
        elif e.kind == "leftover" and e.path.is_dir() and not e.path.is_symlink():
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            _unlink(e.path)
        freed += e.bytes
    return freed


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass


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
