"""GPT-2's byte <-> unicode alphabet: every byte gets a printable character so BPE works on text.

Printable Latin-1 bytes map to themselves; the other 68 bytes map, in order, to U+0100 onwards.
"""
from __future__ import annotations


def _byte_to_char() -> list[str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR: list[str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
BYTE_ALPHABET: frozenset[str] = frozenset(BYTE_TO_CHAR)
# str.translate table: a latin-1 decoded byte string -> its alphabet spelling.
LATIN1_TO_ALPHABET: dict[int, str] = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def bytes_to_alphabet(data: bytes) -> str:
    """Spell raw bytes in the byte-level alphabet."""
    return data.decode("latin-1").translate(LATIN1_TO_ALPHABET)


def alphabet_to_bytes(token: str) -> bytes:
    """Raw bytes of a token, as Hugging Face's ByteLevel decoder reads it: a token with any
    character outside the alphabet (an added token like "<think> ") is taken as plain UTF-8."""
    try:
        return bytes([CHAR_TO_BYTE[c] for c in token])
    except KeyError:
        return token.encode("utf-8")
