"""Dead-code elimination.

Requires: a verified graph. Guarantees: every remaining pure node's output is read by a node or
is a graph output; impure nodes (KV cache writes) are always kept; order and names unchanged;
weights nothing reads are dropped. Runs first (so counts see only live ops) and after each
fusion (the rule driver calls it to remove the fused patterns' interiors).
"""
from __future__ import annotations

from ..ir.graph import Graph, GraphBuilder


def dce(g: Graph) -> Graph:
    live: set[int] = {id(v) for v in g.outputs.values()}
    keep = [False] * len(g.nodes)
    for i in range(len(g.nodes) - 1, -1, -1):
        n = g.nodes[i]
        if id(n.out) in live or not n.opdef.pure:
            keep[i] = True
            live.update(id(v) for v in n.inputs)
    b = GraphBuilder(g.name)
    vmap = b.declare_like(g)
    for n, k in zip(g.nodes, keep):
        if k:
            vmap[n.out] = b.op(n.op, *(vmap[v] for v in n.inputs), name=n.name, **n.attrs)
    for k, v in g.outputs.items():
        b.output(k, vmap[v])
    return b.finish()
