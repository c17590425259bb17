"""The (pattern, check, rewrite) rule driver shared by the fusion passes.

A rule is anchored at its root node (the last node of the pattern). The driver rebuilds the graph
node by node; where a rule's pattern matches at a node and its check passes, the rule's rewrite
emits replacement nodes and the root's output is mapped to the replacement. The pattern's interior
nodes are copied as they come (they precede the root) and become dead; DCE then removes them.
A failed check means "no match", never an exception.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..ir.graph import Graph, GraphBuilder, Node, Value

Match = dict[str, Any]
Lookup = Callable[[Value], Value]


@dataclass(frozen=True)
class Rule:
    name: str
    root: str                                            # op of the pattern's last node
    pattern: Callable[[Graph, Node], Optional[Match]]    # structure only
    check: Callable[[Graph, Match], bool]                # conditions that make the rewrite valid
    rewrite: Callable[[GraphBuilder, Match, Lookup], Value]


def producer(v: Value, op: str) -> Node | None:
    """The node defining v if it is an `op` node, else None."""
    return v.node if v.kind == "node" and v.node is not None and v.node.op == op else None


def sole_user(g: Graph, v: Value, node: Node) -> bool:
    """v is read by `node` only, once, and is not a graph output (so fusing it away is safe)."""
    return len(v.users) == 1 and v.users[0] is node and all(o is not v for o in g.outputs.values())


def apply_rules(g: Graph, rules: list[Rule]) -> Graph:
    """A new graph with every rule applied once at each root where it matches, then DCE."""
    from .dce import dce
    b = GraphBuilder(g.name)
    vmap = b.declare_like(g)
    for n in g.nodes:
        new = None
        for r in rules:
            if r.root != n.op:
                continue
            m = r.pattern(g, n)
            if m is not None and r.check(g, m):
                new = r.rewrite(b, m, vmap.__getitem__)
                break
        if new is None:
            new = b.op(n.op, *(vmap[v] for v in n.inputs), name=n.name, **n.attrs)
        vmap[n.out] = new
    for k, v in g.outputs.items():
        b.output(k, vmap[v])
    return dce(b.finish())

