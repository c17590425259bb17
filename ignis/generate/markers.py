"""Markers in streamed text: how much of a stream's end to hold back because it may be the start
of a marker still being written (stop strings, </think>, <tool_call>). One rule for every reader
of a stream, so none releases text another would have held."""
from __future__ import annotations

from typing import Sequence


def partial_suffix(text: str, markers: str | Sequence[str], start: int = 0) -> int:
    """Length of the longest end of text[start:] that is the beginning of one of `markers` and
    shorter than the longest of them (what a stream holds back: it may be the start of a
    marker; a whole marker is the caller's to find)."""
    if isinstance(markers, str):
        markers = (markers,)
    longest = max((len(m) for m in markers), default=0)
    for n in range(min(longest - 1, len(text) - start), 0, -1):
        tail = text[len(text) - n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0
