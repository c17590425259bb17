"""The residual add moves into the epilogue of the matmul that feeds it.

Requires: a verified graph. Guarantees: add(r, linear(x, W[, b])) (either operand order) whose
product is read only by the add is one linear_add(x, r, W[, b]) named like the add: the product is
written once, already summed, and its [T, dim] temporary disappears.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user


def _pattern(g, n):
    # prefer the second operand: the builders write residuals as add(x, product)
    for i in (1, 0):
        lin = producer(n.inputs[i], "linear")
        if lin is not None and sole_user(g, lin.out, n) and n.inputs[1 - i] is not lin.out:
            return {"root": n, "lin": lin, "residual": n.inputs[1 - i]}
    return None


RULE = Rule(
    name="residual", root="add", pattern=_pattern, check=lambda g, m: True,
    rewrite=lambda b, m, v: b.op("linear_add", v(m["lin"].inputs[0]), v(m["residual"]),
                                 *(v(w) for w in m["lin"].inputs[1:]), name=m["root"].name),
)


def fuse_residual(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
