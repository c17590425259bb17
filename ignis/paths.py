"""Where ignis keeps what it writes: the cache root (IGNIS_HOME, default ~/.cache/ignis).

A leaf module, so the loader, tokenizer and runtime can all find the cache without importing each other.
"""
from __future__ import annotations

import os
from pathlib import Path


def ignis_home() -> Path:
    """The cache root: $IGNIS_HOME, else ~/.cache/ignis."""
    env = os.environ.get("IGNIS_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ignis"
