"""Logits only for the rows that need them: a take_rows moves in front of the output's row-wise tail.

Requires: a verified graph whose outputs are computed row by row from one activation (e.g.
output = linear(rmsnorm(x))). Guarantees: a new graph input %rows (i32[R]) and, for each output,
take_rows(x, %rows) inserted before the longest row-wise chain (rmsnorm, scale, rms_normalize,
linear, whose values feed nothing else) ending at the output; outputs become [R, ...] equal to the
selected rows of before. Prefill then runs lm_head (the largest matmul) on R rows instead of T.
Idempotent: a graph that already has %rows is returned unchanged (as a copy). An output named
`hidden` (the embedding graph's final-norm states) is left alone: pooling reads every row; a
graph with nothing to select is returned unchanged (no %rows input).
"""
from __future__ import annotations

from ..ir.graph import Graph, GraphBuilder
from ..ir.types import i32
from .rewrite import sole_user

ROWWISE = ("rms_normalize", "scale", "rmsnorm", "linear")
ALL_ROWS = ("hidden",)      # outputs whose every row is wanted


def select_logit_rows(g: Graph) -> Graph:
    if "rows" in g.inputs:
        return g.copy()
    chains: dict[str, list] = {}
    for k, out in g.outputs.items():
        chain: list = []
        v = out
        if k in ALL_ROWS or out.users or list(g.outputs.values()).count(out) > 1:
            continue
        while v.kind == "node" and v.node.op in ROWWISE and (not chain or sole_user(g, v, chain[-1])):
            chain.append(v.node)
            v = v.node.inputs[0]
        if chain:
            chains[k] = chain[::-1]
    if not chains:
        return g.copy()        # nothing row-wise to select (e.g. only `hidden`): no %rows input
    in_chain = {id(n) for c in chains.values() for n in c}
    if len(in_chain) != sum(len(c) for c in chains.values()):
        return g.copy()        # outputs sharing a tail: leave it, selecting rows twice is not a win

    b = GraphBuilder(g.name)
    vmap = b.declare_like(g)
    rows = b.input("rows", i32("R"))
    for n in g.nodes:
        if id(n) not in in_chain:
            vmap[n.out] = b.op(n.op, *(vmap[v] for v in n.inputs), name=n.name, **n.attrs)
    for k, chain in chains.items():
        first = chain[0]
        sel = b.op("take_rows", vmap[first.inputs[0]], rows,
                   name="output_rows" if k == "logits" else f"{k}_rows")
        for n in chain:
            ins = [sel if n is first and j == 0 else vmap[v] for j, v in enumerate(n.inputs)]
            vmap[n.out] = b.op(n.op, *ins, name=n.name, **n.attrs)
    for k, v in g.outputs.items():
        b.output(k, vmap[v])
    return b.finish()
