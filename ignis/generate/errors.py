"""Typed errors of generation: invalid sampling parameters and prompts that do not fit the context."""
from __future__ import annotations

from ..errors import IgnisError


class GenerationError(IgnisError):
    """Base class of the errors generation raises on purpose."""


class InvalidParameterError(GenerationError, ValueError):
    """A sampling or request parameter is out of range or of the wrong type. `param` names it
    (OpenAI's spelling), `code` is a short machine-readable reason."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value"):
        self.param = param
        self.code = code
        super().__init__(message)


class ContextLengthExceeded(GenerationError, ValueError):
    """The prompt does not leave room for one generated token in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.param = "messages"
        self.code = "context_length_exceeded"
        super().__init__(
            f"the prompt has {prompt_tokens} tokens but the context holds {n_ctx} positions, "
            f"leaving no room to generate; shorten the prompt or load the model with a larger n_ctx "
            f"(ignis.load(..., n_ctx=N))")


class GenerationCancelled(GenerationError):
    """The generation was stopped from outside (cancel_when's event was set): whoever asked for it
    is gone, so it ends without a result."""


class ModelBusyError(GenerationError, RuntimeError):
    """This thread still has an unfinished stream on the same model."""
