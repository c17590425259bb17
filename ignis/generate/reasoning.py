"""Reasoning: the `<think>...</think>` part of a thinking model's answer (Qwen3, and models whose
templates open a think block), split from the answer whole or streamed, as `reasoning_content`
(the field vLLM and DeepSeek's API use).

A chat template is a thinking one when it writes `<think>`. The answer's reasoning starts either
with the model's own `<think>` (Qwen3) or in the prompt (a template that ends its generation
prompt with an open `<think>`); it runs to `</think>`, and an answer cut before that is all
reasoning. Whitespace between the tags and the text is not part of either.
"""
from __future__ import annotations

from .markers import partial_suffix

OPEN, CLOSE = "<think>", "</think>"
_WS = " \t\r\n"


def is_thinking_template(template: str | None) -> bool:
    return bool(template) and OPEN in template and CLOSE in template


def opens_in_prompt(prompt: str) -> bool:
    """The rendered prompt ends inside a think block (its last <think> is not closed)."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class ReasoningSplitter:
    """feed(text) -> [(kind, text)] with kind "reasoning" or "content", in order; finish() gives
    what was held back. `reasoning` and `content` hold the whole parts (None when empty)."""

    def __init__(self, *, open_in_prompt: bool = False):
        self._state = "reasoning" if open_in_prompt else "start"
        self._buf = ""
        self._held = ""           # whitespace that may end the reasoning
        self._lead = True         # at the start of a part: its leading whitespace is dropped
        self._parts: dict[str, list[str]] = {"reasoning": [], "content": []}

    @property
    def reasoning(self) -> str | None:
        return "".join(self._parts["reasoning"]) or None

    @property
    def content(self) -> str | None:
        return "".join(self._parts["content"]) or None

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole answer as (reasoning, content)."""
        self.feed(text)
        self.finish()
        return self.reasoning, self.content

    def _out(self, kind: str, text: str, out: list[tuple[str, str]]) -> None:
        if self._lead:
            text = text.lstrip(_WS)
            if not text:
                return
            self._lead = False
        if kind == "reasoning":      # trailing space waits: it may be the space before </think>
            body = text.rstrip(_WS)
            text, held = self._held + body, text[len(body):]
            if not body:
                self._held += held
                return
            self._held = held
        if text:
            self._parts[kind].append(text)
            out.append((kind, text))

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._buf += text
        while self._buf:
            if self._state == "start":
                t = self._buf.lstrip(_WS)
                if t.startswith(OPEN):
                    self._buf = t[len(OPEN):]
                    self._state = "reasoning"
                    continue
                if OPEN.startswith(t):          # nothing yet, or part of <think>
                    return out
                self._state = "content"
                continue
            if self._state == "reasoning":
                i = self._buf.find(CLOSE)
                if i < 0:
                    keep = partial_suffix(self._buf, CLOSE)
                    self._out("reasoning", self._buf[:len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                self._out("reasoning", self._buf[:i], out)
                self._held = ""
                self._buf = self._buf[i + len(CLOSE):]
                self._state = "content"
                self._lead = True
                continue
            self._out("content", self._buf, out)
            self._buf = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._buf:
            if self._state == "start":       # only space or part of <think>: plain text
                self._state = "content"
            self._out(self._state, self._buf, out)
            self._buf = ""
        return out

