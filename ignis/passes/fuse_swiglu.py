"""Seed fusion: silu(g) * u becomes one swiglu(g, u).

Requires: a verified graph. Guarantees: every mul with a silu operand read only by that mul is one
swiglu (the silu's input first, the other factor second) named like the mul. Must run before
fuse_gate_up, which matches swiglu.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer


def _pattern(g, n):
    for i in (0, 1):
        s = producer(n.inputs[i], "silu")
        if s is not None:
            return {"root": n, "silu": s, "other": n.inputs[1 - i]}
    return None


def _check(g, m):
    v = m["silu"].out
    # mul(s, s) reads the silu twice: not a swiglu
    return len(v.users) == 1 and m["other"] is not v and all(o is not v for o in g.outputs.values())


RULE = Rule(
    name="swiglu", root="mul", pattern=_pattern, check=_check,
    rewrite=lambda b, m, v: b.op("swiglu", v(m["silu"].inputs[0]), v(m["other"]), name=m["root"].name),
)


def fuse_swiglu(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
