"""The Qwen2 family, and the decoder it shares with Llama and Qwen3 (models/llama.py, qwen3.py): the
forward step as an IR graph at the seed article's granularity, its weight table and GGUF names, its
config.json rules.

Per layer 18 ops: rmsnorm as two (normalize, scale), q/k/v linear (bias included), rope on q and
on k, attention (stores k/v in the KV cache), o-proj, residual add, rmsnorm as two, gate, up,
silu, mul, down, residual add. Then the final rmsnorm (two ops) and lm_head. Passes fuse from here.
Llama is the same graph without the q/k/v biases; Qwen3 (qk_norm) adds an RMSNorm over each head of
q and of k before rope. A rope scaling in the config makes rope read an inverse-frequency table
(models/rope.py) instead of deriving theta^(-2j/d) itself. output="hidden" stops after the final
rmsnorm (the embedding graph: no lm_head).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..ir.graph import Graph, GraphBuilder, Value
from ..ir.types import TensorType, i32
from .family import Family
from .rope import inv_freq

if TYPE_CHECKING:   # a type only: the loader reads families, so a family never imports the loader
    from ..loader.config import ModelConfig

OUTPUTS = ("logits", "hidden")     # what a forward graph can end in

# the output projection reads lm_head, or with tied embeddings the embedding table
OUTPUT_WEIGHTS = ("lm_head.weight", "model.embed_tokens.weight")

# llama.cpp's tensor names -> Hugging Face's, for the decoder below
GGUF_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_TENSORS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


# the rope ops' inverse-frequency table: transformers' name for the same (non-persistent) buffer
INV_FREQ = "model.rotary_emb.inv_freq"


def weight_shapes(config: ModelConfig, *, qk_norm: bool = False) -> dict[str, tuple[int, ...]]:
    """Every weight the forward step reads, by Hugging Face name, with its shape ([out, in] for
    linear layers): the tensors a checkpoint of this config must hold, no more. With tied
    embeddings lm_head reads the embedding table; qk_norm: Qwen3's per-head q/k norm weights."""
    c = config
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.dim)}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (c.dim,)
        s[p + "self_attn.q_proj.weight"] = (c.q_dim, c.dim)
        s[p + "self_attn.k_proj.weight"] = (c.kv_dim, c.dim)
        s[p + "self_attn.v_proj.weight"] = (c.kv_dim, c.dim)
        if c.attention_bias:
            s[p + "self_attn.q_proj.bias"] = (c.q_dim,)
            s[p + "self_attn.k_proj.bias"] = (c.kv_dim,)
            s[p + "self_attn.v_proj.bias"] = (c.kv_dim,)
        s[p + "self_attn.o_proj.weight"] = (c.dim, c.q_dim)
        if qk_norm:
            s[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            s[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        s[p + "post_attention_layernorm.weight"] = (c.dim,)
        s[p + "mlp.gate_proj.weight"] = (c.hidden_dim, c.dim)
        s[p + "mlp.up_proj.weight"] = (c.hidden_dim, c.dim)
        s[p + "mlp.down_proj.weight"] = (c.dim, c.hidden_dim)
    s["model.norm.weight"] = (c.dim,)
    if not c.tie_word_embeddings:
        s["lm_head.weight"] = (c.vocab_size, c.dim)
    return s


def build_forward(config: ModelConfig, output: str = "logits", *, qk_norm: bool = False) -> Graph:
    """One forward step for T new tokens at positions `pos`: inputs %tokens, %pos (i32[T]); output
    `logits` f32[T, vocab], or with output="hidden" `hidden` f32[T, dim], the final-norm hidden
    state (transformers' last_hidden_state). The KV cache is state of the attention ops, not a value.
    qk_norm: RMSNorm over each head of q and k (weights q_norm, k_norm) between projection and rope."""
    if output not in OUTPUTS:
        raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    c = config
    shapes = weight_shapes(c, qk_norm=qk_norm)
    b = GraphBuilder(f"{c.arch}.forward")

    def w(name: str) -> Value:
        return b.weight(name, TensorType(shapes[name]))

    def rmsnorm(x: Value, weight: str, name: str) -> Value:
        n = b.op("rms_normalize", x, name=name + ".rms", eps=float(c.rms_norm_eps))
        return b.op("scale", n, w(weight), name=name)

    def linear(x: Value, prefix: str, name: str, bias: bool = False) -> Value:
        ins = [w(prefix + ".weight")] + ([w(prefix + ".bias")] if bias else [])
        return b.op("linear", x, *ins, name=name)

    tokens = b.input("tokens", i32("T"))
    pos = b.input("pos", i32("T"))
    x = b.op("embed", tokens, w("model.embed_tokens.weight"), name="token_embd")
    heads = dict(head_dim=c.head_dim)
    # plain RoPE: the kernels derive theta^(-2j/d) themselves (bitwise models/rope.py's table)
    freqs = [] if c.rope_scaling is None else [b.constant(INV_FREQ, inv_freq(c))]
    for i in range(c.n_layers):
        p, blk = f"model.layers.{i}.", f"blk.{i}."
        h = rmsnorm(x, p + "input_layernorm.weight", blk + "attn_norm")
        bias = c.attention_bias
        q = linear(h, p + "self_attn.q_proj", blk + "attn_q", bias)
        k = linear(h, p + "self_attn.k_proj", blk + "attn_k", bias)
        v = linear(h, p + "self_attn.v_proj", blk + "attn_v", bias)
        if qk_norm:
            eps = float(c.rms_norm_eps)
            q = b.op("rmsnorm_heads", q, w(p + "self_attn.q_norm.weight"), name=blk + "attn_q_norm",
                     eps=eps, **heads)
            k = b.op("rmsnorm_heads", k, w(p + "self_attn.k_norm.weight"), name=blk + "attn_k_norm",
                     eps=eps, **heads)
        q = b.op("rope", q, pos, *freqs, name=blk + "attn_q.rope", n_heads=c.n_heads,
                 theta=float(c.rope_theta), **heads)
        k = b.op("rope", k, pos, *freqs, name=blk + "attn_k.rope", n_heads=c.n_kv_heads,
                 theta=float(c.rope_theta), **heads)
        a = b.op("attention", q, k, v, pos, name=blk + "attn", layer=i, n_heads=c.n_heads,
                 n_kv_heads=c.n_kv_heads, **heads)
        o = linear(a, p + "self_attn.o_proj", blk + "attn_output")
        x = b.op("add", x, o, name=blk + "attn_residual")
        h = rmsnorm(x, p + "post_attention_layernorm.weight", blk + "ffn_norm")
        g = linear(h, p + "mlp.gate_proj", blk + "ffn_gate")
        u = linear(h, p + "mlp.up_proj", blk + "ffn_up")
        g = b.op("silu", g, name=blk + "ffn_gate.silu")
        m = b.op("mul", g, u, name=blk + "ffn_swiglu")
        d = linear(m, p + "mlp.down_proj", blk + "ffn_down")
        x = b.op("add", x, d, name=blk + "ffn_residual")
    x = rmsnorm(x, "model.norm.weight", "output_norm")
    if output == "hidden":
        b.output("hidden", x)
        return b.finish()
    lm = "model.embed_tokens" if c.tie_word_embeddings else "lm_head"
    logits = linear(x, lm, "output")
    b.output("logits", logits)
    return b.finish()


def _check_attention(d: dict[str, Any], n_layers: int, max_pos: int, path: str | None) -> None:
    """Refuse a sliding window that can bite: one shorter than max_position_embeddings (ignis's
    longest n_ctx). As transformers 5 reads Qwen2, the window applies only with use_sliding_window,
    to the layers layer_types marks "sliding_attention" (by default those from max_window_layers
    on)."""
    layer_types, window = d.get("layer_types"), d.get("sliding_window")
    use = d.get("use_sliding_window", False)
    if not isinstance(use, bool):
        raise ConfigError(f"config field 'use_sliding_window' must be true or false, got {use!r}",
                          path=path, field="use_sliding_window")
    if layer_types is not None:
        sliding = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        field = "layer_types"
    else:
        first = d.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise ConfigError(f"config field 'max_window_layers' must be an integer, got {first!r}",
                              path=path, field="max_window_layers")
        sliding = list(range(max(first, 0), n_layers)) if use and window is not None else []
        field = "use_sliding_window"
    effective = window if use else None
    if sliding and (effective is None or effective < max_pos):
        size = f"a window of {effective} positions" if effective is not None else "a sliding window"
        raise ConfigError(f"layers {sliding[:8]}{' ...' if len(sliding) > 8 else ''} use {size} "
                          f"(use_sliding_window, sliding_window, max_window_layers/layer_types): "
                          f"sliding-window attention is not implemented", path=path, field=field)


FAMILY = Family(
    name="qwen2", hf_architecture="Qwen2ForCausalLM",
    build=build_forward, weight_shapes=weight_shapes,
    output_weights=OUTPUT_WEIGHTS,
    gguf_global_tensors=GGUF_GLOBAL_TENSORS, gguf_layer_tensors=GGUF_LAYER_TENSORS,
    attention_bias=True,            # Qwen2 always has q/k/v biases; config.json's field is not read
    gguf_rope_permuted=False,       # llama.cpp stores Qwen2's q/k rows as Hugging Face does
    check_attention=_check_attention,
    hf_config_extra=lambda c: {"use_sliding_window": False},
)
