"""`ignis inspect`: compile one forward step of a model and report what each stage achieves.

Ops are counted the seed article's way: every node except the embedding lookup (a gather the
article did not count), so Qwen2.5-0.5B shows 435 -> 362. Buffers: "one buffer per value" counts
every node value (the embedding row included: 363 after the seed's fusions); planned, it is the
peak number of values alive at one instruction, i.e. the buffers a whole-buffer reuse scheme needs.
Bytes: naive = one buffer per value; planned = arena + output buffers; lower bound = peak of
simultaneously live arena bytes + output buffers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Sequence

from ..compiler import compile_step
from ..loader.config import ModelConfig
from ..passes.pipeline import PIPELINE, SEED_PASSES
from ..plan.arena import MemoryPlan, PlanError


@dataclass(frozen=True)
class StageReport:
    stage: str
    passes: tuple[str, ...]
    ops: int                 # seed counting (embedding lookup excluded)
    nodes: int               # every node
    buffers_naive: int
    buffers_planned: int
    naive_bytes: int
    planned_bytes: int       # arena + outputs
    lower_bound_bytes: int   # peak live arena bytes + outputs
    arena_bytes: int
    arena_lower_bound: int
    output_bytes: int
    scratch_bytes: int
    strategy: str

    @property
    def saved(self) -> float:
        """Fraction of naive activation bytes the plan saves."""
        return 1.0 - self.planned_bytes / self.naive_bytes if self.naive_bytes else 0.0


@dataclass(frozen=True)
class InspectResult:
    arch: str
    n_layers: int
    dim: int
    tokens: int
    context: int
    logit_rows: int
    stages: tuple[StageReport, ...]


def _stage(name: str, passes: Sequence[str], plan: MemoryPlan, graph) -> StageReport:
    return StageReport(
        stage=name, passes=tuple(passes),
        ops=sum(1 for n in graph.nodes if n.op != "embed"), nodes=len(graph.nodes),
        buffers_naive=plan.n_values, buffers_planned=plan.n_buffers, naive_bytes=plan.naive_bytes,
        planned_bytes=plan.total_bytes, lower_bound_bytes=plan.total_lower_bound,
        arena_bytes=plan.arena_bytes, arena_lower_bound=plan.lower_bound,
        output_bytes=sum(plan.outputs.values()), scratch_bytes=plan.scratch_bytes, strategy=plan.strategy)


def compile_stages(config: ModelConfig, *, passes: Sequence[str] | None = None,
                   max_batch_tokens: int = 1, n_ctx: int | None = None, logit_rows: int = 1):
    """(stage name, pass names, graph, plan) for: as built, after the seed's fusions, after
    `passes` (default: the whole pipeline); each stage compiled by compile_step, as the Engine's."""
    if max_batch_tokens < 1:
        raise PlanError(f"--tokens must be at least 1, got {max_batch_tokens}")
    ctx = config.max_position_embeddings if n_ctx is None else n_ctx
    if ctx < max_batch_tokens:
        raise PlanError(f"the context ({ctx}) must be at least the tokens per step "
                        f"({max_batch_tokens}); raise --ctx or lower --tokens")
    if logit_rows < 1:
        raise PlanError(f"logit rows must be at least 1, got {logit_rows}")
    seed = [e.name for e in PIPELINE[:SEED_PASSES]]
    full = [e.name for e in PIPELINE] if passes is None else list(passes)
    out = []
    for name, ps in (("built (seed granularity)", []), ("seed fusions", seed),
                     ("all passes" if passes is None else "selected passes", full)):
        step = compile_step(config, max_batch_tokens=max_batch_tokens, n_ctx=ctx,
                            logit_rows=logit_rows, passes=ps, plan=True)
        out.append((name, ps, step.graph, step.plan))
    return out


def inspect_model(config: ModelConfig, *, passes: Sequence[str] | None = None,
                  max_batch_tokens: int = 1, n_ctx: int | None = None,
                  logit_rows: int = 1) -> InspectResult:
    stages = compile_stages(config, passes=passes, max_batch_tokens=max_batch_tokens, n_ctx=n_ctx,
                            logit_rows=logit_rows)
    return InspectResult(config.arch, config.n_layers, config.dim, max_batch_tokens,
                         stages[0][3].n_ctx, min(logit_rows, max_batch_tokens),
                         tuple(_stage(n, ps, p, g) for n, ps, g, p in stages))


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"


def _pct(new: int, old: int) -> str:
    return f"{100.0 * (new - old) / old:+.1f}%" if old else "n/a"


def inspect_report(config: ModelConfig, *, passes: Sequence[str] | None = None,
                   max_batch_tokens: int = 1, n_ctx: int | None = None, logit_rows: int = 1,
                   as_json: bool = False) -> str:
    """The `ignis inspect` table (or JSON with as_json) for one forward step of `config`."""
    r = inspect_model(config, passes=passes, max_batch_tokens=max_batch_tokens, n_ctx=n_ctx,
                      logit_rows=logit_rows)
    if as_json:
        d = asdict(r)
        for s, sd in zip(r.stages, d["stages"]):
            sd["saved"] = round(s.saved, 6)
        return json.dumps(d, indent=2)
    base = r.stages[0]
    lines = [f"ignis inspect: {r.arch}, {r.n_layers} layers, dim {r.dim}; step of T={r.tokens} "
             f"token(s), context {r.context}, logits for {r.logit_rows} row(s)", ""]
    lines.append(f"{'stage':<26}{'ops':>5}  {'buffers':>11}  {'activations naive -> planned':>32}"
                 f"  {'saved':>7}  {'lower bound':>12}")
    for s in r.stages:
        lines.append(f"{s.stage:<26}{s.ops:>5}  {s.buffers_naive:>4} -> {s.buffers_planned:<3}"
                     f"  {_mb(s.naive_bytes):>14} -> {_mb(s.planned_bytes):<14}  {_pct(s.planned_bytes, s.naive_bytes):>7}"
                     f"  {_mb(s.lower_bound_bytes):>12}")
    lines.append("")
    for s in r.stages:
        gap = "= lower bound" if s.arena_bytes == s.arena_lower_bound else \
            f"lower bound {_mb(s.arena_lower_bound)} ({_pct(s.arena_bytes, s.arena_lower_bound)})"
        lines.append(f"{s.stage}: arena {_mb(s.arena_bytes)} {gap} [{s.strategy}], outputs "
                     f"{_mb(s.output_bytes)}, per-op scratch {_mb(s.scratch_bytes)}")
    last = r.stages[-1]
    lines.append("")
    lines.append(f"ops: {base.ops} -> {r.stages[1].ops} (seed fusions) -> {last.ops} "
                 f"({', '.join(dict.fromkeys(last.passes))})")
    seed = r.stages[1]
    lines.append(f"activations: {_mb(seed.naive_bytes)} -> {_mb(seed.planned_bytes)} "
                 f"({seed.buffers_naive} buffers -> {seed.buffers_planned}), lower bound "
                 f"{_mb(seed.lower_bound_bytes)}, after the seed's fusions")
    lines.append(f"activations: {_mb(last.naive_bytes)} -> {_mb(last.planned_bytes)} "
                 f"({last.buffers_naive} buffers -> {last.buffers_planned}), lower bound "
                 f"{_mb(last.lower_bound_bytes)}, after {last.stage}")
    lines.append("ops exclude the embedding lookup (the seed's counting); buffers planned = most values "
                 "alive at once; planned bytes = arena + output buffers; per-op scratch (attention "
                 "scores over the context) follows the arena; KV cache and weights are not activations")
    return "\n".join(lines) + "\n"


def plot_inspect(config: ModelConfig, path: str, *, passes: Sequence[str] | None = None,
                 max_batch_tokens: int = 1, n_ctx: int | None = None, logit_rows: int = 1) -> str:
    """`ignis inspect --plot FILE`: draw the plan of the fully compiled step."""
    from ..plan.plot import plot_plan
    name, _, _, plan = compile_stages(config, passes=passes, max_batch_tokens=max_batch_tokens,
                                      n_ctx=n_ctx, logit_rows=logit_rows)[-1]
    return str(plot_plan(plan, path, title=f"{config.arch} {config.n_layers} layers, "
                                           f"T={max_batch_tokens}: "
                                           f"arena {plan.arena_bytes} B, lower bound {plan.lower_bound} B"))
