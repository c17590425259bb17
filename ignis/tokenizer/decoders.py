"""Decoders of a tokenizer.json: ids -> text exactly as Hugging Face tokenizers' decoder chain does it,
whole (decode) and one id at a time (the streaming detokenizer's incremental state).

Two kinds are known:
- ByteLevel: every token stands for raw bytes (the byte alphabet), the text is their UTF-8 decoding
  with invalid bytes replaced (from_utf8_lossy, which is Python's errors="replace").
- SentencePiece-style: Sequence[Replace("▁" -> " ")..., ByteFallback, Fuse, Strip(" ", n, 0)] (Gemma,
  Llama 2, Mistral) or Metaspace. A token is text, except the byte-fallback tokens "<0xNN>": a run of
  consecutive ones is decoded as one UTF-8 string, or, when the run is not valid UTF-8, becomes one
  U+FFFD per byte (tokenizers' ByteFallback). Strip then removes the leading spaces of the fused text
  (the space SentencePiece prepends); Metaspace drops the replacement characters of the first token.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any, Iterable

from ignis.tokenizer.bytelevel import alphabet_to_bytes_many
from ignis.tokenizer.errors import TokenizerFormatError, UnsupportedTokenizerError


def byte_fallback_value(token: str) -> int | None:
    """The byte a "<0xNN>" token stands for, as tokenizers' ByteFallback reads it: exactly six
    UTF-8 bytes, "<0x" + two characters Rust's u8::from_str_radix(_, 16) accepts + ">"."""
    if len(token) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    digits = token[3:5]
    body = digits[1:] if digits.startswith("+") else digits     # from_str_radix takes one "+"
    if not body or not all(c in "0123456789abcdefABCDEF" for c in body):
        return None
    return int(body, 16)


class ByteLevelDecoder:
    """tokenizers' ByteLevel decoder (also what ignis does when tokenizer.json names no decoder)."""
    byte_level = True

    def token_bytes_many(self, tokens: Iterable[str]) -> list[bytes]:
        return alphabet_to_bytes_many(tokens)

    def stream(self, continuation: bool = False) -> "_ByteLevelStream":
        return _ByteLevelStream()           # nothing depends on where the text starts


class _ByteLevelStream:
    """Incremental ByteLevel decoding: an unfinished UTF-8 sequence waits for its next bytes,
    invalid bytes are replaced exactly as decoding the whole would."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, is_byte: bool, token: str) -> str:
        return self._utf8.decode(data)

    @property
    def pending(self) -> bool:
        return bool(self._utf8.getstate()[0])

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


@dataclass(frozen=True)
class PieceDecoder:
    """A SentencePiece-style decoder chain, reduced to what it does to each token and to the text.

    replacements: (pattern, content) string replacements applied to every token, in order, before
    ByteFallback. byte_fallback: "<0xNN>" tokens are bytes. strip_left: how many leading `strip`
    characters are removed from the fused text. metaspace: a Metaspace decoder (its replacement is
    the first of `replacements`): the first token loses every replacement character instead."""
    replacements: tuple[tuple[str, str], ...]
    byte_fallback: bool
    strip: str = " "
    strip_left: int = 0
    metaspace: bool = False
    byte_level = False

    def token_text(self, token: str) -> str:
        for pattern, content in self.replacements:
            token = token.replace(pattern, content)
        return token

    def token_bytes_many(self, tokens: Iterable[str]) -> list[bytes]:
        """Each token's bytes: the byte of a byte-fallback token, else its text as UTF-8."""
        out: list[bytes] = []
        for tok in tokens:
            text = self.token_text(tok)
            b = byte_fallback_value(text) if self.byte_fallback else None
            out.append(bytes((b,)) if b is not None else text.encode("utf-8"))
        return out

    def strip_start(self, text: str) -> str:
        """text without the leading `strip` characters Strip removes (at most strip_left)."""
        n = 0
        while n < self.strip_left and n < len(text) and text[n] == self.strip:
            n += 1
        return text[n:]

    def is_byte_token(self, token: str) -> bool:
        return self.byte_fallback and byte_fallback_value(self.token_text(token)) is not None

    def stream(self, continuation: bool = False) -> "_PieceStream":
        """continuation: the ids continue text already decoded (a completion after its prompt):
        Strip and Metaspace, which act on the start of the text, have nothing left to remove."""
        return _PieceStream(self, continuation)


class _PieceStream:
    """Incremental PieceDecoder: a run of byte tokens is held until a text token (or the end)
    closes it, because the whole run decides between its UTF-8 text and U+FFFD per byte."""

    def __init__(self, decoder: PieceDecoder, continuation: bool = False):
        self._d = decoder
        self._run = bytearray()
        self._strip_left = 0 if continuation else decoder.strip_left
        self._first = not continuation

    @property
    def pending(self) -> bool:
        return bool(self._run)

    def _close_run(self) -> str:
        if not self._run:
            return ""
        try:
            text = self._run.decode("utf-8")
        except UnicodeDecodeError:
            text = "\ufffd" * len(self._run)
        self._run.clear()
        return text

    def _emit(self, text: str) -> str:
        """text less the leading `strip` characters still to remove: Strip works on the fused
        text, so its count runs over the pieces until a character that is not `strip`."""
        n = 0
        while self._strip_left and n < len(text):
            if text[n] != self._d.strip:
                self._strip_left = 0
                break
            n += 1
            self._strip_left -= 1
        return text[n:] if n else text

    def feed(self, data: bytes, is_byte: bool, token: str) -> str:
        """The text one token adds: data is its bytes (token_bytes_many), is_byte whether it is a
        byte token, token the token itself."""
        first, self._first = self._first, False
        if is_byte:
            self._run += data
            return ""
        if first and self._d.metaspace:
            text = token.replace(self._d.replacements[0][0], "")
        else:
            text = data.decode("utf-8")
        return self._emit(self._close_run() + text)

    def flush(self) -> str:
        return self._emit(self._close_run())


Decoder = ByteLevelDecoder | PieceDecoder


def build_decoder(spec: dict[str, Any] | None, *, byte_level: bool,
                  path: str | None = None) -> Decoder:
    """The decoder a tokenizer.json names. byte_level: the pre-tokenizer maps text to the byte
    alphabet (then only ByteLevel, or no decoder, fits)."""
    kind = spec.get("type") if isinstance(spec, dict) else spec
    if byte_level:
        if spec is not None and kind != "ByteLevel":
            raise UnsupportedTokenizerError(
                f"decoder {kind!r} is not supported with a ByteLevel pre-tokenizer; ignis supports "
                f"ByteLevel", path=path)
        return ByteLevelDecoder()
    if spec is None or not isinstance(spec, dict):
        raise UnsupportedTokenizerError(
            f"decoder {kind!r} is not supported for a tokenizer without a ByteLevel pre-tokenizer; "
            f"ignis supports Sequence[Replace, ByteFallback, Fuse, Strip] and Metaspace", path=path)
    steps = spec.get("decoders", []) if kind == "Sequence" else [spec]
    names = [s.get("type") if isinstance(s, dict) else s for s in steps]
    replacements: list[tuple[str, str]] = []
    byte_fallback = fused = metaspace = False
    strip_left = 0
    strip_char = " "
    order_ok = True
    for s, name in zip(steps, names):
        if name == "Replace":
            pattern = (s.get("pattern") or {}).get("String")
            content = s.get("content")
            if not isinstance(pattern, str) or not isinstance(content, str):
                raise UnsupportedTokenizerError(
                    f"decoder Replace {s.get('pattern')!r} is not supported (ignis knows String "
                    f"patterns)", path=path)
            order_ok &= not (byte_fallback or fused)
            replacements.append((pattern, content))
        elif name == "ByteFallback":
            order_ok &= not (byte_fallback or fused)
            byte_fallback = True
        elif name == "Fuse":
            fused = True
        elif name == "Strip":
            content, start, stop = s.get("content", " "), s.get("start", 0), s.get("stop", 0)
            if not isinstance(content, str) or len(content) != 1 or stop != 0 \
                    or not isinstance(start, int) or start < 0:
                raise UnsupportedTokenizerError(
                    f"decoder Strip {s!r} is not supported (ignis knows a strip of leading "
                    f"characters)", path=path)
            # Strip works per token: after Fuse that is the whole text, which is all ignis knows.
            order_ok &= fused and strip_left == 0
            strip_left, strip_char = start, content
        elif name == "Metaspace":
            replacement = s.get("replacement", "\u2581")
            scheme = s.get("prepend_scheme", "always" if s.get("add_prefix_space", True) else "never")
            if not isinstance(replacement, str) or len(replacement) != 1:
                raise TokenizerFormatError(f"Metaspace replacement {replacement!r} is not one character",
                                           path=path)
            order_ok &= len(steps) == 1
            replacements.append((replacement, " "))
            metaspace = scheme != "never"
        else:
            raise UnsupportedTokenizerError(
                f"decoder {name!r} is not supported for this tokenizer (ignis knows Replace, "
                f"ByteFallback, Fuse, Strip, Metaspace)", path=path)
    if not order_ok:
        raise UnsupportedTokenizerError(
            f"decoder chain {names} is not supported (ignis knows Replace..., ByteFallback, Fuse, "
            f"Strip in that order, or Metaspace alone)", path=path)
    return PieceDecoder(tuple(replacements), byte_fallback, strip_char, strip_left, metaspace)
