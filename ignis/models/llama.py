"""The Llama family (SmolLM2, Llama 2, Llama 3.x, Mistral-style checkpoints): Qwen2's decoder
(models/qwen2.py) with q/k/v biases only when config.json asks, no sliding window, and q/k rows
that llama.cpp permutes for its rope layout. Llama 3's rope scaling is data (models/rope.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .family import Family
from .qwen2 import (GGUF_GLOBAL_TENSORS, GGUF_LAYER_TENSORS, OUTPUT_WEIGHTS, build_forward,
                    weight_shapes)

if TYPE_CHECKING:
    from ..loader.config import ModelConfig


def _check_attention(d: dict[str, Any], n_layers: int, max_pos: int, path: str | None) -> None:
    """LlamaForCausalLM has no window; a Llama config that declares one that can bite is refused."""
    window = d.get("sliding_window")
    if window is not None and window < max_pos:
        raise ConfigError(f"sliding_window {window} on a Llama model: attention limited to a "
                          f"window is not implemented (transformers' Llama ignores the key, "
                          f"which suggests a Mistral-style model under the wrong name)",
                          path=path, field="sliding_window")
    sliding = [i for i, t in enumerate(d.get("layer_types") or []) if t == "sliding_attention"]
    if sliding:
        raise ConfigError(f"layer_types marks layers {sliding[:8]} as sliding_attention; ignis "
                          f"implements full attention only", path=path, field="layer_types")


def _hf_config_extra(c: ModelConfig) -> dict[str, Any]:
    return {"attention_bias": c.attention_bias, "mlp_bias": False}


FAMILY = Family(
    name="llama", hf_architecture="LlamaForCausalLM",
    build=build_forward, weight_shapes=weight_shapes,
    output_weights=OUTPUT_WEIGHTS,
    gguf_global_tensors=GGUF_GLOBAL_TENSORS, gguf_layer_tensors=GGUF_LAYER_TENSORS,
    attention_bias=None,            # config.json's attention_bias (default false)
    gguf_rope_permuted=True,
    check_attention=_check_attention,
    hf_config_extra=_hf_config_extra,
)
