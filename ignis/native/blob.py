"""The data a compiled library carries: one sectioned blob, embedded with the assembler's .incbin.

Layout (little endian), read by csrc/native/runtime.c:
  0   magic b"IGNBLOB\\0"
  8   u32 BLOB_VERSION, u32 number of sections
  16  per section: 4-byte tag, u32 0, u64 offset (from the blob's start), u64 length
  then the sections, each starting on a multiple of ALIGN bytes.
Tags: MODL (the compiled step: modl.py), EMBD (the embedding step: modl.py's format, output
width the hidden size), CONF (JSON: generation defaults and model metadata),
TOKN (the tokenizer: ignis.native.tokenizer_blob), CHAT (the chat template's C renderer:
ignis.native.chat_blob). A reader ignores tags it does not know.
"""
from __future__ import annotations

import struct

MAGIC = b"IGNBLOB\0"
BLOB_VERSION = 1
ALIGN = 64
_ENTRY = struct.Struct("<4sIQQ")


def pack_blob(sections: dict[str, bytes]) -> bytes:
    """The blob of `sections` (tag -> bytes, in order; tags are 4 ASCII characters)."""
    for tag in sections:
        if len(tag) != 4 or not tag.isascii():
            raise ValueError(f"section tag {tag!r} must be 4 ASCII characters")
    head = len(MAGIC) + 8 + _ENTRY.size * len(sections)
    at = -(-head // ALIGN) * ALIGN
    table, body = bytearray(), bytearray()
    for tag, data in sections.items():
        table += _ENTRY.pack(tag.encode("ascii"), 0, at, len(data))
        pad = -len(data) % ALIGN
        body += bytes(data) + b"\0" * pad
        at += len(data) + pad
    out = MAGIC + struct.pack("<II", BLOB_VERSION, len(sections)) + table
    return bytes(out) + b"\0" * (-len(out) % ALIGN) + bytes(body)


def unpack_blob(blob: bytes) -> dict[str, bytes]:
    """The sections of a blob (for tests and `ignis` tools); ValueError when it is malformed."""
    if blob[:8] != MAGIC or len(blob) < 16:
        raise ValueError("not an ignis blob (bad magic)")
    version, n = struct.unpack_from("<II", blob, 8)
    if version != BLOB_VERSION:
        raise ValueError(f"blob version {version}, this ignis reads {BLOB_VERSION}")
    out = {}
    for i in range(n):
        tag, _, off, length = _ENTRY.unpack_from(blob, 16 + i * _ENTRY.size)
        if off + length > len(blob):
            raise ValueError(f"section {tag!r} runs past the blob's end")
        out[tag.decode("ascii")] = blob[off:off + length]
    return out
