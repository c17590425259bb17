"""The Gemma 3 text family (Gemma3ForCausalLM, config model_type gemma3_text, GGUF gemma3): embeddings
scaled by sqrt(hidden), RMSNorms that multiply by (1 + w) (folded into the weights at load), a norm
before and after both attention and the MLP, per-head q/k RMSNorm, a GELU-tanh gated MLP, scores
scaled by query_pre_attn_scalar^-0.5, and sliding-window layers interleaved with global ones, each
kind with its own rope base.

Per layer: rmsnorm (2 ops), q/k/v linear, rmsnorm_heads on q and k, rope on q and k,
attention_window, o-proj, rmsnorm (2), residual add, rmsnorm (2), gate, up, geglu, down, rmsnorm (2),
residual add.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import ConfigError
from ..ir.graph import Graph, GraphBuilder, Value
from ..ir.types import TensorType, i32
from . import qwen2
from .family import Family
from .qwen2 import GGUF_GLOBAL_TENSORS, GGUF_LAYER_TENSORS, INV_FREQ, OUTPUTS
from .rope import inv_freq

if TYPE_CHECKING:   # a type only: the loader reads families, so a family never imports the loader
    from ..loader.config import ModelConfig

FULL, SLIDING = "full_attention", "sliding_attention"

# the embedding scale as transformers applies it: a tensor of sqrt(hidden) in the weights' dtype
EMBED_SCALE = "model.embed_tokens.embed_scale"

OUTPUT_WEIGHTS = ("model.embed_tokens.weight",)     # Gemma 3 ties its embeddings

# llama.cpp's names (its converter stores every norm weight as 1 + w; gguf_import subtracts the 1
# as transformers' GGUF loader does, so a checkpoint from either holds Hugging Face's w)
GGUF_TENSORS_GLOBAL = {k: v for k, v in GGUF_GLOBAL_TENSORS.items() if k != "output.weight"}
GGUF_TENSORS_LAYER = {
    **{k: v for k, v in GGUF_LAYER_TENSORS.items() if not k.endswith(".bias") and k != "ffn_norm.weight"},
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# the GGUF norm tensors stored as 1 + w
GGUF_NORM_OFFSET = 1.0

_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
          "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
          "self_attn.q_norm.weight", "self_attn.k_norm.weight")


def is_norm(hf_name: str) -> bool:
    """A Gemma RMSNorm weight: the norm multiplies by 1 + w."""
    return hf_name == "model.norm.weight" or hf_name.endswith(_NORMS)


def load_weight(hf_name: str, w: np.ndarray) -> np.ndarray:
    """What the graph reads for a checkpoint tensor: an RMSNorm weight w as 1 + w, added in f32
    as Gemma3RMSNorm does (1.0 + weight.float()), so the norm's scale multiplies by it."""
    if not is_norm(hf_name):
        return w
    return np.float32(1.0) + np.asarray(w, np.float32)


def layer_types(c: ModelConfig) -> tuple[str, ...]:
    return c.layer_types or (FULL,) * c.n_layers


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Gemma 3 checkpoint holds, by Hugging Face name ([out, in] for linears): Qwen3's
    table (tied, no biases) plus a norm before the MLP and one after it."""
    s: dict[str, tuple[int, ...]] = {}
    for name, shape in qwen2.weight_shapes(config, qk_norm=True).items():
        s[name] = shape
        layer = name[:name.find(".", len("model.layers.")) + 1]
        if name.endswith(".post_attention_layernorm.weight"):
            s[layer + "pre_feedforward_layernorm.weight"] = (config.dim,)
        elif name.endswith(".mlp.down_proj.weight"):
            s[layer + "post_feedforward_layernorm.weight"] = (config.dim,)
    return s


def build_forward(config: ModelConfig, output: str = "logits") -> Graph:
    """One forward step for T new tokens at positions `pos` (see qwen2.build_forward for the
    inputs and outputs). Norm weights are read as 1 + w (load_weight)."""
    if output not in OUTPUTS:
        raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    c = config
    shapes = weight_shapes(c)
    b = GraphBuilder(f"{c.arch}.forward")

    def w(name: str) -> Value:
        return b.weight(name, TensorType(shapes[name]))

    def rmsnorm(x: Value, weight: str, name: str) -> Value:
        n = b.op("rms_normalize", x, name=name + ".rms", eps=float(c.rms_norm_eps))
        return b.op("scale", n, w(weight), name=name)

    def linear(x: Value, prefix: str, name: str) -> Value:
        return b.op("linear", x, w(prefix + ".weight"), name=name)

    tokens = b.input("tokens", i32("T"))
    pos = b.input("pos", i32("T"))
    x = b.op("embed", tokens, w("model.embed_tokens.weight"), name="token_embd")
    # transformers: embedding * torch.tensor(hidden_size ** 0.5) (f32), one multiply per element
    scale = b.constant(EMBED_SCALE, np.full(c.dim, np.float32(math.sqrt(c.dim)), np.float32))
    x = b.op("scale", x, scale, name="token_embd.scale")
    heads = dict(head_dim=c.head_dim)
    eps = float(c.rms_norm_eps)
    # the global layers' rope: plain (the kernels derive theta^(-2j/d)) or a scaling's table; the
    # sliding layers' rope is always plain, on its own base
    freqs = [] if c.rope_scaling is None else [b.constant(INV_FREQ, inv_freq(c))]
    attn_scale = float(c.query_pre_attn_scalar if c.query_pre_attn_scalar is not None
                       else c.head_dim) ** -0.5
    for i, kind in enumerate(layer_types(c)):
        p, blk = f"model.layers.{i}.", f"blk.{i}."
        sliding = kind == SLIDING
        theta = float(c.rope_local_theta if sliding else c.rope_theta)
        table = [] if sliding else freqs
        h = rmsnorm(x, p + "input_layernorm.weight", blk + "attn_norm")
        q = linear(h, p + "self_attn.q_proj", blk + "attn_q")
        k = linear(h, p + "self_attn.k_proj", blk + "attn_k")
        v = linear(h, p + "self_attn.v_proj", blk + "attn_v")
        q = b.op("rmsnorm_heads", q, w(p + "self_attn.q_norm.weight"), name=blk + "attn_q_norm",
                 eps=eps, **heads)
        k = b.op("rmsnorm_heads", k, w(p + "self_attn.k_norm.weight"), name=blk + "attn_k_norm",
                 eps=eps, **heads)
        q = b.op("rope", q, pos, *table, name=blk + "attn_q.rope", n_heads=c.n_heads, theta=theta,
                 **heads)
        k = b.op("rope", k, pos, *table, name=blk + "attn_k.rope", n_heads=c.n_kv_heads, theta=theta,
                 **heads)
        a = b.op("attention_window", q, k, v, pos, name=blk + "attn", layer=i, n_heads=c.n_heads,
                 n_kv_heads=c.n_kv_heads, window=c.sliding_window if sliding else 0,
                 scale=attn_scale, **heads)
        o = linear(a, p + "self_attn.o_proj", blk + "attn_output")
        o = rmsnorm(o, p + "post_attention_layernorm.weight", blk + "post_attention_norm")
        x = b.op("add", x, o, name=blk + "attn_residual")
        h = rmsnorm(x, p + "pre_feedforward_layernorm.weight", blk + "ffn_norm")
        g = linear(h, p + "mlp.gate_proj", blk + "ffn_gate")
        u = linear(h, p + "mlp.up_proj", blk + "ffn_up")
        m = b.op("geglu", g, u, name=blk + "ffn_geglu")
        d = linear(m, p + "mlp.down_proj", blk + "ffn_down")
        d = rmsnorm(d, p + "post_feedforward_layernorm.weight", blk + "post_ffw_norm")
        x = b.op("add", x, d, name=blk + "ffn_residual")
    x = rmsnorm(x, "model.norm.weight", "output_norm")
    if output == "hidden":
        b.output("hidden", x)
        return b.finish()
    b.output("logits", linear(x, "model.embed_tokens", "output"))
    return b.finish()


def _int(d: dict[str, Any], key: str, default: Any, path: str | None, minimum: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"config field {key!r} must be an integer >= {minimum}, got {v!r}",
                          path=path, field=key)
    return v


def read_config(d: dict[str, Any], n_layers: int, path: str | None) -> dict[str, Any]:
    """layer_types (else transformers' pattern: every sliding_window_pattern-th layer global),
    sliding_window, query_pre_attn_scalar; tied embeddings only (transformers' default for Gemma 3,
    so a config without the key is tied)."""
    types = d.get("layer_types")
    if types is None:
        pattern = _int(d, "sliding_window_pattern", d.get("_sliding_window_pattern", 6), path)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n_layers)]
    if len(types) != n_layers:
        raise ConfigError(f"layer_types has {len(types)} entries for {n_layers} layers",
                          path=path, field="layer_types")
    window = _int(d, "sliding_window", 4096, path) if SLIDING in types else 0
    scalar = d.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0 \
            or not math.isfinite(scalar):
        raise ConfigError(f"config field 'query_pre_attn_scalar' must be a positive number, got "
                          f"{scalar!r}", path=path, field="query_pre_attn_scalar")
    if d.get("tie_word_embeddings", True) is not True:
        raise ConfigError("tie_word_embeddings false on a Gemma 3 model: ignis runs Gemma 3 with "
                          "the output projection tied to the embedding", path=path,
                          field="tie_word_embeddings")
    return {"layer_types": tuple(types), "sliding_window": window,
            "query_pre_attn_scalar": float(scalar), "tie_word_embeddings": True}


# what llama.cpp's gemma3 graph fixes instead of reading from the file (llama-model.cpp): every
# sixth layer global, the sliding layers' rope base, and the 27B's attention scale
GGUF_SLIDING_PATTERN = 6
GGUF_LOCAL_ROPE_THETA = 10_000.0


def gguf_config(get: Callable[[str], Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A gemma3 GGUF's attention as llama.cpp runs it: the window from attention.sliding_window,
    the layer pattern and local rope base it hard-codes, scores scaled by key_length^-0.5 (the 27B,
    62 layers: (hidden/heads)^-0.5, its query_pre_attn_scalar)."""
    n_layers = fields["n_layers"]
    types = tuple(SLIDING if (i + 1) % GGUF_SLIDING_PATTERN else FULL for i in range(n_layers))
    window = get("attention.sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"metadata key 'gemma3.attention.sliding_window' must be a positive "
                          f"integer, got {window!r}")
    if get("attn_logit_softcapping") is not None or get("final_logit_softcapping") is not None:
        raise ConfigError("logit softcapping (Gemma 2) in a gemma3 file is not implemented")
    scalar = fields["dim"] // fields["n_heads"] if n_layers == 62 else fields["head_dim"]
    return {"layer_types": types, "sliding_window": window, "rope_local_theta": GGUF_LOCAL_ROPE_THETA,
            "query_pre_attn_scalar": float(scalar)}


def _check_attention(d: dict[str, Any], n_layers: int, max_pos: int, path: str | None) -> None:
    """Gemma 3 runs its sliding windows (read_config); q/k/v biases are refused."""
    bias = d.get("attention_bias", False)
    if bias not in (None, False):
        raise ConfigError(f"attention_bias {bias!r} on a Gemma 3 model: ignis implements Gemma 3 "
                          f"without projection biases", path=path, field="attention_bias")


def _hf_config_extra(c: ModelConfig) -> dict[str, Any]:
    scalar = c.query_pre_attn_scalar    # transformers types it int: write it so when it is whole
    if scalar is not None and float(scalar).is_integer():
        scalar = int(scalar)
    return {"layer_types": list(layer_types(c)), "sliding_window": c.sliding_window or None,
            "query_pre_attn_scalar": scalar, "rope_local_base_freq":
            c.rope_local_theta, "attention_bias": False, "attn_logit_softcapping": None,
            "final_logit_softcapping": None}


FAMILY = Family(
    name="gemma3", hf_architecture="Gemma3ForCausalLM",
    build=build_forward, weight_shapes=weight_shapes,
    output_weights=OUTPUT_WEIGHTS,
    gguf_global_tensors=GGUF_TENSORS_GLOBAL, gguf_layer_tensors=GGUF_TENSORS_LAYER,
    attention_bias=False,
    gguf_rope_permuted=False,       # llama.cpp stores Gemma 3's q/k rows as Hugging Face does
    check_attention=_check_attention,
    hf_config_extra=_hf_config_extra,
    hf_model_type="gemma3_text",
    hidden_act_key="hidden_activation", hidden_acts=("gelu_pytorch_tanh",),
    config_keys=frozenset({"hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq",
                           "sliding_window_pattern", "_sliding_window_pattern"}),
    rope_per_layer_type=True,
    read_config=read_config,
    gguf_config=gguf_config,
    gguf_offset=lambda hf_name: GGUF_NORM_OFFSET if is_norm(hf_name) else 0.0,
    load_weight=load_weight,
)
