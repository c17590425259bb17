"""RMSNorm folds into the prologue of the matmul that is its only reader.

Requires: the other fusions have run (it matches rmsnorm feeding linear, linear_qkv_rope or
linear_swiglu as the activation input). Guarantees: where the normalized value is read only by that
matmul, the pair is one rms_linear / rms_linear_qkv_rope / rms_linear_swiglu named like the matmul,
with the norm weight as its first weight; the normalized rows live in per-op scratch, not in the
arena. Run last among the fusions. Pays when the matmul quantizes or packs its input rows anyway
(decode's int8 activation path): the normalization rides along that pass for free.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user

_FOLDED = {"linear": ("rms_linear", 1), "linear_qkv_rope": ("rms_linear_qkv_rope", 2),
           "linear_swiglu": ("rms_linear_swiglu", 1)}


def _rule(op: str) -> Rule:
    fused, wpos = _FOLDED[op]

    def pattern(g, n):
        norm = producer(n.inputs[0], "rmsnorm")
        return None if norm is None else {"root": n, "norm": norm}

    def rewrite(b, m, v):
        n, norm = m["root"], m["norm"]
        ins = [v(x) for x in n.inputs]
        ins[0] = v(norm.inputs[0])
        ins.insert(wpos, v(norm.inputs[1]))
        return b.op(fused, *ins, name=n.name, eps=norm.attrs["eps"], **n.attrs)

    return Rule(name=f"fold_rmsnorm_{op}", root=op, pattern=pattern,
                check=lambda g, m: sole_user(g, m["norm"].out, m["root"]), rewrite=rewrite)


RULES = [_rule(op) for op in _FOLDED]


def fold_rmsnorm(g: Graph) -> Graph:
    return apply_rules(g, RULES)
