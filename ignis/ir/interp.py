"""NumPy reference interpreter: runs any graph, before or after any pass, with a KV cache.

It is the oracle for passes (same outputs before and after), for the planner (a run whose values
live in one arena at the planned offsets must be bitwise equal to a run with one array per value)
and later for the C runtime. Plain, readable NumPy; speed is not a goal.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from .errors import InterpreterInputError
from .graph import Graph
from .ops import ATTENTION_OPS


@dataclass
class KVCache:
    """Per-layer key and value rows, [n_ctx, n_kv_heads*head_dim] each, indexed by position."""
    k: dict[int, np.ndarray]
    v: dict[int, np.ndarray]
    n_ctx: int

    @classmethod
    def for_graph(cls, g: Graph, n_ctx: int, dtype: Any = np.float64) -> "KVCache":
        k, v = {}, {}
        for n in g.nodes:
            if n.op in ATTENTION_OPS:
                width = n.attrs["n_kv_heads"] * n.attrs["head_dim"]
                k[n.attrs["layer"]] = np.zeros((n_ctx, width), dtype)
                v[n.attrs["layer"]] = np.zeros((n_ctx, width), dtype)
        return cls(k, v, n_ctx)


class ArenaPlacement(Protocol):
    """What the interpreter needs from a memory plan: byte offsets of planned values by node name."""
    offsets: Mapping[str, int]
    sizes: Mapping[str, int]
    arena_bytes: int


def _rope_rows(x: np.ndarray, pos: np.ndarray, n_heads: int, head_dim: int, theta: float,
               inv_freq: np.ndarray | None = None) -> np.ndarray:
    half = head_dim // 2
    if inv_freq is None:
        inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    ang = pos.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :]   # [T, half]
    cos = np.cos(ang).astype(x.dtype)[:, None, :]
    sin = np.sin(ang).astype(x.dtype)[:, None, :]
    h = x.reshape(x.shape[0], n_heads, head_dim)
    a, b = h[..., :half], h[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(x.shape)


def _attend(q, k, v, pos, at, cache: KVCache) -> np.ndarray:
    layer, nh, nkv, hd = at["layer"], at["n_heads"], at["n_kv_heads"], at["head_dim"]
    if layer not in cache.k:
        raise InterpreterInputError(f"KV cache has no layer {layer}; build it with KVCache.for_graph")
    if pos.size and (pos.min() < 0 or pos.max() >= cache.n_ctx):
        raise InterpreterInputError(f"positions {pos.min()}..{pos.max()} do not fit the KV cache "
                                    f"of {cache.n_ctx} positions")
    kc, vc = cache.k[layer], cache.v[layer]
    kc[pos] = k
    vc[pos] = v
    n = int(pos.max()) + 1 if pos.size else 0
    T = q.shape[0]
    qh = q.reshape(T, nh, hd).transpose(1, 0, 2)                            # [nh, T, hd]
    rep = nh // nkv
    kh = np.repeat(kc[:n].reshape(n, nkv, hd).transpose(1, 0, 2), rep, axis=0)  # [nh, n, hd]
    vh = np.repeat(vc[:n].reshape(n, nkv, hd).transpose(1, 0, 2), rep, axis=0)
    scale = at.get("scale", 1.0 / np.sqrt(hd))
    s = (qh @ kh.transpose(0, 2, 1)) * q.dtype.type(scale)                  # [nh, T, n]
    mask = np.arange(n)[None, :] > pos[:, None]                            # causal over positions
    if at.get("window", 0):     # transformers' sliding window: kv_idx > q_idx - window
        mask |= np.arange(n)[None, :] <= pos[:, None] - at["window"]
    s = np.where(mask[None], -np.inf, s)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    p = s / s.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(1, 0, 2).reshape(T, nh * hd)


def _silu(x):
    # exp(-x) overflows to inf for very negative x and the quotient is the right limit, -0
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def _gelu_tanh(x):
    # transformers' gelu_pytorch_tanh
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))


def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def _qkv(x, ws):
    ws = _no_freqs(ws)
    biases = ws[3:] if len(ws) == 6 else (None, None, None)
    return np.concatenate([_linear(x, w, b) for w, b in zip(ws[:3], biases)], axis=1)


def _no_freqs(ws):
    # packed projections: Wq, Wk, Wv[, bq, bk, bv], then the rope ops' optional inv_freq table
    return ws[:-1] if len(ws) in (4, 7) else ws


def _freqs_of(ws):
    return ws[-1] if len(ws) in (4, 7) else None


def _rope_packed(qkv, pos, at, inv_freq=None):
    qd, kd = at["n_heads"] * at["head_dim"], at["n_kv_heads"] * at["head_dim"]
    q = _rope_rows(qkv[:, :qd], pos, at["n_heads"], at["head_dim"], at["theta"], inv_freq)
    k = _rope_rows(qkv[:, qd:qd + kd], pos, at["n_kv_heads"], at["head_dim"], at["theta"], inv_freq)
    return np.concatenate([q, k, qkv[:, qd + kd:]], axis=1)


def _rms_heads(x, w, at):
    h = x.reshape(x.shape[0], -1, at["head_dim"])
    return (_rms(h, at["eps"]) * w).reshape(x.shape)


def _attention_packed(qkv, pos, at, cache):
    qd, kd = at["n_heads"] * at["head_dim"], at["n_kv_heads"] * at["head_dim"]
    return _attend(qkv[:, :qd], qkv[:, qd:qd + kd], qkv[:, qd + kd:], pos, at, cache)


Impl = Callable[[list, Mapping[str, Any], KVCache], np.ndarray]
_IMPLS: dict[str, Impl] = {
    "embed": lambda a, at, c: a[1][a[0]],
    "rms_normalize": lambda a, at, c: _rms(a[0], at["eps"]),
    "scale": lambda a, at, c: a[0] * a[1],
    "rmsnorm": lambda a, at, c: _rms(a[0], at["eps"]) * a[1],
    "linear": lambda a, at, c: _linear(*a),
    "rope": lambda a, at, c: _rope_rows(a[0], a[1], at["n_heads"], at["head_dim"], at["theta"],
                                        a[2] if len(a) == 3 else None),
    "attention": lambda a, at, c: _attend(a[0], a[1], a[2], a[3], at, c),
    "add": lambda a, at, c: a[0] + a[1],
    "silu": lambda a, at, c: _silu(a[0]),
    "mul": lambda a, at, c: a[0] * a[1],
    "swiglu": lambda a, at, c: _silu(a[0]) * a[1],
    "take_rows": lambda a, at, c: a[0][a[1]],
    "linear_qkv": lambda a, at, c: _qkv(a[0], a[1:]),
    "rope_qkv": lambda a, at, c: _rope_packed(a[0], a[1], at, a[2] if len(a) == 3 else None),
    "linear_qkv_rope": lambda a, at, c: _rope_packed(_qkv(a[0], a[2:]), a[1], at, _freqs_of(a[2:])),
    "attention_packed": lambda a, at, c: _attention_packed(a[0], a[1], at, c),
    "linear_swiglu": lambda a, at, c: _silu(_linear(a[0], a[1])) * _linear(a[0], a[2]),
    "linear_add": lambda a, at, c: _linear(a[0], *a[2:]) + a[1],
    "rms_linear": lambda a, at, c: _linear(_rms(a[0], at["eps"]) * a[1], *a[2:]),
    "rms_linear_qkv_rope": lambda a, at, c: _rope_packed(_qkv(_rms(a[0], at["eps"]) * a[2], a[3:]),
                                                         a[1], at, _freqs_of(a[3:])),
    "rms_linear_swiglu": lambda a, at, c: (lambda h: _silu(_linear(h, a[2])) * _linear(h, a[3]))(
        _rms(a[0], at["eps"]) * a[1]),
    "rmsnorm_heads": lambda a, at, c: _rms_heads(a[0], a[1], at),
    "attention_window": lambda a, at, c: _attend(a[0], a[1], a[2], a[3], at, c),
    "geglu": lambda a, at, c: _gelu_tanh(a[0]) * a[1],
}


def bind_symbols(g: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Check inputs against the graph's input types; return the symbol values (e.g. T) they imply."""
    bound: dict[str, int] = {}
    missing = [k for k in g.inputs if k not in inputs]
    if missing:
        raise InterpreterInputError(f"missing graph inputs {missing}; the graph takes "
                                    f"{list(g.inputs)}")
    for k, v in g.inputs.items():
        a = np.asarray(inputs[k])
        if a.ndim != v.type.rank or (v.type.dtype == "i32" and not np.issubdtype(a.dtype, np.integer)):
            raise InterpreterInputError(f"input {k!r} must be {v.type}, got {a.dtype}{list(a.shape)}")
        for d, n in zip(v.type.shape, a.shape):
            if isinstance(d, str):
                if bound.setdefault(d, n) != n:
                    raise InterpreterInputError(f"input {k!r}: size {d}={n} disagrees with "
                                                f"{d}={bound[d]} from another input")
            elif d != n:
                raise InterpreterInputError(f"input {k!r} must be {v.type}, got shape {list(a.shape)}")
    return bound


def run(g: Graph, weights: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray], *,
        cache: KVCache, dtype: Any = np.float64, plan: ArenaPlacement | None = None,
        ) -> dict[str, np.ndarray]:
    """Execute one forward step of `g`; returns its outputs by name. The KV cache is updated.

    With `plan`, every value the plan places lives in one byte arena at its planned offset, so a
    placement that overlaps two live values corrupts the result (that is what tests look for).
    """
    dtype = np.dtype(dtype)
    if plan is not None and dtype != np.float32:
        raise InterpreterInputError(f"a planned run places f32 values at the plan's offsets; run it "
                                    f"with dtype=np.float32, not {dtype}")
    bind_symbols(g, inputs)
    env: dict[int, np.ndarray] = {}
    for k, v in g.inputs.items():
        env[id(v)] = np.asarray(inputs[k]).astype(np.int32 if v.type.dtype == "i32" else dtype)
    for k, v in g.weights.items():
        if k not in weights and k not in g.constants:
            raise InterpreterInputError(f"weight {k!r} is missing from the weights given")
        # a constant of the graph (rope frequencies from the config) is what the graph computes with
        w = np.asarray(g.constants[k] if k in g.constants else weights[k])
        if tuple(w.shape) != v.type.shape:
            raise InterpreterInputError(f"weight {k!r} has shape {list(w.shape)}, the graph needs "
                                        f"{list(v.type.shape)}")
        env[id(v)] = w.astype(dtype, copy=False)
    arena = np.zeros(plan.arena_bytes, np.uint8) if plan is not None else None
    for n in g.nodes:
        out = _IMPLS[n.op]([env[id(v)] for v in n.inputs], n.attrs, cache)
        out = np.asarray(out, dtype=dtype)
        if arena is not None and n.name in plan.offsets:
            off = plan.offsets[n.name]
            if out.nbytes > plan.sizes[n.name]:
                raise InterpreterInputError(
                    f"{n.name}: {out.nbytes} bytes do not fit the {plan.sizes[n.name]} planned; "
                    f"the plan was made for smaller bounds than these inputs")
            view = arena[off:off + out.nbytes].view(dtype).reshape(out.shape)
            view[...] = out
            out = view
        env[id(n.out)] = out
    return {k: np.array(env[id(v)]) for k, v in g.outputs.items()}
