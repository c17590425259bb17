"""The Qwen3 dense family: Qwen2's decoder (models/qwen2.py) with an RMSNorm over each head of q and
of k before rope (weights q_norm, k_norm of head_dim; GGUF attn_q_norm / attn_k_norm), no q/k/v
biases, and a head_dim the config gives independently of hidden_size / heads.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .family import Family
from .qwen2 import (GGUF_GLOBAL_TENSORS, GGUF_LAYER_TENSORS, OUTPUT_WEIGHTS, build_forward,
                    weight_shapes)
from .qwen2 import _check_attention as _qwen2_attention

if TYPE_CHECKING:
    from ..loader.config import ModelConfig


def _check_attention(d: dict[str, Any], n_layers: int, max_pos: int, path: str | None) -> None:
    """Qwen2's sliding-window rules, and attention_bias: true refused (transformers' Qwen3 then
    puts a bias on o_proj as well as on q/k/v, which ignis does not implement)."""
    bias = d.get("attention_bias", False)
    if bias not in (None, False):
        raise ConfigError(f"attention_bias {bias!r} on a Qwen3 model puts biases on q/k/v and o_proj; "
                          f"ignis implements Qwen3 without them", path=path, field="attention_bias")
    _qwen2_attention(d, n_layers, max_pos, path)


FAMILY = Family(
    name="qwen3", hf_architecture="Qwen3ForCausalLM",
    build=partial(build_forward, qk_norm=True), weight_shapes=partial(weight_shapes, qk_norm=True),
    output_weights=OUTPUT_WEIGHTS,
    gguf_global_tensors=GGUF_GLOBAL_TENSORS,
    gguf_layer_tensors={**{k: v for k, v in GGUF_LAYER_TENSORS.items() if not k.endswith(".bias")},
                        "attn_q_norm.weight": "self_attn.q_norm.weight",
                        "attn_k_norm.weight": "self_attn.k_norm.weight"},
    attention_bias=False,           # config.json's attention_bias: true is refused (_check_attention)
    gguf_rope_permuted=False,       # llama.cpp stores Qwen3's q/k rows as Hugging Face does
    check_attention=_check_attention,
    hf_config_extra=lambda c: {"attention_bias": False, "use_sliding_window": False},
)
