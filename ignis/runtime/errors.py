"""Typed errors of the runtime: what a caller passed that a forward step cannot take."""
from __future__ import annotations

# The runtime's errors live in ignis.errors: the weight formats (ignis.formats, below the runtime)
# raise them too, and `import ignis` exports them without loading the C core
from ..errors import ContextOverflowError, RuntimeInputError, TokenIdError

__all__ = ["RuntimeInputError", "TokenIdError", "ContextOverflowError"]
