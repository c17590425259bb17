"""Typed errors of the runtime: what a caller passed that a forward step cannot take."""
from __future__ import annotations

# RuntimeInputError lives in ignis.errors: the weight formats (ignis.formats, below the runtime)
# raise it too
from ..errors import RuntimeInputError

__all__ = ["RuntimeInputError", "TokenIdError", "ContextOverflowError"]


class TokenIdError(RuntimeInputError):
    """A token id is outside the model's vocabulary."""


class ContextOverflowError(RuntimeInputError):
    """The tokens would not fit in the KV cache; nothing was run."""
