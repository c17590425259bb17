"""Deterministic text form of a graph: one line per node, values numbered by position.

    %12 = rmsnorm(%11, model.layers.3.post_attention_layernorm.weight) eps=1e-06 :: f32[T,896]  # blk.3.ffn_norm

Graph inputs print as %name, weights by their (Hugging Face) name, node outputs as %index.
"""
from __future__ import annotations

from typing import Any

from .graph import Graph, Node, Value
from .ops import OPS


def format_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def format_graph(g: Graph, *, weights: bool = True) -> str:
    index = {id(n.out): i for i, n in enumerate(g.nodes)}

    def ref(v: Value) -> str:
        if v.kind == "node":
            i = index.get(id(v))
            return f"%{i}" if i is not None else f"%<foreign {v.name}>"
        if v.kind == "input":
            return f"%{v.name}"
        return v.name

    lines = [f"graph {g.name}"]
    for v in g.inputs.values():
        lines.append(f"  input %{v.name} :: {v.type}")
    if weights:
        for v in g.weights.values():
            kind = "constant" if v.name in g.constants else "weight"
            lines.append(f"  {kind} {v.name} :: {v.type}")
    for i, n in enumerate(g.nodes):
        lines.append("  " + format_node(n, i, ref))
    for k, v in g.outputs.items():
        lines.append(f"  output {k} = {ref(v)}")
    return "\n".join(lines) + "\n"


def format_node(n: Node, i: int, ref) -> str:
    args = ", ".join(ref(v) for v in n.inputs)
    # declared order for known ops keeps lines stable; a broken graph still prints
    order = list(OPS[n.op].attrs) if n.op in OPS else sorted(n.attrs)
    attrs = "".join(f" {k}={format_attr(n.attrs[k])}" for k in order if k in n.attrs)
    return f"%{i} = {n.op}({args}){attrs} :: {n.out.type}  # {n.name}"

