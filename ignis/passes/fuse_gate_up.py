"""Gate and up projections of one input become one matmul with the SwiGLU epilogue.

Requires: fuse_swiglu has run (matches swiglu(linear(h,Wg), linear(h,Wu)) without biases).
Guarantees: where both projections are read only by the swiglu, the three ops are one
linear_swiglu(h, Wg, Wu) named like the swiglu; the two [T, hidden_dim] intermediates disappear.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user


def _pattern(g, n):
    lg, lu = producer(n.inputs[0], "linear"), producer(n.inputs[1], "linear")
    if lg is None or lu is None:
        return None
    return {"root": n, "gate": lg, "up": lu}


def _check(g, m):
    lg, lu, n = m["gate"], m["up"], m["root"]
    return (len(lg.inputs) == len(lu.inputs) == 2 and lg.inputs[0] is lu.inputs[0] and lg is not lu
            and sole_user(g, lg.out, n) and sole_user(g, lu.out, n))


RULE = Rule(
    name="gate_up", root="swiglu", pattern=_pattern, check=_check,
    rewrite=lambda b, m, v: b.op("linear_swiglu", v(m["gate"].inputs[0]), v(m["gate"].inputs[1]),
                                 v(m["up"].inputs[1]), name=m["root"].name),
)


def fuse_gate_up(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
