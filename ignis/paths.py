"""Where ignis keeps what it writes: the cache root (IGNIS_HOME, default ~/.cache/ignis), and how a
cache file is written there.

A leaf module, so the loader, tokenizer and runtime can all find the cache without importing each other.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
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


# A cache file's envelope (the tokenizer's and the compiled step's): magic, format version,
# header length, CRC-32 of the rest; then a UTF-8 JSON header and the payload.
CACHE_PREFIX = struct.Struct("<8sIII")


def pack_cache_file(magic: bytes, version: int, head: bytes, payload: bytes) -> bytes:
    body = head + payload
    return CACHE_PREFIX.pack(magic, version, len(head), zlib.crc32(body)) + body


def open_cache_file(data: bytes, magic: bytes, version: int, error: type[Exception],
                    kind: str) -> tuple[dict, memoryview]:
    """The header (parsed JSON) and payload of a cache file; error(message) when it is not a
    `kind` file of this version, fails its checksum or is cut short."""
    if len(data) < CACHE_PREFIX.size:
        raise error(f"file is {len(data)} bytes, shorter than its fixed header")
    got_magic, got_version, head_len, crc = CACHE_PREFIX.unpack_from(data)
    if got_magic != magic:
        raise error(f"not a {kind} file (bad magic)")
    if got_version != version:
        raise error(f"format {got_version}, expected {version}")
    body = memoryview(data)[CACHE_PREFIX.size:]
    if zlib.crc32(body) != crc:
        raise error("checksum mismatch (the file is damaged or was cut short)")
    if head_len > len(body):
        raise error("header runs past the end of the file")
    header = json.loads(bytes(body[:head_len]).decode("utf-8"))
    if not isinstance(header, dict):
        raise error("header is not a JSON object")
    return header, body[head_len:]
