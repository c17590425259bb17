"""Tiny configs and random weights with Hugging Face names, for tests that need no real model."""
from __future__ import annotations

import numpy as np

from ignis.ir.graph import GraphBuilder
from ignis.ir.types import f32
from ignis.loader.config import ModelConfig, RopeScaling
from ignis.models import weight_shapes


def tiny_config(arch: str = "qwen2", *, n_layers: int = 2, dim: int = 64, n_heads: int = 4,
                n_kv_heads: int = 2, head_dim: int = 16, hidden_dim: int = 96, vocab_size: int = 97,
                tie_word_embeddings: bool = True, attention_bias: bool | None = None,
                rope_theta: float = 10000.0, rope_scaling: RopeScaling | None = None) -> ModelConfig:
    """A small GQA config of any family (Qwen2: q/k/v biases; Llama, Qwen3: none, unless asked)."""
    return ModelConfig(
        arch=arch, dim=dim, hidden_dim=hidden_dim, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=vocab_size, rope_theta=rope_theta,
        rope_scaling=rope_scaling, rms_norm_eps=1e-6, tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=256,
        attention_bias=(arch == "qwen2") if attention_bias is None else attention_bias)


def random_weights(config: ModelConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Weights of the right names and shapes; norms near 1 and small matrices keep activations sane."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(dtype)
    return out


_DIMS = (8, 12, 16)


def random_graph(seed: int, n_steps: int = 12):
    """A random well-typed DAG over [T, d] activations using the pattern-rich ops (norms, linear,
    silu/mul/add/swiglu) with fusion patterns planted on purpose and extra readers sprinkled in
    (so sole-user checks must reject some matches). Returns (graph, weights)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"random.{seed}")
    weights: dict[str, np.ndarray] = {}
    vals = [b.input("x", f32("T", int(rng.choice(_DIMS))))]
    counter = iter(range(10 ** 6))

    def w(*shape):
        name = f"w{len(weights)}"
        weights[name] = (rng.standard_normal(shape) / (np.sqrt(shape[-1]) if len(shape) == 2 else 1)
                         ).astype(np.float32)
        return b.weight(name, f32(*shape))

    def pick():
        # recent values more often, but anything may be read again
        i = len(vals) - 1 - min(int(rng.geometric(0.5)) - 1, len(vals) - 1)
        return vals[i]

    def same_type(v):
        c = [u for u in vals if u.type == v.type]
        return c[int(rng.integers(len(c)))]

    def op(name, *ins, **attrs):
        v = b.op(name, *ins, name=f"n{next(counter)}.{name}", **attrs)
        vals.append(v)
        return v

    def linear(x, out=None, bias=None):
        out = int(rng.choice(_DIMS)) if out is None else out
        ws = [w(out, x.type.shape[1])]
        if (rng.random() < 0.5) if bias is None else bias:
            ws.append(w(out))
        return op("linear", x, *ws)

    for _ in range(n_steps):
        x = pick()
        d = x.type.shape[1]
        kind = rng.integers(10)
        if kind == 0:
            op("rms_normalize", x, eps=1e-5)
        elif kind == 1:
            op("scale", op("rms_normalize", x, eps=1e-6), w(d))          # rmsnorm pattern
        elif kind == 2:
            op("rmsnorm", x, w(d), eps=1e-6)
        elif kind == 3:
            linear(x)
        elif kind == 4:
            op("silu", x)
        elif kind == 5:
            s = op("silu", x)
            op("mul", *((s, same_type(x)) if rng.random() < 0.5 else (same_type(x), s)))  # swiglu
        elif kind == 6:
            op(["add", "mul", "swiglu"][int(rng.integers(3))], x, same_type(x))
        elif kind == 7:                                                   # gate/up + swiglu
            hd = int(rng.choice(_DIMS))
            op("swiglu", linear(x, hd, False), linear(x, hd, False))
        elif kind == 8:                                                   # residual into epilogue
            y = linear(x, d)
            op("add", *((x, y) if rng.random() < 0.5 else (y, x)))
        else:                                                             # norm then project
            linear(op("rmsnorm", x, w(d), eps=1e-6))
    b.output("out", vals[-1])
    if len(vals) > 2 and rng.random() < 0.5:
        b.output("aux", vals[int(rng.integers(1, len(vals)))])
    return b.finish(), weights
