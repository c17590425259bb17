"""Frontends: one model family per module, each building the forward step as an IR graph."""
from ..errors import UnsupportedArchitectureError
from ..ir.graph import Graph
from ..loader.config import ModelConfig
from .qwen2 import build_forward as _qwen2_forward, weight_shapes

_BUILDERS = {"qwen2": _qwen2_forward, "llama": _qwen2_forward}


def build_graph(config: ModelConfig, output: str = "logits") -> Graph:
    """The forward-step graph for `config`'s architecture, ending in `logits` or (output="hidden")
    the final-norm hidden state."""
    try:
        builder = _BUILDERS[config.arch]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"no graph builder for architecture {config.arch!r}; ignis builds: "
            f"{', '.join(sorted(_BUILDERS))}") from None
    return builder(config, output)


__all__ = ["build_graph", "weight_shapes"]
