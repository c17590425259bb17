"""The record an import leaves in its directory (ignis_import.json) and the file hash it is keyed by.

Kept apart from gguf_import so that opening an already imported model never imports the gguf
package (which takes longer to import than the model takes to open).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

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
