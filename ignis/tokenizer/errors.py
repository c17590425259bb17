"""Typed errors of the tokenizer: malformed tokenizer files, unsupported tokenizer kinds, bad ids,
and chat templates that fail to render."""
from __future__ import annotations

from ignis.errors import GGUFError, IgnisError


class TokenizerError(IgnisError, ValueError):
    """Base class of every error the tokenizer raises on purpose."""


class TokenizerFormatError(TokenizerError):
    """tokenizer.json / tokenizer_config.json is malformed (missing field, bad merge, ...)."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = str(path) if path is not None else None
        self.reason = message
        super().__init__(f"{message} (in {self.path!r})" if self.path else message)


class UnsupportedTokenizerError(TokenizerFormatError):
    """The tokenizer file is well formed but uses a model, normalizer or pre-tokenizer ignis lacks."""


class GGUFTokenizerError(GGUFError, TokenizerError):
    """A GGUF's tokenizer metadata is missing, malformed, or names a tokenizer ignis cannot rebuild."""


class TokenizerInputError(TokenizerError):
    """The text handed to encode cannot be tokenized (not a str, or it holds a lone surrogate)."""


class TokenIdError(TokenizerError, IndexError):
    """decode() was given an id that is not in the vocabulary."""


class ChatTemplateError(TokenizerError):
    """The chat template failed to render, or the messages handed to it are malformed."""


class CompiledCacheError(TokenizerError):
    """A compiled-tokenizer cache file is damaged or does not fit its tokenizer files. Never reaches
    callers of load_tokenizer: the cache is then skipped with a warning and the files are parsed."""
