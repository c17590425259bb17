"""Typed errors of the runtime: what a caller passed that a forward step cannot take."""
from __future__ import annotations

from ..errors import IgnisError


class RuntimeInputError(IgnisError, ValueError):
    """Tokens or engine options a forward step cannot take (empty, wrong type, out of range)."""


class TokenIdError(RuntimeInputError):
    """A token id is outside the model's vocabulary."""


class ContextOverflowError(RuntimeInputError):
    """The tokens would not fit in the KV cache; nothing was run."""
