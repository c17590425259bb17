"""The op table: every IR op declared once — arity, which inputs are weights, attributes, the
shape/dtype rule (type propagation), in-place eligibility, purity, opcode and plan-time scratch.

How to add an op: add an OpDef here (opcode: next free number, never reuse one), its NumPy
semantics in ir/interp.py (_IMPLS), and its kernel + IG_OP_* case in the C executor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import IRTypeError
from .types import Dim, TensorType

INT32_MAX = 2**31 - 1          # the executor holds int attributes in 32 bits

TypeRule = Callable[[Sequence[TensorType], Mapping[str, Any]], TensorType]
ScratchRule = Callable[[Sequence[TensorType], Mapping[str, Any], Mapping[str, int], int], int]


@dataclass(frozen=True)
class OpDef:
    name: str
    opcode: int                       # stable number shared with the C executor (IG_OP_<NAME>)
    arity: tuple[int, ...]            # allowed input counts
    rule: TypeRule                    # input types + attrs -> output type, or IRTypeError
    attrs: Mapping[str, type] = field(default_factory=dict)   # required attributes and their types
    weights_from: int | None = None   # inputs at index >= this are weights (None: no weights)
    inplace: tuple[int, ...] = ()     # inputs whose buffer the output may take over
    pure: bool = True                 # False: has a side effect (KV cache write), never removed
    scratch: ScratchRule | None = None
    doc: str = ""


def _fail(op: str, msg: str) -> None:
    raise IRTypeError(f"{op}: {msg}")


def _dim_eq(a: Dim, b: Dim) -> bool:
    return a == b and type(a) is type(b)


def _need(op: str, t: TensorType, what: str, rank: int, dtype: str = "f32") -> None:
    if t.dtype != dtype or t.rank != rank:
        _fail(op, f"{what} must be {dtype} of rank {rank}, got {t}")


def _same_dim(op: str, a: Dim, b: Dim, what: str) -> None:
    if not _dim_eq(a, b):
        _fail(op, f"{what}: {a} != {b}")


# --- type rules ----------------------------------------------------------------------------------

def _embed(ts, at):
    ids, w = ts
    _need("embed", ids, "token ids", 1, "i32")
    _need("embed", w, "embedding table", 2)
    return TensorType((ids.shape[0], w.shape[1]), "f32")


def _rowwise_norm(op):
    def rule(ts, at):
        x = ts[0]
        _need(op, x, "input", 2)
        if len(ts) == 2:
            _need(op, ts[1], "weight", 1)
            _same_dim(op, ts[1].shape[0], x.shape[1], "weight length vs input columns")
        return x
    return rule


def _linear(ts, at):
    x, w = ts[0], ts[1]
    _need("linear", x, "input", 2)
    _need("linear", w, "weight [out, in]", 2)
    _same_dim("linear", w.shape[1], x.shape[1], "weight in_features vs input columns")
    if len(ts) == 3:
        _need("linear", ts[2], "bias", 1)
        _same_dim("linear", ts[2].shape[0], w.shape[0], "bias length vs out_features")
    return TensorType((x.shape[0], w.shape[0]), "f32")


def _even_head_dim(op, at):
    if at["head_dim"] % 2:
        _fail(op, f"head_dim must be even for rotary embedding, got {at['head_dim']}")


def _freqs(op, t, at):
    """The optional inverse-frequency table of the rope ops: f32[head_dim/2]."""
    _need(op, t, "inverse frequencies", 1)
    _same_dim(op, t.shape[0], at["head_dim"] // 2, "inverse frequencies vs head_dim/2")


def _rope(ts, at):
    x, pos = ts[:2]
    _need("rope", x, "input", 2)
    _need("rope", pos, "positions", 1, "i32")
    _same_dim("rope", pos.shape[0], x.shape[0], "positions vs rows")
    _even_head_dim("rope", at)
    _same_dim("rope", x.shape[1], at["n_heads"] * at["head_dim"], "columns vs n_heads*head_dim")
    if len(ts) == 3:
        _freqs("rope", ts[2], at)
    return x


def _rmsnorm_heads(ts, at):
    x, w = ts
    _need("rmsnorm_heads", x, "input", 2)
    _need("rmsnorm_heads", w, "weight", 1)
    _same_dim("rmsnorm_heads", w.shape[0], at["head_dim"], "weight length vs head_dim")
    if isinstance(x.shape[1], int) and x.shape[1] % at["head_dim"]:
        _fail("rmsnorm_heads", f"columns {x.shape[1]} are not a whole number of "
                               f"{at['head_dim']}-wide heads")
    return x


def _gqa(op, at):
    if at["n_heads"] % at["n_kv_heads"]:
        _fail(op, f"n_heads ({at['n_heads']}) must be a multiple of n_kv_heads ({at['n_kv_heads']})")


def _attention(ts, at):
    q, k, v, pos = ts
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        _need("attention", t, what, 2)
        _same_dim("attention", t.shape[0], q.shape[0], f"{what} rows vs q rows")
    _need("attention", pos, "positions", 1, "i32")
    _same_dim("attention", pos.shape[0], q.shape[0], "positions vs rows")
    _gqa("attention", at)
    _same_dim("attention", q.shape[1], at["n_heads"] * at["head_dim"], "q columns vs n_heads*head_dim")
    _same_dim("attention", k.shape[1], at["n_kv_heads"] * at["head_dim"],
              "k columns vs n_kv_heads*head_dim")
    _same_dim("attention", v.shape[1], k.shape[1], "v columns vs k columns")
    return q


def _attention_window(ts, at):
    _attention(ts, at)
    return ts[0]


def _elementwise(op):
    def rule(ts, at):
        for t in ts:
            _need(op, t, "input", 2)
            if t != ts[0]:
                _fail(op, f"inputs must have one type, got {ts[0]} and {t}")
        return ts[0]
    return rule


def _take_rows(ts, at):
    x, rows = ts
    _need("take_rows", x, "input", 2)
    _need("take_rows", rows, "row indices", 1, "i32")
    return TensorType((rows.shape[0], x.shape[1]), "f32")


def _packed_width(at) -> int:
    return (at["n_heads"] + 2 * at["n_kv_heads"]) * at["head_dim"]


def _qkv_weights(op, x, ws, at):
    qd, kd = at["n_heads"] * at["head_dim"], at["n_kv_heads"] * at["head_dim"]
    _need(op, x, "input", 2)
    for w, what, n in zip(ws[:3], ("Wq", "Wk", "Wv"), (qd, kd, kd)):
        _need(op, w, what, 2)
        _same_dim(op, w.shape[1], x.shape[1], f"{what} in_features vs input columns")
        _same_dim(op, w.shape[0], n, f"{what} out_features")
    for b, what, n in zip(ws[3:], ("bq", "bk", "bv"), (qd, kd, kd)):
        _need(op, b, what, 1)
        _same_dim(op, b.shape[0], n, f"{what} length")
    _gqa(op, at)
    return TensorType((x.shape[0], _packed_width(at)), "f32")


def _linear_qkv(ts, at):
    return _qkv_weights("linear_qkv", ts[0], ts[1:], at)


def _split_freqs(op, ws, at):
    """Projection weights (Wq, Wk, Wv[, bq, bk, bv]) and the optional trailing inverse-frequency
    table: 4 or 7 weights end in the table."""
    if len(ws) in (4, 7):
        _freqs(op, ws[-1], at)
        return ws[:-1]
    return ws


def _linear_qkv_rope(ts, at, op="linear_qkv_rope"):
    x, pos = ts[0], ts[1]
    _need(op, pos, "positions", 1, "i32")
    _same_dim(op, pos.shape[0], x.shape[0], "positions vs rows")
    _even_head_dim(op, at)
    return _qkv_weights(op, x, _split_freqs(op, ts[2:], at), at)


def _rope_qkv(ts, at):
    qkv, pos = ts[:2]
    if len(ts) == 3:
        _freqs("rope_qkv", ts[2], at)
    _need("rope_qkv", qkv, "packed qkv", 2)
    _need("rope_qkv", pos, "positions", 1, "i32")
    _same_dim("rope_qkv", pos.shape[0], qkv.shape[0], "positions vs rows")
    _even_head_dim("rope_qkv", at)
    _gqa("rope_qkv", at)
    _same_dim("rope_qkv", qkv.shape[1], _packed_width(at), "columns vs (n_heads+2*n_kv_heads)*head_dim")
    return qkv


def _attention_packed(ts, at):
    qkv, pos = ts
    _need("attention_packed", qkv, "packed qkv", 2)
    _need("attention_packed", pos, "positions", 1, "i32")
    _same_dim("attention_packed", pos.shape[0], qkv.shape[0], "positions vs rows")
    _gqa("attention_packed", at)
    _same_dim("attention_packed", qkv.shape[1], _packed_width(at),
              "columns vs (n_heads+2*n_kv_heads)*head_dim")
    return TensorType((qkv.shape[0], at["n_heads"] * at["head_dim"]), "f32")


def _linear_swiglu(ts, at):
    x, wg, wu = ts
    _need("linear_swiglu", x, "input", 2)
    for w, what in ((wg, "Wgate"), (wu, "Wup")):
        _need("linear_swiglu", w, what, 2)
        _same_dim("linear_swiglu", w.shape[1], x.shape[1], f"{what} in_features vs input columns")
    _same_dim("linear_swiglu", wg.shape[0], wu.shape[0], "Wgate vs Wup out_features")
    return TensorType((x.shape[0], wg.shape[0]), "f32")


def _linear_add(ts, at):
    x, r = ts[0], ts[1]
    out = _linear([x, *ts[2:]], at)
    _need("linear_add", r, "residual", 2)
    if r != out:
        _fail("linear_add", f"residual {r} does not match the product {out}")
    return out


def _rms_prologue(op, base, norm_at):
    """Type rule of `base` with an RMSNorm of the activation folded in: the norm weight sits at
    input index `norm_at` (first weight) and must match the activation's columns."""
    def rule(ts, at):
        x, wn = ts[0], ts[norm_at]
        _need(op, x, "input", 2)
        _need(op, wn, "norm weight", 1)
        _same_dim(op, wn.shape[0], x.shape[1], "norm weight length vs input columns")
        return base([*ts[:norm_at], *ts[norm_at + 1:]], at)
    return rule


def _rms_linear_qkv_rope(ts, at):
    return _linear_qkv_rope(ts, at, "rms_linear_qkv_rope")


def _norm_scratch(ts, at, bounds, n_ctx):
    # the normalized rows live in scratch, not in the arena
    return ts[0].nbytes(bounds)


def _attention_scratch(ts, at, bounds, n_ctx):
    # one f32 row of scores over the context per head: query rows are processed one after the
    # other within a head and heads in parallel, so no [T, context] buffer for long prompts
    return 4 * at["n_heads"] * n_ctx


_HEADS = {"n_heads": int, "head_dim": int}
_GQA = {"n_heads": int, "n_kv_heads": int, "head_dim": int}

OPS: dict[str, OpDef] = {o.name: o for o in [
    OpDef("embed", 1, (2,), _embed, weights_from=1, doc="rows of the embedding table for token ids"),
    OpDef("rms_normalize", 2, (1,), _rowwise_norm("rms_normalize"), {"eps": float}, inplace=(0,),
          doc="x / sqrt(mean(x^2) + eps) per row (first half of the seed's two-op RMSNorm)"),
    OpDef("scale", 3, (2,), _rowwise_norm("scale"), weights_from=1, inplace=(0,),
          doc="x * w, w broadcast over rows"),
    OpDef("rmsnorm", 4, (2,), _rowwise_norm("rmsnorm"), {"eps": float}, weights_from=1, inplace=(0,),
          doc="x / sqrt(mean(x^2) + eps) * w"),
    OpDef("linear", 5, (2, 3), _linear, weights_from=1, doc="x @ W^T (+ b); W is [out, in]"),
    OpDef("rope", 6, (2, 3), _rope, {**_HEADS, "theta": float}, weights_from=2, inplace=(0,),
          doc="NEOX rotary embedding: pairs (x[j], x[j+d/2]) of each head rotated by pos*inv_freq[j]; "
              "inv_freq is the optional table input f32[head_dim/2], else theta^(-2j/d)"),
    OpDef("attention", 7, (4,), _attention, {"layer": int, **_GQA}, pure=False,
          scratch=_attention_scratch,
          doc="store k, v at pos in the layer's KV cache, then causal GQA attention over 0..pos"),
    OpDef("add", 8, (2,), _elementwise("add"), inplace=(0, 1), doc="a + b"),
    OpDef("silu", 9, (1,), _elementwise("silu"), inplace=(0,), doc="x * sigmoid(x)"),
    OpDef("mul", 10, (2,), _elementwise("mul"), inplace=(0, 1), doc="a * b"),
    OpDef("swiglu", 11, (2,), _elementwise("swiglu"), inplace=(0, 1), doc="silu(g) * u"),
    OpDef("take_rows", 12, (2,), _take_rows, doc="x[rows]"),
    OpDef("linear_qkv", 13, (4, 7), _linear_qkv, _GQA, weights_from=1,
          doc="[x@Wq^T+bq | x@Wk^T+bk | x@Wv^T+bv] packed by columns"),
    OpDef("rope_qkv", 14, (2, 3), _rope_qkv, {**_GQA, "theta": float}, weights_from=2, inplace=(0,),
          doc="rope on the q and k sections of a packed qkv row (optional inv_freq table as for "
              "rope); v untouched"),
    OpDef("linear_qkv_rope", 15, (5, 6, 8, 9), _linear_qkv_rope, {**_GQA, "theta": float},
          weights_from=2, doc="linear_qkv with rope applied to q and k in the epilogue: inputs x, pos, "
                              "Wq, Wk, Wv[, bq, bk, bv][, inv_freq]"),
    OpDef("attention_packed", 16, (2,), _attention_packed, {"layer": int, **_GQA}, pure=False,
          scratch=_attention_scratch, doc="attention reading q, k, v from one packed qkv tensor"),
    OpDef("linear_swiglu", 17, (3,), _linear_swiglu, weights_from=1,
          doc="silu(x@Wg^T) * (x@Wu^T): gate and up in one pass with the SwiGLU epilogue"),
    OpDef("linear_add", 18, (3, 4), _linear_add, weights_from=2,
          doc="x @ W^T (+ b) + r: the residual add in the matmul epilogue"),
    OpDef("rms_linear", 19, (3, 4), _rms_prologue("rms_linear", _linear, 1), {"eps": float},
          weights_from=1, scratch=_norm_scratch, doc="linear(rmsnorm(x, wn)): the norm as the prologue"),
    OpDef("rms_linear_qkv_rope", 20, (6, 7, 9, 10),
          _rms_prologue("rms_linear_qkv_rope", _rms_linear_qkv_rope, 2),
          {"eps": float, **_GQA, "theta": float}, weights_from=2, scratch=_norm_scratch,
          doc="linear_qkv_rope(rmsnorm(x, wn), pos, ...): inputs x, pos, wn, Wq, Wk, Wv[, bq, bk, bv]"
              "[, inv_freq]"),
    OpDef("rms_linear_swiglu", 21, (4,), _rms_prologue("rms_linear_swiglu", _linear_swiglu, 1),
          {"eps": float}, weights_from=1, scratch=_norm_scratch,
          doc="linear_swiglu(rmsnorm(x, wn), Wg, Wu)"),
    OpDef("rmsnorm_heads", 22, (2,), _rmsnorm_heads, {"eps": float, "head_dim": int}, weights_from=1,
          inplace=(0,), doc="rmsnorm over each head_dim-wide head of a row, one weight for all heads "
                            "(Qwen3's q_norm / k_norm)"),
    OpDef("attention_window", 23, (4,), _attention_window,
          {"layer": int, **_GQA, "window": int, "scale": float}, pure=False,
          scratch=_attention_scratch,
          doc="attention with the score scale given (Gemma's query_pre_attn_scalar^-0.5) and, for "
              "window > 0, a row at position p attending to positions p-window+1..p only (0: all)"),
    OpDef("geglu", 24, (2,), _elementwise("geglu"), inplace=(0, 1),
          doc="gelu_tanh(g) * u (Gemma's gated MLP, transformers' gelu_pytorch_tanh)"),
]}


# the ops that own a layer's KV cache (its `layer` attribute)
ATTENTION_OPS = ("attention", "attention_packed", "attention_window")


def check_attrs(op: OpDef, attrs: Mapping[str, Any]) -> None:
    """Raise IRTypeError unless attrs are exactly the op's declared attributes with the right types."""
    missing = [k for k in op.attrs if k not in attrs]
    extra = [k for k in attrs if k not in op.attrs]
    if missing or extra:
        raise IRTypeError(f"{op.name}: attributes {sorted(attrs)} do not match the declared "
                          f"{sorted(op.attrs)} (missing {missing}, unexpected {extra})")
    for k, t in op.attrs.items():
        v = attrs[k]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) if t is float else \
            isinstance(v, t) and not isinstance(v, bool)
        if not ok:
            raise IRTypeError(f"{op.name}: attribute {k}={v!r} must be {t.__name__}")
        # sizes count something, eps and theta are positive scales; layer indices start at 0, a
        # window of 0 means none
        # window of 0 means none; the executor holds every int attribute in 32 bits
        lo = 0 if k in ("layer", "window") else 1
        if (t is int and not lo <= v <= INT32_MAX) or (t is float and not (math.isfinite(v) and v > 0)):
            raise IRTypeError(f"{op.name}: attribute {k}={v!r} must be "
                              f"{f'in {lo}..{INT32_MAX}' if t is int else 'a positive finite number'}")


def infer_type(opname: str, in_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """Type propagation: the output type of `opname` on these inputs, or IRTypeError."""
    op = OPS.get(opname)
    if op is None:
        raise IRTypeError(f"unknown op {opname!r}; known ops: {', '.join(sorted(OPS))}")
    if len(in_types) not in op.arity:
        raise IRTypeError(f"{opname}: takes {' or '.join(map(str, op.arity))} inputs, got {len(in_types)}")
    check_attrs(op, attrs)
    return op.rule(list(in_types), attrs)
