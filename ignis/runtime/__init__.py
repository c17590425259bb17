"""The runtime: a compiled forward step run by the C executor over one arena, with a KV cache."""
from .engine import Engine, EngineOptions, compile_engine_step
from .errors import ContextOverflowError, RuntimeInputError, TokenIdError

__all__ = ["Engine", "EngineOptions", "compile_engine_step", "ContextOverflowError",
           "RuntimeInputError", "TokenIdError"]
