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
    """The prompt does not fit the context window with room to generate: it fills the context
    (`max_tokens` None), or the caller asked for `max_tokens` more tokens than the context has room
    for after it. The message follows the OpenAI API's (clients match on its wording)."""

    def __init__(self, prompt_tokens: int, n_ctx: int, max_tokens: int | None = None):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.param = "messages"
        self.code = "context_length_exceeded"
        if max_tokens is None:
            asked = f"However, the prompt resulted in {prompt_tokens} tokens"
            fix = "Please reduce the length of the prompt"
        else:
            asked = (f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} "
                     f"in the prompt, {max_tokens} in the completion)")
            fix = "Please reduce the length of the prompt or max_tokens"
        super().__init__(f"This model's maximum context length is {n_ctx} tokens. {asked}. {fix}, "
                         f"or load the model with a larger n_ctx (ignis.load(..., n_ctx=N)).")


class GenerationCancelled(GenerationError):
    """The generation was stopped from outside (cancel_when's event was set): whoever asked for it
    is gone, so it ends without a result."""


class ModelBusyError(GenerationError, RuntimeError):
    """This thread still has an unfinished stream on the same model."""
