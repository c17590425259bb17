"""Schedule and liveness: first/last use of every value, merged into buffers by in-place reuse.

A buffer is one allocation: a value plus the values that took it over in place. In-place reuse is
allowed only for ops the op table marks so, and only when the parent's sole user is this op
(ggml's rule). Graph inputs, weights, outputs and the KV cache are not planned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..ir.graph import Graph, Node

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class Buffer:
    index: int
    values: tuple[str, ...]      # node names sharing this allocation, in schedule order
    size: int                    # bytes, rounded up to ALIGN
    start: int                   # schedule index of the first definition
    end: int                     # schedule index of the last read (inclusive)

    def overlaps_in_time(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass
class Liveness:
    schedule: list[Node]
    bounds: dict[str, int]
    first: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)     # exact bytes of every node value
    buffers: list[Buffer] = field(default_factory=list)
    buffer_of: dict[str, int] = field(default_factory=dict)  # planned value -> buffer index
    outputs: dict[str, str] = field(default_factory=dict)    # output name -> node name (unplanned)

    def lower_bound(self) -> int:
        """Peak of simultaneously live planned bytes: no placement can use less arena."""
        return peak_bytes(self.buffers, len(self.schedule))

    def peak_live_values(self) -> int:
        """Most node values (planned or output) alive at one instruction: the number of distinct
        buffers a whole-buffer reuse scheme (the seed's) needs, in-place pairs counted once.
        Reached by an actual assignment (whole_buffer_slots), not only counted."""
        return len(set(self.whole_buffer_slots().values()))

    def whole_buffer_slots(self) -> dict[str, int]:
        """Give every planned buffer and every output a slot (a whole buffer) so that no two values
        alive at one instruction share a slot. Greedy in order of first use, reusing the lowest freed
        slot: optimal for intervals, so the slot count equals the peak of live values.
        Keys: 'b<index>' for planned buffers, 'out:<name>' for outputs (alive to the end)."""
        import heapq
        n = len(self.schedule)
        spans = [(b.start, b.end, f"b{b.index}") for b in self.buffers]
        spans += [(self.first[name], n, f"out:{k}") for k, name in self.outputs.items()]
        spans.sort()
        free: list[int] = []                 # freed slot ids (min-heap)
        busy: list[tuple[int, int]] = []     # (end, slot) of values still alive
        slots: dict[str, int] = {}
        next_slot = 0
        for start, end, key in spans:
            while busy and busy[0][0] < start:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                slot = heapq.heappop(free)
            else:
                slot, next_slot = next_slot, next_slot + 1
            slots[key] = slot
            heapq.heappush(busy, (end, slot))
        return slots


def peak_bytes(buffers: list[Buffer], n_steps: int) -> int:
    delta = [0] * (n_steps + 2)
    for b in buffers:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    best = cur = 0
    for d in delta:
        cur += d
        best = max(best, cur)
    return best


def analyze(g: Graph, bounds: Mapping[str, int], *, inplace: bool = True) -> Liveness:
    """Liveness of `g` scheduled in its node order, sizes at `bounds` (e.g. {"T": 1, "R": 1})."""
    sched = list(g.nodes)
    lv = Liveness(sched, dict(bounds))
    index = {id(n): i for i, n in enumerate(sched)}
    out_ids = {id(v): k for k, v in g.outputs.items()}
    for k, v in g.outputs.items():
        if v.kind == "node":
            lv.outputs[k] = v.name
    for i, n in enumerate(sched):
        lv.first[n.name] = i
        lv.last[n.name] = max([index[id(u)] for u in n.out.users], default=i)
        lv.nbytes[n.name] = n.out.type.nbytes(bounds)

    chains: list[list[str]] = []
    chain_of: dict[str, int] = {}
    for n in sched:
        if id(n.out) in out_ids:
            continue
        target = None
        if inplace:
            for j in n.opdef.inplace:
                p = n.inputs[j]
                if (p.kind == "node" and id(p) not in out_ids and len(p.users) == 1
                        and p.users[0] is n and align(lv.nbytes[p.name]) == align(lv.nbytes[n.name])
                        and p.name in chain_of):
                    target = chain_of[p.name]
                    break
        if target is None:
            target = len(chains)
            chains.append([])
        chains[target].append(n.name)
        chain_of[n.name] = target
    for ci, names in enumerate(chains):
        lv.buffers.append(Buffer(ci, tuple(names), align(max(lv.nbytes[x] for x in names)),
                                 lv.first[names[0]], max(lv.last[x] for x in names)))
        for x in names:
            lv.buffer_of[x] = ci
    return lv
