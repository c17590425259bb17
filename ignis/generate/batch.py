"""Continuous batching: the forward calls of several generations, one per KV slot, merged into
shared engine steps, so one pass over the weights advances every active sequence.

Each generation runs on its own thread exactly as it would alone (the loop in loop.py, driving a
KVSession); its session's engine is a `BatchedSlot`, whose forward() hands the tokens to the
scheduler thread and waits for the logits. The scheduler gathers what the active slots hand in,
packs one step (decodes first, then prefill chunks in the room left, up to max_batch_tokens rows)
and runs it. A long prompt is prefilled a chunk per step beside the others' decodes, so it never
stalls them for its whole length. A row's logits do not depend on its neighbours in a step, so
a batched generation equals the same generation run alone, token for token.

    sched = BatchScheduler(Engine(model, n_seq=4))
    sessions = [KVSession(sched.slot(i)) for i in range(4)]
    sched.activate(0); ...; sched.deactivate(0)     # around each generation on slot 0
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

DEFAULT_WINDOW = 0.02     # seconds a step waits for slots still sampling their next token


@dataclass(eq=False)
class _Request:
    seq: int
    ids: np.ndarray
    arrived: float
    done: int = 0                      # ids already run (a prefill spans several steps)
    all_rows: bool = False             # every row's logits (a speculative step), not the last's
    parts: list = field(default_factory=list)   # all_rows: the logits of each step's share
    logits: np.ndarray | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)


@dataclass
class BatchStats:
    steps: int = 0             # engine steps run
    rows: int = 0              # token rows run, over all steps
    sequences: int = 0         # (step, slot) pairs: rows of one slot in one step count once

    @property
    def mean_batch(self) -> float:
        """Slots served per step, on average."""
        return self.sequences / self.steps if self.steps else 0.0


class BatchScheduler:
    """Runs every forward of an Engine's KV slots on one thread, batching the slots that are
    active (inside a generation). A step starts once each active slot has handed in its tokens,
    or `window` seconds after the first did or the last step ended, whichever is later (a slot
    whose reader is slow holds up the rest for no longer than that)."""

    def __init__(self, engine: Any, *, window: float = DEFAULT_WINDOW):
        self.engine = engine
        self.window = window
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._pending: dict[int, _Request] = {}
        self._active: set[int] = set()
        self._closed = False
        self._last_step = 0.0
        self._thread = threading.Thread(target=self._loop, name="ignis-batch", daemon=True)
        self._thread.start()

    # ---- what generations call ------------------------------------------------------------
    def slot(self, seq: int) -> "BatchedSlot":
        self.engine.slot(seq)          # checks the slot exists
        return BatchedSlot(self, seq)

    def activate(self, seq: int) -> None:
        """Slot `seq` is generating: steps wait (up to the window) for its tokens."""
        with self._cond:
            self._active.add(seq)

    def deactivate(self, seq: int) -> None:
        with self._cond:
            self._active.discard(seq)
            self._cond.notify_all()

    def forward(self, seq: int, tokens: Sequence[int], *, all_rows: bool = False) -> np.ndarray:
        """Run tokens on slot `seq` in the next steps; the last token's logits ([1, vocab]), or
        with all_rows every token's ([len(tokens), vocab])."""
        ids = self.engine.check_tokens(tokens, seq)     # typed errors here, not in a shared step
        req = _Request(seq, ids, time.perf_counter(), all_rows=all_rows)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            if seq in self._pending:
                raise RuntimeError(f"KV slot {seq} already has a forward in flight")
            self._pending[seq] = req
            self._cond.notify_all()
        req.finished.wait()
        if req.error is not None:
            raise req.error
        assert req.logits is not None
        return req.logits

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # ---- the scheduler thread -------------------------------------------------------------
    def _ready(self) -> bool:
        return self._active.issubset(self._pending.keys())

    def _pack(self) -> list[tuple[_Request, int]]:
        """This step's rows: every pending request, fewest remaining tokens first (decodes, then
        prefills by what they still need), each taking as many rows as the room allows."""
        room = self.engine.options.max_batch_tokens
        parts = []
        for req in sorted(self._pending.values(), key=lambda r: (r.ids.size - r.done, r.arrived)):
            if room == 0:
                break
            n = min(req.ids.size - req.done, room)
            parts.append((req, n))
            room -= n
        return parts

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for req in self._pending.values():
                        req.error = RuntimeError("the batch scheduler was closed")
                        req.finished.set()
                    return
                first = min(r.arrived for r in self._pending.values())
                deadline = max(first, self._last_step) + self.window
                while not self._ready() and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                parts = self._pack()
            self._run(parts)
            self._last_step = time.perf_counter()

    def _run(self, parts: list[tuple[_Request, int]]) -> None:
        try:
            logits = self.engine.forward_batch(
                [(r.seq, r.ids[r.done:r.done + n]) for r, n in parts],
                all_rows=[r.all_rows for r, _ in parts])
        except BaseException as e:            # noqa: BLE001 - handed to the waiting threads
            if len(parts) > 1:                # find whose rows failed; the others go on
                for p in parts:
                    self._run([p])
                return
            req = parts[0][0]
            req.error = e
            self._finish(req)
            return
        self.stats.steps += 1
        self.stats.sequences += len(parts)
        self.stats.rows += sum(n for _, n in parts)
        for (req, n), lg in zip(parts, logits):
            req.done += n
            if req.all_rows:
                req.parts.append(lg)
            if req.done == req.ids.size:
                req.logits = np.concatenate(req.parts) if req.all_rows else lg
                self._finish(req)

    def _finish(self, req: _Request) -> None:
        with self._cond:
            del self._pending[req.seq]
        req.finished.set()


class BatchedSlot:
    """A KV slot whose forward() goes through the scheduler (the EngineLike the loop drives)."""

    def __init__(self, scheduler: BatchScheduler, seq: int):
        self.scheduler = scheduler
        self.seq = seq

    @property
    def n_past(self) -> int:
        return self.scheduler.engine.seq_n_past(self.seq)

    @property
    def n_ctx(self) -> int:
        return self.scheduler.engine.n_ctx

    @property
    def max_batch_tokens(self) -> int:
        return self.scheduler.engine.options.max_batch_tokens

    def forward(self, tokens: Sequence[int], *, logits_for: str = "last") -> np.ndarray:
        if logits_for not in ("last", "all"):
            raise ValueError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        return self.scheduler.forward(self.seq, tokens, all_rows=logits_for == "all")

    def truncate(self, n: int) -> None:
        self.scheduler.engine.truncate(n, self.seq)

    def reset(self) -> None:
        self.scheduler.engine.reset(self.seq)
