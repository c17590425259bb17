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


def context_length_message(n_ctx: int, prompt_tokens: int, max_tokens: int | None = None,
                           field: str = "prompt") -> str:
    """The OpenAI API's words for a prompt that does not fit (clients match on "maximum context
    length is N tokens"), `field` naming what holds the prompt ("messages" or "prompt"), and how to
    get a longer context from ignis."""
    if max_tokens is None:
        asked = (f"However, your {field} resulted in {prompt_tokens} tokens, which leaves no room "
                 f"for a completion. Please reduce the length of the {field}.")
    else:
        asked = (f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in "
                 f"the {field}, {max_tokens} in the completion). Please reduce the length of the "
                 f"{field} or completion.")
    return (f"This model's maximum context length is {n_ctx} tokens. {asked} (ignis: the model "
            f"was loaded with n_ctx={n_ctx}; load it with a larger one, ignis.load(..., n_ctx=N) or "
            f"--ctx N, for a longer context.)")


class ContextLengthExceeded(GenerationError, ValueError):
    """The prompt does not fit the context window with room to generate: it fills the context
    (`max_tokens` None), or the caller asked for `max_tokens` more tokens than the context has room
    for after it. `field` names what holds the prompt in the request ("prompt", "messages"); the
    message is context_length_message's."""

    def __init__(self, prompt_tokens: int, n_ctx: int, max_tokens: int | None = None,
                 field: str = "prompt"):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.param = field
        self.code = "context_length_exceeded"
        super().__init__(context_length_message(n_ctx, prompt_tokens, max_tokens, field))


class GenerationCancelled(GenerationError):
    """The generation was stopped from outside (cancel_when's event was set): whoever asked for it
    is gone, so it ends without a result."""


class ModelBusyError(GenerationError, RuntimeError):
    """This thread still has an unfinished stream on the same model."""
