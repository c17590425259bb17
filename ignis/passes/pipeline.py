"""The pass pipeline: one list, a reason per position, the verifier after every pass.

Positions 0-2 are the seed article's passes (435 -> 362 ops on Qwen2.5-0.5B); the rest go past it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import IgnisError
from ..ir.graph import Graph
from ..ir.verify import verify
from .dce import dce
from .fold_rmsnorm import fold_rmsnorm
from .fuse_gate_up import fuse_gate_up
from .fuse_qkv import fuse_qkv
from .fuse_residual import fuse_residual
from .fuse_rmsnorm import fuse_rmsnorm
from .fuse_rope_qkv import fuse_rope_qkv
from .fuse_swiglu import fuse_swiglu
from .select_logit_rows import select_logit_rows

Pass = Callable[[Graph], Graph]


class PassError(IgnisError, RuntimeError):
    """A pass raised, or left a graph the verifier rejects. Names the pass and the ones before it."""

    def __init__(self, message: str, *, pass_name: str, before: Sequence[str]):
        self.pass_name = pass_name
        self.before = tuple(before)
        super().__init__(f"pass {pass_name!r} failed (after {', '.join(before) or 'no passes'}): "
                         f"{message}")


@dataclass(frozen=True)
class PassEntry:
    name: str
    fn: Pass
    reason: str


PIPELINE: list[PassEntry] = [
    PassEntry("dce", dce, "builders may leave unread values; count and match live ops only"),
    PassEntry("fuse_rmsnorm", fuse_rmsnorm, "seed: normalize+scale in one pass over each row"),
    PassEntry("fuse_swiglu", fuse_swiglu, "seed: silu+mul in one elementwise pass"),
    PassEntry("select_logit_rows", select_logit_rows,
              "lm_head is the largest matmul: run it only on rows that need logits"),
    PassEntry("fuse_qkv", fuse_qkv, "q/k/v read one input: one packed matmul reads it once"),
    PassEntry("fuse_rope_qkv", fuse_rope_qkv, "rotate q/k in the projection epilogue (needs fuse_qkv)"),
    PassEntry("fuse_gate_up", fuse_gate_up,
              "gate/up read one input; swiglu epilogue drops two [T,hidden] values (needs fuse_swiglu)"),
    PassEntry("fuse_residual", fuse_residual, "residual add in the matmul epilogue: no [T,dim] temp"),
    PassEntry("dce", dce, "leave nothing dead for the planner"),
]
SEED_PASSES = 3          # PIPELINE[:SEED_PASSES] is exactly what the seed article ran

# Correct and tested, but not in the default list: each needs kernels the runtime may not have yet.
OPTIONAL: list[PassEntry] = [
    PassEntry("fold_rmsnorm", fold_rmsnorm,
              "norm as the matmul prologue (rms_* ops): pays once the kernels pack input rows anyway"),
]
PASSES: dict[str, Pass] = {e.name: e.fn for e in [*PIPELINE, *OPTIONAL]}


@dataclass
class PipelineResult:
    graph: Graph
    stages: list[tuple[str, int]] = field(default_factory=list)   # (pass name, node count after)


def select_passes(names: Sequence[str]) -> list[PassEntry]:
    """Pass entries by name, in the order given (unknown names: PassError listing known ones)."""
    by_name = {e.name: e for e in [*PIPELINE, *OPTIONAL]}
    out = []
    for nm in names:
        if nm not in by_name:
            raise PassError(f"unknown pass; known passes: {', '.join(by_name)}", pass_name=nm, before=[])
        out.append(by_name[nm])
    return out


def run_pipeline(g: Graph, passes: Sequence[PassEntry] = PIPELINE, *, check: bool = True) -> PipelineResult:
    """Run `passes` in order; verify the input and every pass's result (unless check=False)."""
    if check:
        try:
            verify(g)
        except IgnisError as e:
            raise PassError(f"the input graph does not verify: {e}", pass_name="<input>", before=[]) from e
    res = PipelineResult(g, [("input", len(g))])
    done: list[str] = []
    for e in passes:
        try:
            out = e.fn(res.graph)
        except Exception as exc:        # any failure inside a pass is reported with its position
            raise PassError(f"{type(exc).__name__}: {exc}", pass_name=e.name, before=done) from exc
        if check:
            try:
                verify(out)
            except IgnisError as exc:
                raise PassError(f"result does not verify: {exc}", pass_name=e.name, before=done) from exc
        res.graph = out
        res.stages.append((e.name, len(out)))
        done.append(e.name)
    return res
