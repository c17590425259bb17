"""Lowering: a planned graph becomes the instruction tape the C executor runs.

The tape is flat. Each instruction has an opcode (the op table's, IG_OP_<NAME> in C), an output
operand, activation operands, weight references (indices into `Tape.weights`, resolved to pointers
once at load), integer and float scalars (the op's attributes in op-table order), and the size of
the op's scratch (which lives at `Tape.scratch_offset` in the arena, shared by all instructions).

An operand is (space, index-or-offset, row symbol, columns):
  ARENA  - byte offset into the activation arena
  INPUT  - index into `Tape.inputs` (tokens, pos, rows), supplied per step
  OUTPUT - index into `Tape.outputs` (logits), a caller-owned buffer
Rows are symbolic (T or R, bound per step, never above the planned bound); columns are static.
The KV cache is per-layer state addressed by the attention instruction's `layer` scalar.
A weight the graph carries as a constant (rope frequencies computed from the config) is referenced
like any weight; `Tape.constants` holds its values, which whoever resolves `Tape.weights` to arrays
takes from there, not from the checkpoint.
`Tape.to_records()` packs the tape into one fixed-width NumPy structured array for the C side.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops import ATTENTION_OPS, OPS
from .arena import MemoryPlan, PlanError


class Space(IntEnum):
    ARENA = 0
    INPUT = 1
    OUTPUT = 2


ROW_SYMBOLS = {"T": -1, "R": -2}     # encoding of symbolic row counts in records


@dataclass(frozen=True)
class Operand:
    space: Space
    where: int                   # arena byte offset, or input/output index
    rows: int | str              # row count: a symbol (T, R) or a constant
    cols: int                    # elements per row (1 for vectors such as tokens)
    dtype: str

    def __str__(self) -> str:
        loc = {Space.ARENA: f"arena+{self.where}", Space.INPUT: f"in{self.where}",
               Space.OUTPUT: f"out{self.where}"}[self.space]
        return f"{loc}:{self.dtype}[{self.rows},{self.cols}]"


@dataclass(frozen=True)
class Instr:
    opcode: int
    op: str
    name: str
    out: Operand
    args: tuple[Operand, ...]
    weights: tuple[int, ...]
    ints: tuple[int, ...]
    floats: tuple[float, ...]
    scratch_bytes: int


@dataclass
class Tape:
    instrs: list[Instr]
    weights: list[str]            # Hugging Face tensor names, referenced by index
    inputs: list[str]
    outputs: list[str]
    output_bytes: list[int]       # at the planned bounds
    arena_bytes: int              # activations
    scratch_offset: int           # == arena_bytes: scratch follows the activations
    scratch_bytes: int
    bounds: dict[str, int]
    n_ctx: int
    kv_layers: list[tuple[int, int]]   # (layer, n_kv_heads*head_dim) per attention instruction
    # values of the weights that are graph constants (by name, a subset of `weights`)
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    MAX_ARGS = 4
    MAX_WEIGHTS = 8
    MAX_INTS = 6
    MAX_FLOATS = 2

    def format(self) -> str:
        """Deterministic text form (golden files)."""
        lines = [f"tape bounds={self.bounds} n_ctx={self.n_ctx} arena={self.arena_bytes} "
                 f"scratch={self.scratch_bytes}@{self.scratch_offset}",
                 "inputs " + " ".join(self.inputs), "outputs " + " ".join(
                     f"{k}({b})" for k, b in zip(self.outputs, self.output_bytes))]
        if self.constants:
            lines.append("constants " + " ".join(f"w{self.weights.index(k)}={k}"
                                                 for k in sorted(self.constants, key=self.weights.index)))
        for i, ins in enumerate(self.instrs):
            ws = " ".join(f"w{w}" for w in ins.weights)
            lines.append(f"{i:4d} {ins.op:<16} {ins.out} <- {' '.join(map(str, ins.args))}"
                         f"{' ' + ws if ws else ''} ints={list(ins.ints)} floats={list(ins.floats)}"
                         f"{f' scratch={ins.scratch_bytes}' if ins.scratch_bytes else ''}  # {ins.name}")
        return "\n".join(lines) + "\n"

    def to_records(self) -> np.ndarray:
        """One row per instruction, fixed width; unused slots are -1 (operands) or 0 (scalars)."""
        dt = np.dtype([
            ("opcode", "<i4"), ("n_args", "<i4"), ("n_weights", "<i4"), ("pad", "<i4"),
            ("out_space", "<i4"), ("out_rows", "<i4"), ("out_where", "<i8"), ("out_cols", "<i8"),
            ("arg_space", "<i4", (self.MAX_ARGS,)), ("arg_rows", "<i4", (self.MAX_ARGS,)),
            ("arg_where", "<i8", (self.MAX_ARGS,)), ("arg_cols", "<i8", (self.MAX_ARGS,)),
            ("weight", "<i4", (self.MAX_WEIGHTS,)), ("ints", "<i8", (self.MAX_INTS,)),
            ("floats", "<f8", (self.MAX_FLOATS,)), ("scratch_bytes", "<i8"),
        ])
        rec = np.zeros(len(self.instrs), dt)
        for f in ("arg_space", "arg_rows", "arg_where", "arg_cols", "weight"):
            rec[f] = -1

        def rows(r):
            return ROW_SYMBOLS[r] if isinstance(r, str) else r

        for i, ins in enumerate(self.instrs):
            if (len(ins.args) > self.MAX_ARGS or len(ins.weights) > self.MAX_WEIGHTS
                    or len(ins.ints) > self.MAX_INTS or len(ins.floats) > self.MAX_FLOATS):
                raise PlanError(f"instruction {i} ({ins.op}) has more operands than the record layout "
                                f"holds; widen Tape.MAX_* (and the C struct) together")
            r = rec[i]
            r["opcode"], r["n_args"], r["n_weights"] = ins.opcode, len(ins.args), len(ins.weights)
            r["out_space"], r["out_rows"] = int(ins.out.space), rows(ins.out.rows)
            r["out_where"], r["out_cols"] = ins.out.where, ins.out.cols
            for j, a in enumerate(ins.args):
                r["arg_space"][j], r["arg_rows"][j] = int(a.space), rows(a.rows)
                r["arg_where"][j], r["arg_cols"][j] = a.where, a.cols
            r["weight"][:len(ins.weights)] = ins.weights
            r["ints"][:len(ins.ints)] = ins.ints
            r["floats"][:len(ins.floats)] = ins.floats
            r["scratch_bytes"] = ins.scratch_bytes
        return rec


def lower(g: Graph, plan: MemoryPlan) -> Tape:
    """The instruction tape for `g` placed by `plan` (which must be a plan of this graph)."""
    inputs = list(g.inputs)
    outputs = list(g.outputs)
    out_index = {id(v): i for i, v in enumerate(g.outputs.values())}
    weights: list[str] = []
    widx: dict[str, int] = {}

    def operand(v: Value) -> Operand:
        shape = v.type.shape
        rows, cols = shape[0], (shape[1] if len(shape) > 1 else 1)
        if v.kind == "input":
            return Operand(Space.INPUT, inputs.index(v.name), rows, cols, v.type.dtype)
        if id(v) in out_index:
            return Operand(Space.OUTPUT, out_index[id(v)], rows, cols, v.type.dtype)
        if v.name not in plan.offsets:
            raise PlanError(f"value {v.name!r} has no place in the plan: the plan was made for "
                            f"another graph; plan this graph with plan_memory first")
        return Operand(Space.ARENA, plan.offsets[v.name], rows, cols, v.type.dtype)

    instrs = []
    kv = []
    for n in g.nodes:
        op = OPS[n.op]
        wf = op.weights_from if op.weights_from is not None else len(n.inputs)
        ws = []
        for w in n.inputs[wf:]:
            if w.name not in widx:
                widx[w.name] = len(weights)
                weights.append(w.name)
            ws.append(widx[w.name])
        ints = tuple(int(n.attrs[k]) for k, t in op.attrs.items() if t is int)
        floats = tuple(float(n.attrs[k]) for k, t in op.attrs.items() if t is float)
        scratch = 0
        if op.scratch is not None:
            scratch = op.scratch([v.type for v in n.inputs], n.attrs, plan.bounds, plan.n_ctx)
        if n.op in ATTENTION_OPS:
            kv.append((n.attrs["layer"], n.attrs["n_kv_heads"] * n.attrs["head_dim"]))
        instrs.append(Instr(op.opcode, n.op, n.name, operand(n.out),
                            tuple(operand(v) for v in n.inputs[:wf]), tuple(ws), ints, floats, scratch))
    return Tape(instrs, weights, inputs, outputs, [plan.outputs[k] for k in outputs], plan.arena_bytes,
                plan.arena_bytes, plan.scratch_bytes, dict(plan.bounds), plan.n_ctx, kv,
                {k: g.constants[k] for k in weights if k in g.constants})
