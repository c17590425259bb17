"""Seed fusion: rms_normalize followed by scale becomes one rmsnorm.

Requires: a verified graph. Guarantees: every scale(rms_normalize(x), w) whose normalized value
is read only by that scale is one rmsnorm(x, w) with the same eps and the scale's name; nothing else
changes. Must run before passes that pattern-match rmsnorm.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user

RULE = Rule(
    name="rmsnorm",
    root="scale",
    pattern=lambda g, n: (None if producer(n.inputs[0], "rms_normalize") is None
                          else {"root": n, "norm": n.inputs[0].node}),
    check=lambda g, m: sole_user(g, m["norm"].out, m["root"]),
    rewrite=lambda b, m, v: b.op("rmsnorm", v(m["norm"].inputs[0]), v(m["root"].inputs[1]),
                                 name=m["root"].name, eps=m["norm"].attrs["eps"]),
)


def fuse_rmsnorm(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
