"""RoPE moves into the epilogue of the packed q/k/v projection.

Requires: fuse_qkv has run (matches rope_qkv(linear_qkv(...))). Guarantees: where the packed
projection is read only by its rope, the pair is one linear_qkv_rope named like the rope (the rope's
inverse-frequency table, if any, its last weight); the kernel rotates q and k while the freshly
computed rows are in registers.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user

RULE = Rule(
    name="rope_qkv",
    root="rope_qkv",
    pattern=lambda g, n: (None if producer(n.inputs[0], "linear_qkv") is None
                          else {"root": n, "proj": n.inputs[0].node}),
    check=lambda g, m: sole_user(g, m["proj"].out, m["root"]),
    rewrite=lambda b, m, v: b.op("linear_qkv_rope", v(m["proj"].inputs[0]), v(m["root"].inputs[1]),
                                 *(v(w) for w in (*m["proj"].inputs[1:], *m["root"].inputs[2:])),
                                 name=m["root"].name, **m["root"].attrs),
)


def fuse_rope_qkv(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
