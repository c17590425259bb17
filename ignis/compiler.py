"""The compile driver: one call from a ModelConfig to what the runtime executes (graph, memory plan
and tape). The Engine compiles its step here and `ignis inspect` reports on the same function."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .ir.graph import Graph
from .loader.config import ModelConfig
from .models import build_graph
from .passes.pipeline import PIPELINE, run_pipeline, select_passes
from .plan.arena import MemoryPlan, PlanError, plan_memory
from .plan.tape import Tape, lower


@dataclass
class CompiledStep:
    graph: Graph                       # after the passes
    plan: MemoryPlan
    tape: Tape
    stages: list[tuple[str, int]]      # (pass, node count after it)


def compile_step(config: ModelConfig, *, max_batch_tokens: int, n_ctx: int, logit_rows: int = 1,
                 passes: Sequence[str] | None = None, plan: bool | None = None,
                 output: str = "logits") -> CompiledStep:
    """Build, optimise, plan and lower one forward step for up to `max_batch_tokens` tokens per
    call, a KV context of `n_ctx` and logits for up to `logit_rows` rows. passes: pass names in
    order (default: the whole pipeline). output="hidden" compiles the embedding step instead:
    final-norm hidden states for every token, no lm_head. plan=None follows IGNIS_NO_PLAN; False
    gives one buffer per value."""
    if max_batch_tokens < 1 or n_ctx < max_batch_tokens or logit_rows < 1:
        raise PlanError(f"need 1 <= max_batch_tokens <= n_ctx and logit_rows >= 1; got "
                        f"max_batch_tokens={max_batch_tokens}, n_ctx={n_ctx}, logit_rows={logit_rows}")
    entries = list(PIPELINE) if passes is None else select_passes(passes)
    res = run_pipeline(build_graph(config, output), entries)
    mp = plan_memory(res.graph, {"T": max_batch_tokens, "R": min(logit_rows, max_batch_tokens)},
                     n_ctx=n_ctx, enabled=plan)
    return CompiledStep(res.graph, mp, lower(res.graph, mp), res.stages)
