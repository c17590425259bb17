"""Placement of buffers at offsets in one arena: best fit in schedule order (ggml-alloc), greedy by
size (TFLite's planner) and an exact search for small interval sets; the smallest arena wins.

A placement is valid when no two buffers that are live at the same instruction overlap in bytes.
The lower bound is the peak of simultaneously live bytes; the report shows arena against it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from ..errors import IgnisError
from ..ir.graph import Graph
from .liveness import ALIGN, Buffer, Liveness, align, analyze

NO_PLAN_ENV = "IGNIS_NO_PLAN"       # "1": one buffer per value, no reuse (to bisect planner bugs)


class PlanError(IgnisError, ValueError):
    """A plan was asked for with impossible bounds, or a graph and a plan do not belong together."""


@dataclass
class MemoryPlan:
    """Where every planned value lives. Offsets and sizes are keyed by node name."""
    bounds: dict[str, int]
    n_ctx: int
    planned: bool                         # False: the planner was switched off
    strategy: str
    offsets: dict[str, int]
    sizes: dict[str, int]                 # exact bytes at bounds
    arena_bytes: int
    lower_bound: int
    scratch_bytes: int                    # per-op scratch, placed after the activations
    outputs: dict[str, int]               # output name -> bytes (own buffers, not in the arena)
    n_values: int                         # node values: "one buffer per value" count
    naive_bytes: int                      # bytes with one buffer per value (outputs included)
    n_buffers: int                        # distinct buffers needed (peak simultaneously live)
    liveness: Liveness = field(repr=False)

    @property
    def total_bytes(self) -> int:
        """Activation memory actually used: arena plus the output buffers."""
        return self.arena_bytes + sum(self.outputs.values())

    @property
    def total_lower_bound(self) -> int:
        return self.lower_bound + sum(self.outputs.values())


def planner_disabled() -> bool:
    return os.environ.get(NO_PLAN_ENV, "") not in ("", "0")


def best_fit(buffers: list[Buffer]) -> dict[int, int]:
    """Allocate in schedule order; each buffer takes the smallest free block that fits (the last
    block grows when it touches the arena's end); blocks are freed after their last reader."""
    free: list[list[int]] = []            # [offset, size], sorted by offset, coalesced
    top = 0
    out: dict[int, int] = {}
    by_start = sorted(buffers, key=lambda b: (b.start, b.index))
    by_end = sorted(buffers, key=lambda b: (b.end, b.index))
    ei = 0
    for b in by_start:
        while ei < len(by_end) and by_end[ei].end < b.start:
            e = by_end[ei]
            ei += 1
            if e.index in out:
                _release(free, out[e.index], e.size)
        cands = [blk for blk in free if blk[1] >= b.size]
        if cands:
            blk = min(cands, key=lambda x: (x[1], x[0]))
            out[b.index] = blk[0]
            blk[0] += b.size
            blk[1] -= b.size
            if blk[1] == 0:
                free.remove(blk)
        elif free and free[-1][0] + free[-1][1] == top:
            last = free.pop()
            out[b.index] = last[0]
            top = last[0] + b.size
        else:
            out[b.index] = top
            top += b.size
    return out


def _release(free: list[list[int]], off: int, size: int) -> None:
    free.append([off, size])
    free.sort()
    merged: list[list[int]] = []
    for blk in free:
        if merged and merged[-1][0] + merged[-1][1] == blk[0]:
            merged[-1][1] += blk[1]
        else:
            merged.append(blk)
    free[:] = merged


def greedy_by_size(buffers: list[Buffer], order: str = "size") -> dict[int, int]:
    """Place big buffers first; each at the lowest gap between already placed, time-overlapping
    buffers that fits it best (smallest sufficient gap, else above them all)."""
    key = {"size": lambda b: (-b.size, b.start, b.index),
           "lifetime": lambda b: (-(b.end - b.start), -b.size, b.index),
           "area": lambda b: (-b.size * (b.end - b.start + 1), b.index)}[order]
    placed: list[tuple[Buffer, int]] = []
    out: dict[int, int] = {}
    for b in sorted(buffers, key=key):
        busy = sorted((off, off + p.size) for p, off in placed if p.overlaps_in_time(b))
        best, best_gap, prev = None, None, 0
        for lo, hi in busy:
            gap = lo - prev
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best, best_gap = prev, gap
            prev = max(prev, hi)
        out[b.index] = best if best is not None else prev
        placed.append((b, out[b.index]))
    return out


def exact(buffers: list[Buffer], bound: int, start: int | None = None,
          node_limit: int = 20_000) -> tuple[dict[int, int] | None, bool]:
    """(placement smaller than `start`, or None; whether the search completed). A completed search
    is optimal: nothing below what it returns (or below `start`) exists.

    Placing buffers in the order of their offsets in an optimal placement, each at its lowest
    feasible offset, never puts one higher than the optimum does; so trying every order with
    lowest-offset placement (branch and bound on the arena size) finds the optimum.
    """
    n = len(buffers)
    best_size = start if start is not None else sum(b.size for b in buffers) + 1
    best: dict[int, int] | None = None
    placed: list[tuple[Buffer, int]] = []
    used = [False] * n
    budget = [node_limit]

    def lowest(b: Buffer) -> int:
        busy = sorted((off, off + p.size) for p, off in placed if p.overlaps_in_time(b))
        at = 0
        for lo, hi in busy:
            if lo - at >= b.size:
                break
            at = max(at, hi)
        return at

    def dfs(top: int) -> bool:
        nonlocal best_size, best
        if len(placed) == n:
            best_size, best = top, {p.index: off for p, off in placed}
            return top == bound
        for i, b in enumerate(buffers):
            if used[i]:
                continue
            budget[0] -= 1          # one budget unit per placement tried bounds the time
            if budget[0] < 0:
                return True
            off = lowest(b)
            if max(top, off + b.size) >= best_size:
                continue
            used[i] = True
            placed.append((b, off))
            stop = dfs(max(top, off + b.size))
            placed.pop()
            used[i] = False
            if stop:
                return True
        return False

    dfs(0)
    return best, budget[0] >= 0


EXACT_MAX_BUFFERS = 12


def arena_size(buffers: list[Buffer], offsets: Mapping[int, int]) -> int:
    return max((offsets[b.index] + b.size for b in buffers), default=0)


def check_placement(buffers: list[Buffer], offsets: Mapping[int, int]) -> None:
    """AssertionError naming two buffers live at once whose bytes overlap (there must be none)."""
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a.overlaps_in_time(b):
                oa, ob = offsets[a.index], offsets[b.index]
                if oa < ob + b.size and ob < oa + a.size:
                    raise AssertionError(f"buffers {a.values[0]} [{oa},{oa + a.size}) and {b.values[0]} "
                                         f"[{ob},{ob + b.size}) are live together and overlap")
        if offsets[a.index] % ALIGN:
            raise AssertionError(f"buffer {a.values[0]} at offset {offsets[a.index]} is not "
                                 f"{ALIGN}-byte aligned")


def place(buffers: list[Buffer], n_steps: int) -> tuple[dict[int, int], str]:
    """The smallest placement the strategies find; stops early once one reaches the lower bound."""
    from .liveness import peak_bytes
    bound = peak_bytes(buffers, n_steps)
    best: tuple[int, dict[int, int], str] | None = None
    strategies = [("best-fit", lambda: best_fit(buffers)),
                  ("greedy-by-size", lambda: greedy_by_size(buffers, "size")),
                  ("greedy-by-lifetime", lambda: greedy_by_size(buffers, "lifetime")),
                  ("greedy-by-area", lambda: greedy_by_size(buffers, "area"))]
    for name, fn in strategies:
        offs = fn()
        size = arena_size(buffers, offs)
        if best is None or size < best[0]:
            best = (size, offs, name)
        if size == bound:
            break
    if best is not None and best[0] > bound and len(buffers) <= EXACT_MAX_BUFFERS:
        offs, complete = exact(buffers, bound, start=best[0])
        if offs is not None:
            best = (arena_size(buffers, offs), offs, "exact search" if complete else "bounded search")
    return (best[1], best[2]) if best else ({}, "empty")


def plan_memory(g: Graph, bounds: Mapping[str, int], *, n_ctx: int,
                enabled: bool | None = None) -> MemoryPlan:
    """Plan `g`'s activations for sizes at `bounds` ({"T": tokens, "R": logit rows}) and a KV
    context of `n_ctx`. enabled=None reads IGNIS_NO_PLAN; False gives one buffer per value."""
    if enabled is None:
        enabled = not planner_disabled()
    missing = sorted({d for n in g.nodes for d in n.out.type.shape if isinstance(d, str)} - set(bounds))
    if missing:
        raise PlanError(f"plan bounds must give a size for {missing}; got {dict(bounds)}")
    bad = {k: v for k, v in bounds.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
    if bad or n_ctx < 1:
        raise PlanError(f"plan bounds and n_ctx must be positive integers; got {dict(bounds)}, "
                        f"n_ctx={n_ctx!r}")
    lv = analyze(g, bounds, inplace=enabled)
    n = len(lv.schedule)
    if enabled:
        boffs, strategy = place(lv.buffers, n)
    else:
        boffs, top, strategy = {}, 0, "one buffer per value"
        for b in lv.buffers:
            boffs[b.index] = top
            top += b.size
    arena = arena_size(lv.buffers, boffs)
    offsets = {name: boffs[b.index] for b in lv.buffers for name in b.values}
    sizes = {name: lv.nbytes[name] for name in offsets}
    scratch = 0
    for node in g.nodes:
        rule = node.opdef.scratch
        if rule is not None:
            scratch = max(scratch, rule([v.type for v in node.inputs], node.attrs, bounds, n_ctx))
    outputs = {k: lv.nbytes[name] for k, name in lv.outputs.items()}
    return MemoryPlan(
        bounds=dict(bounds), n_ctx=n_ctx, planned=enabled, strategy=strategy, offsets=offsets,
        sizes=sizes, arena_bytes=arena, lower_bound=lv.lower_bound(), scratch_bytes=align(scratch),
        outputs=outputs, n_values=len(g.nodes), naive_bytes=sum(align(x) for x in lv.nbytes.values()),
        n_buffers=lv.peak_live_values() if enabled else len(g.nodes), liveness=lv)
