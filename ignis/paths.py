"""Where ignis keeps what it writes: the cache root (IGNIS_HOME, default ~/.cache/ignis), and how a
cache file is written there.

A leaf module, so the loader, tokenizer and runtime can all find the cache without importing each other.
"""
from __future__ import annotations

import os
from pathlib import Path


def ignis_home() -> Path:
    """The cache root: $IGNIS_HOME, else ~/.cache/ignis."""
    env = os.environ.get("IGNIS_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ignis"


def write_atomic(path: Path, data: bytes) -> None:
    """Store data at path as a whole or not at all: a temp file beside it (mode 0644, not
    mkstemp's 0600: an ordinary cache file), then rename over path. Raises OSError; the temp file
    never stays behind."""
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
