"""Frontends: one model family per module, each declaring what ignis knows of it (config rules,
weights, GGUF names) and building the forward step as an IR graph. FAMILIES is the registry the
loader, the GGUF importer and the runtime consult."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnsupportedArchitectureError
from ..ir.graph import Graph
from . import gemma3, llama, qwen2, qwen3
from .family import Family

if TYPE_CHECKING:
    from ..loader.config import ModelConfig

FAMILIES: dict[str, Family] = {f.name: f for f in (qwen2.FAMILY, llama.FAMILY, qwen3.FAMILY,
                                                   gemma3.FAMILY)}


def build_graph(config: ModelConfig, output: str = "logits") -> Graph:
    """The forward-step graph for `config`'s architecture, ending in `logits` or (output="hidden")
    the final-norm hidden state."""
    try:
        family = FAMILIES[config.arch]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"no graph builder for architecture {config.arch!r}; ignis builds: "
            f"{', '.join(sorted(FAMILIES))}") from None
    return family.build(config, output)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of `config` reads (and a checkpoint of it must hold), by Hugging Face
    name, with its shape."""
    return FAMILIES[config.arch].weight_shapes(config)


__all__ = ["FAMILIES", "Family", "build_graph", "weight_shapes"]
