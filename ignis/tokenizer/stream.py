"""Streaming detokenizer: ids in one at a time, text out in pieces that never split a character.

Pieces hold whole grapheme clusters: a UTF-8 character spread over several tokens (CJK, emoji, a
run of SentencePiece byte-fallback tokens, held until the run ends as its decoder needs) and a
cluster spread over several characters (ZWJ emoji sequences, skin tones, combining marks) come out
whole. The last cluster is held back until the next one starts or finish() is called, because any
character may still be extended by a combining mark. The pieces concatenate to exactly decode(ids).
The generation loop drives the same decoder one level lower (add / final_end / take), holding text
back from stop strings too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from ignis.tokenizer.tokenizer import Tokenizer

_GRAPHEME = regex.compile(r"\X")


class StreamDecoder:
    """Feed ids with push(); each call returns the text that became final (possibly "").

    `text` is every complete character decoded so far and text[:emitted] what has been handed out.
    A caller with rules of its own for what is final (stop strings) uses add(), which decodes an
    id without releasing anything, and take(end), which releases text up to `end`."""

    def __init__(self, tokenizer: "Tokenizer", *, skip_special_tokens: bool = False,
                 continuation: bool = False):
        """continuation: the ids continue text decoded before (a completion after its prompt's
        text): the text is what decoding both gives past the prompt's text, as Hugging Face's
        text-generation pipeline and vLLM return it, so a SentencePiece decoder's Strip of the
        leading space (Llama 2, Mistral) does not eat the completion's first space."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # The tokenizer's decoder, one id at a time: it keeps bytes whose text is not known yet (an
        # incomplete UTF-8 sequence, a run of byte-fallback tokens) and gives exactly the text
        # decoding all ids at once would.
        self._state = tokenizer.decoder.stream(continuation)
        self.text = ""
        self.emitted = 0
        self._done = False

    def add(self, token_id: int) -> int:
        """Decode one id into `text` and release nothing; returns where its text starts."""
        start = len(self.text)
        tok = self._tokenizer
        data = tok.token_bytes(token_id)        # rejects ids outside the vocabulary
        if not (self._skip and token_id in tok.special_ids):
            self.text += self._state.feed(data, tok.is_byte_token(token_id),
                                          tok.id_to_token(token_id))
        return start

    @property
    def whole(self) -> bool:
        """No byte waits for the rest of its character: every id added has all its text in `text`."""
        return not self._state.pending

    def final_end(self) -> int:
        """Where the last grapheme cluster after `emitted` starts (len(text) if there is none): it
        may still grow, so only the text before it is final. The clusters are found in the context
        of the whole text, as segmenting all of it would find them."""
        last = None
        for last in _GRAPHEME.finditer(self.text, self.emitted):
            pass
        return last.start() if last is not None else len(self.text)

    def take(self, end: int) -> str:
        """Release text[emitted:end] ("" when end is not past emitted)."""
        if end <= self.emitted:
            return ""
        piece = self.text[self.emitted:end]
        self.emitted = end
        return piece

    def flush(self) -> None:
        """No more ids: an unfinished UTF-8 sequence becomes U+FFFD in `text`."""
        self.text += self._state.flush()

    def push(self, token_id: int) -> str:
        """Add one id; return the text that is now complete."""
        if self._done:
            raise RuntimeError("StreamDecoder.push() after finish(); make a new decoder")
        self.add(token_id)
        return self.take(self.final_end())

    def push_many(self, ids: list[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def finish(self) -> str:
        """The rest of the text (an unfinished UTF-8 sequence becomes U+FFFD)."""
        if self._done:
            return ""
        self._done = True
        self.flush()
        return self.take(len(self.text))
