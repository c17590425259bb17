"""Memory planning: liveness, arena placement against the lower bound, lowering to a tape."""
from .arena import NO_PLAN_ENV, MemoryPlan, PlanError, plan_memory
from .liveness import Buffer, Liveness, analyze
from .tape import Instr, Operand, Space, Tape, lower

__all__ = ["NO_PLAN_ENV", "MemoryPlan", "PlanError", "plan_memory", "Buffer",
           "Liveness", "analyze", "Instr", "Operand", "Space", "Tape", "lower"]
