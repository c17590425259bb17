"""The verifier: checks every IR invariant and names the node at fault. Run after every pass."""
from __future__ import annotations

from .errors import IRTypeError, IRVerifyError
from .graph import Graph, Value
from .ops import OPS, infer_type


def verify(g: Graph) -> None:
    """Raise IRVerifyError on the first broken invariant: SSA (each value defined once, by its own
    node), topological order (uses after definitions), known ops and arity, weight positions,
    attributes and types (re-derived by the op table), user lists, unique node names, outputs."""
    defined: set[int] = set()

    def where(i: int, n) -> str:
        return f"node %{i} {n.name!r} ({n.op})"

    for k, v in g.inputs.items():
        if v.kind != "input" or v.name != k or v.node is not None:
            raise IRVerifyError(f"graph input {k!r} is not an input value named {k!r}: {v!r}")
        defined.add(id(v))
    for k, v in g.weights.items():
        if v.kind != "weight" or v.name != k or v.node is not None:
            raise IRVerifyError(f"weight {k!r} is not a weight value named {k!r}: {v!r}")
        defined.add(id(v))
    for k, a in g.constants.items():
        w = g.weights.get(k)
        if w is None or tuple(a.shape) != w.type.shape or a.dtype != "float32" or w.type.dtype != "f32":
            raise IRVerifyError(f"constant {k!r} ({a.dtype}{list(a.shape)}) is not an f32 weight of "
                                f"the graph with its shape ({w.type if w else 'no weight'})")

    names: set[str] = set()
    expected_users: dict[int, list] = {id(v): [] for v in (*g.inputs.values(), *g.weights.values())}
    values: dict[int, Value] = {id(v): v for v in (*g.inputs.values(), *g.weights.values())}
    for i, n in enumerate(g.nodes):
        if n.op not in OPS:
            raise IRVerifyError(f"{where(i, n)}: unknown op")
        if n.name in names:
            raise IRVerifyError(f"{where(i, n)}: node name used twice")
        names.add(n.name)
        opdef = OPS[n.op]
        for j, v in enumerate(n.inputs):
            if id(v) not in defined:
                if v.kind == "node" and any(m.out is v for m in g.nodes[i:]):
                    raise IRVerifyError(f"{where(i, n)}: input {j} ({v.name}) is used before the node "
                                        f"that defines it (graph not in topological order)")
                raise IRVerifyError(f"{where(i, n)}: input {j} ({v!r}) is not defined in this graph")
            if opdef.weights_from is not None and (j >= opdef.weights_from) != (v.kind == "weight"):
                raise IRVerifyError(f"{where(i, n)}: input {j} must be "
                                    f"{'a weight' if j >= opdef.weights_from else 'an activation'}, "
                                    f"got {v!r}")
            expected_users[id(v)].append(n)
        try:
            t = infer_type(n.op, [v.type for v in n.inputs], n.attrs)
        except IRTypeError as e:
            raise IRVerifyError(f"{where(i, n)}: {e}") from None
        if n.out.node is not n or n.out.kind != "node":
            raise IRVerifyError(f"{where(i, n)}: output value does not point back to its node")
        if id(n.out) in defined:
            raise IRVerifyError(f"{where(i, n)}: output value is defined twice (SSA violated)")
        if t != n.out.type:
            raise IRVerifyError(f"{where(i, n)}: output type {n.out.type} but the op table derives {t}")
        defined.add(id(n.out))
        expected_users[id(n.out)] = []
        values[id(n.out)] = n.out

    for vid, want in expected_users.items():
        v = values[vid]
        if len(v.users) != len(want) or any(a is not b for a, b in zip(v.users, want)):
            raise IRVerifyError(f"value {v.name!r}: users list {[u.name for u in v.users]} does not "
                                f"match the nodes reading it {[u.name for u in want]}")
    if not g.outputs:
        raise IRVerifyError("graph has no outputs")
    for k, v in g.outputs.items():
        if id(v) not in defined:
            raise IRVerifyError(f"output {k!r} ({v!r}) is not defined in this graph")
