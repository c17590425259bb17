"""What a model family declares, in one record: the loader, the GGUF importer and the graph builder
read a family's differences from here instead of branching on its name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

if TYPE_CHECKING:   # a type only: the loader reads families, so a family never imports the loader
    from ..ir.graph import Graph
    from ..loader.config import ModelConfig


@dataclass(frozen=True)
class Family:
    # ignis's arch name = Hugging Face model_type = GGUF general.architecture
    name: str
    hf_architecture: str            # config.json `architectures` class name
    build: Callable[[ModelConfig, str], Graph]      # (config, output) -> forward-step graph
    # every tensor a model of the config reads, by Hugging Face name, with its shape
    weight_shapes: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    # what the output projection may read (lm_head, or a tied embedding)
    output_weights: tuple[str, ...]
    gguf_global_tensors: Mapping[str, str]  # GGUF name -> Hugging Face name
    gguf_layer_tensors: Mapping[str, str]   # the same in layer N ("blk.N." -> "model.layers.N.")
    # q/k biases fixed by the family (Qwen2: always), or None: config.json's attention_bias says
    attention_bias: bool | None
    # llama.cpp's converter permutes the q/k rows of this family for its rope layout
    gguf_rope_permuted: bool
    # config.json rules beyond the shared ones: (config dict, n_layers, max_position_embeddings,
    # path) -> None, raising ConfigError for attention ignis does not implement (sliding windows)
    check_attention: Callable[[dict[str, Any], int, int, str | None], None]
    # the keys of this family that ModelConfig.to_hf_dict writes beside the shared ones
    hf_config_extra: Callable[[ModelConfig], dict[str, Any]]
    # config.json's model_type when it differs from `name` (Gemma 3: gemma3_text, GGUF gemma3)
    hf_model_type: str | None = None
    # the activation of the gated MLP: the config.json key naming it and the values ignis runs
    hidden_act_key: str = "hidden_act"
    hidden_acts: tuple[str, ...] = ("silu", "swish")
    # config.json keys this family reads beyond the shared ones (exempt from the shared refusals)
    config_keys: frozenset[str] = frozenset()
    # the rope is given per layer type (rope_parameters.{full,sliding}_attention): the sliding
    # layers' base is read as ModelConfig.rope_local_theta
    rope_per_layer_type: bool = False
    # (config dict, n_layers, path) -> further ModelConfig fields this family reads (Gemma 3: layer
    # types, window, attention scale), raising ConfigError for values ignis does not run
    read_config: Callable[[dict[str, Any], int, str | None], dict[str, Any]] | None = None
    # (metadata getter: "<arch>.<key>" -> value or None, the ModelConfig fields read so far) ->
    # further fields from a GGUF file (Gemma 3: window, layer pattern, the bases llama.cpp fixes)
    gguf_config: Callable[[Callable[[str], Any], dict[str, Any]], dict[str, Any]] | None = None
    # Hugging Face name -> what llama.cpp's converter added to the tensor it stored (Gemma's
    # norms: 1, as w + 1), subtracted at import as transformers' GGUF loader does
    gguf_offset: Callable[[str], float] | None = None
    # (Hugging Face name, checkpoint tensor) -> the f32 array the graph reads, or None when every
    # tensor is read as stored (Gemma: RMSNorm weights w become 1 + w, folded once at load)
    load_weight: Callable[[str, np.ndarray], np.ndarray] | None = None

    @property
    def model_type(self) -> str:
        """config.json's model_type for this family."""
        return self.hf_model_type or self.name

    def permuted_heads(self, config: ModelConfig, hf_name: str) -> int | None:
        """Heads over which llama.cpp permuted this tensor's rows (q over n_heads, k over
        n_kv_heads), or None when the rows are stored as in Hugging Face."""
        if not self.gguf_rope_permuted:
            return None
        if ".self_attn.q_proj." in hf_name:
            return config.n_heads
        if ".self_attn.k_proj." in hf_name:
            return config.n_kv_heads
        return None
