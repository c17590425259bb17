"""ignis — a CPU inference engine for open LLMs, built the way a compiler is built.

    import ignis
    model = ignis.load("qwen2.5-coder-0.5b-instruct")
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__
from .api.load import load, pull
from .errors import (ConfigError, ContextOverflowError, GGUFError, HashMismatchError, IgnisError,
                     ModelFormatError, ModelNotFoundError, ModelPackagesMissingError,
                     RuntimeInputError, SafetensorsError, TokenIdError,
                     UnsupportedArchitectureError)

if TYPE_CHECKING:
    from .api.client import Client
    from .api.model import Model

__all__ = [
    "__version__", "load", "pull", "compile", "Client", "Model",
    "IgnisError", "ModelFormatError", "SafetensorsError", "GGUFError", "HashMismatchError",
    "ConfigError", "UnsupportedArchitectureError", "ModelNotFoundError", "ModelPackagesMissingError",
    "RuntimeInputError", "TokenIdError", "ContextOverflowError", "GenerationError",
    "InvalidParameterError", "ContextLengthExceeded", "GenerationCancelled", "ModelBusyError",
]

def compile(model, out_dir, *, weights: str = "auto", ctx: int | None = None,
            embed_weights: bool = False, progress: bool = True):
    """Compile `model` (registry name, model directory, .gguf file or a loaded model) into out_dir:
    a native library with the C ABI of ignis_model.h, its weights and manifest (ignis.native).
    weights: "auto" or a weight format, as ignis.load takes; ctx: the KV context (default: the
    model's maximum, capped at 4096); embed_weights: the weights inside the library (one file)
    instead of weights.bin beside it. Returns an ignis.native.CompileResult."""
    from .native import compile_model
    return compile_model(model, out_dir, weights=weights, ctx=ctx, embed_weights=embed_weights,
                         progress=progress)


# Generation's errors, importable from the top (`except ignis.ContextLengthExceeded`); resolved on
# first use (ignis.generate.errors imports neither the runtime nor the C core)
_LAZY_ERRORS = {
    "GenerationError": "generate.errors", "InvalidParameterError": "generate.errors",
    "ContextLengthExceeded": "generate.errors", "GenerationCancelled": "generate.errors",
    "ModelBusyError": "generate.errors",
}


def __getattr__(name: str):
    # The client and the Model class import the runtime: only when asked for.
    if name == "Client":
        from .api.client import Client
        return Client
    if name == "Model":
        from .api.model import Model
        return Model
    if name in _LAZY_ERRORS:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY_ERRORS[name]}", __name__), name)
    raise AttributeError(f"module 'ignis' has no attribute {name!r}")
