"""SSA graph: typed values, nodes in topological order with maintained users, and the builder.

Every value is defined once: a graph input (``%tokens``), a weight (referred to by its Hugging Face
name) or the single output of one node. A node's output type comes from the op table when the node
is created, so a shape mismatch is an error at build time. A weight whose values the builder
computed from the config (rope frequencies) is a constant: the graph carries its array.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import IRBuildError
from .ops import OPS, infer_type
from .types import TensorType


class Value:
    """One SSA value. `users` lists the nodes reading it, once per read, in graph order."""
    __slots__ = ("type", "kind", "name", "node", "users")

    def __init__(self, type: TensorType, kind: str, name: str, node: "Node | None" = None):
        self.type = type
        self.kind = kind            # "input" | "weight" | "node"
        self.name = name
        self.node = node
        self.users: list[Node] = []

    def __repr__(self) -> str:
        return f"Value({self.kind} {self.name} :: {self.type})"


class Node:
    __slots__ = ("op", "inputs", "attrs", "name", "out")

    def __init__(self, op: str, inputs: tuple[Value, ...], attrs: dict[str, Any], name: str,
                 out_type: TensorType):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.name = name
        self.out = Value(out_type, "node", name, self)

    @property
    def opdef(self):
        return OPS[self.op]

    def __repr__(self) -> str:
        return f"Node({self.op} {self.name})"


class Graph:
    """Inputs, weights, nodes (topological order) and named outputs. Passes never mutate one:
    they build a new graph (see passes/rewrite.py)."""

    def __init__(self, name: str):
        self.name = name
        self.inputs: dict[str, Value] = {}
        self.weights: dict[str, Value] = {}
        self.constants: dict[str, np.ndarray] = {}   # weight name -> its values, for constants
        self.nodes: list[Node] = []
        self.outputs: dict[str, Value] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in graph {self.name!r}")

    def copy(self) -> "Graph":
        """A deep copy (new Value and Node objects, same structure)."""
        b = GraphBuilder(self.name)
        vmap = b.declare_like(self)
        for n in self.nodes:
            vmap[n.out] = b.op(n.op, *(vmap[v] for v in n.inputs), name=n.name, **n.attrs)
        for k, v in self.outputs.items():
            b.output(k, vmap[v])
        return b.finish()

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)


class GraphBuilder:
    """Builds a Graph node by node; type propagation runs in `op`."""

    def __init__(self, name: str):
        self.graph = Graph(name)
        self._names: set[str] = set()
        self._values: set[int] = set()

    def _own(self, v: Value) -> Value:
        self._values.add(id(v))
        return v

    def input(self, name: str, type: TensorType) -> Value:
        if name in self.graph.inputs:
            raise IRBuildError(f"graph input {name!r} declared twice")
        v = self._own(Value(type, "input", name))
        self.graph.inputs[name] = v
        return v

    def weight(self, name: str, type: TensorType) -> Value:
        """The weight named `name` (a Hugging Face tensor name), declared on first use."""
        v = self.graph.weights.get(name)
        if v is not None:
            if v.type != type:
                raise IRBuildError(f"weight {name!r} used as {type} but declared as {v.type}")
            return v
        v = self._own(Value(type, "weight", name))
        self.graph.weights[name] = v
        return v

    def constant(self, name: str, data: np.ndarray) -> Value:
        """A weight whose values are `data` (f32), carried by the graph: computed from the config
        (rope frequencies), not read from a checkpoint. Declared once; a second declaration must
        give the same values."""
        data = np.ascontiguousarray(data, dtype=np.float32)
        data.setflags(write=False)
        old = self.graph.constants.get(name)
        if old is not None and not np.array_equal(old, data):
            raise IRBuildError(f"constant {name!r} declared twice with different values")
        if old is None and name in self.graph.weights:
            raise IRBuildError(f"constant {name!r} is already a checkpoint weight of this graph")
        v = self.weight(name, TensorType(data.shape, "f32"))
        self.graph.constants[name] = data
        return v

    def op(self, opname: str, *inputs: Value, name: str, **attrs: Any) -> Value:
        for i, v in enumerate(inputs):
            if not isinstance(v, Value) or id(v) not in self._values:
                raise IRBuildError(f"{opname} {name!r}: input {i} ({v!r}) is not a value of this graph")
        if name in self._names:
            raise IRBuildError(f"node name {name!r} used twice; node names must be unique")
        opdef = OPS.get(opname)
        if opdef is not None and opdef.weights_from is not None:
            for i, v in enumerate(inputs):
                is_w = i >= opdef.weights_from
                if is_w != (v.kind == "weight"):
                    raise IRBuildError(f"{opname} {name!r}: input {i} must be "
                                       f"{'a weight' if is_w else 'an activation'}, got {v!r}")
        out_type = infer_type(opname, [v.type for v in inputs], attrs)
        node = Node(opname, tuple(inputs), dict(attrs), name, out_type)
        for v in inputs:
            v.users.append(node)
        self._names.add(name)
        self.graph.nodes.append(node)
        return self._own(node.out)

    def output(self, name: str, value: Value) -> None:
        if id(value) not in self._values:
            raise IRBuildError(f"output {name!r} is not a value of this graph")
        self.graph.outputs[name] = value

    def declare_like(self, src: Graph) -> dict[Value, Value]:
        """Declare src's inputs and weights here; returns the old -> new value map to extend."""
        vmap: dict[Value, Value] = {}
        for k, v in src.inputs.items():
            vmap[v] = self.input(k, v.type)
        for k, v in src.weights.items():
            c = src.constants.get(k)
            vmap[v] = self.constant(k, c) if c is not None else self.weight(k, v.type)
        return vmap

    def finish(self) -> Graph:
        # weights nothing reads any more are not part of the graph
        g = self.graph
        g.weights = {k: v for k, v in g.weights.items() if v.users}
        g.constants = {k: a for k, a in g.constants.items() if k in g.weights}
        return g
