"""Streaming detokenizer: ids in one at a time, text out in pieces that never split a character.

Pieces hold whole grapheme clusters: a UTF-8 character spread over several tokens (CJK, emoji) and a
cluster spread over several characters (ZWJ emoji sequences, skin tones, combining marks) come out
whole. The last cluster is held back until the next one starts or finish() is called, because any
character may still be extended by a combining mark. The pieces concatenate to exactly decode(ids).
"""
from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from ignis.tokenizer.tokenizer import Tokenizer

_GRAPHEME = regex.compile(r"\X")


class StreamDecoder:
    """Feed ids with push(); each call returns the text that became final (possibly "")."""

    def __init__(self, tokenizer: "Tokenizer", *, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # The incremental decoder keeps an incomplete UTF-8 sequence until its next bytes arrive and
        # replaces invalid bytes exactly as bytes.decode("utf-8", "replace") would on the whole.
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self._done = False

    def push(self, token_id: int) -> str:
        """Add one id; return the text that is now complete."""
        if self._done:
            raise RuntimeError("StreamDecoder.push() after finish(); make a new decoder")
        if self._skip and token_id in self._tokenizer.special_ids:
            self._tokenizer.token_bytes(token_id)  # still reject ids outside the vocabulary
            return ""
        text = self._held + self._utf8.decode(self._tokenizer.token_bytes(token_id))
        if not text:
            return ""
        # Hold back the last grapheme cluster: it may still grow.
        last = None
        for last in _GRAPHEME.finditer(text):
            pass
        cut = last.start() if last is not None else 0
        self._held = text[cut:]
        return text[:cut]

    def push_many(self, ids: list[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def finish(self) -> str:
        """The rest of the text (an unfinished UTF-8 sequence becomes U+FFFD)."""
        if self._done:
            return ""
        self._done = True
        text = self._held + self._utf8.decode(b"", final=True)
        self._held = ""
        return text
