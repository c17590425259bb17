"""The record an import leaves in its directory (ignis_import.json), the file hash it is keyed by
(remembered per file in IGNIS_HOME/models/.gguf-index/) and what identifies opened weights.

Kept apart from gguf_import so that opening an already imported model never imports the gguf
package (which takes longer to import than the model takes to open).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..paths import ignis_home

PROVENANCE_FILE = "ignis_import.json"
# 2: records generation_defaults, so a changed registry default re-imports
PROVENANCE_FORMAT = 2


def read_provenance(model_dir: str | Path) -> dict[str, Any] | None:
    """ignis_import.json of an imported directory, or None when absent or unreadable."""
    try:
        d = json.loads((Path(model_dir) / PROVENANCE_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("format") == PROVENANCE_FORMAT else None


def source_record(prov: dict[str, Any] | None) -> dict[str, Any]:
    """The record's "source" object ({} when absent or damaged: a hand-edited file is not trusted)."""
    src = prov.get("source") if isinstance(prov, dict) else None
    return src if isinstance(src, dict) else {}


def source_sha256(prov: dict[str, Any] | None) -> str | None:
    """The SHA-256 of the GGUF file an import was made from, when it recorded a well-formed one."""
    sha = source_record(prov).get("sha256")
    ok = isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)
    return sha if ok else None


def file_sha256(path: str | Path, *, chunk: int = 1 << 22, progress: bool = False,
                desc: str | None = None) -> str:
    """The file's SHA-256 (hex); with progress, a bar on a terminal (a 0.5 GB file takes ~2 s)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if not progress:
            for block in iter(lambda: f.read(chunk), b""):
                h.update(block)
            return h.hexdigest()
        from .progress import bar
        with bar(os.fstat(f.fileno()).st_size, desc or f"checking {Path(path).name}", progress) as b:
            for block in iter(lambda: f.read(chunk), b""):
                h.update(block)
                b.update(len(block))
    return h.hexdigest()


# --- the digest index: a large GGUF is hashed once per (absolute path, size, mtime) -------------

def _index_file(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return ignis_home() / "models" / ".gguf-index" / f"{key}.json"


def _stat_key(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def known_digest(path: str | Path) -> str | None:
    """The SHA-256 remembered for `path` as it is now (same size and mtime), else None."""
    path = Path(path)
    try:
        rec = json.loads(_index_file(path).read_text("utf-8"))
        now = _stat_key(path)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or {k: rec.get(k) for k in ("path", "size", "mtime_ns")} != now:
        return None
    digest = rec.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def remember_digest(path: str | Path, digest: str) -> None:
    """Record `path`'s SHA-256 for known_digest (only a speed-up: failures are ignored)."""
    path = Path(path)
    try:
        f = _index_file(path)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f"{f.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps({**_stat_key(path), "sha256": digest}), "utf-8")
        os.replace(tmp, f)
    except OSError:
        pass


def gguf_digest(path: str | Path, *, progress: bool = False) -> str:
    """`path`'s SHA-256: remembered, else hashed (with a bar on a terminal) and remembered."""
    digest = known_digest(path)
    if digest is None:
        digest = file_sha256(path, progress=progress, desc=f"hashing {Path(path).name}")
        remember_digest(path, digest)
    return digest


# --- what identifies opened weights ---------------------------------------------------------------

@dataclass(frozen=True)
class WeightsSource:
    """What identifies a checkpoint's bytes, read once when it is opened: conversions cached from
    it are keyed by this, so an Engine built later (Model.embed's) still finds its key after
    `ignis rm` deleted the files it has mapped."""
    directory: str                              # the files' directory, resolved
    files: tuple[tuple[str, int, int], ...]     # (resolved path, size, mtime_ns) per file
    sha256: str | None = None                   # an import's GGUF file (one model.safetensors)
    importer: tuple[Any, Any] | None = None     # that import's (ignis_version, gguf_package_version)


def weights_source(weights: Any) -> WeightsSource | None:
    """The WeightsSource of opened weights (a WeightStore), or None when they have no files."""
    files = getattr(weights, "files", None)
    if not files:
        return None
    stats = []
    for f in files:
        st = os.stat(f.path)
        stats.append((str(Path(f.path).resolve()), st.st_size, st.st_mtime_ns))
    directory = Path(files[0].path).parent
    prov = read_provenance(directory) if len(files) == 1 else None
    sha = source_sha256(prov)
    if sha is None:
        return WeightsSource(str(directory.resolve()), tuple(stats))
    return WeightsSource(str(directory.resolve()), tuple(stats), sha,
                         (prov.get("ignis_version"), prov.get("gguf_package_version")))
