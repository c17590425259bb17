"""Speculative decoding: a drafter guesses the next tokens, the model checks them in one step.

The generation loop runs [last token, d1..dk] through the engine in one forward that keeps every
row's logits (a short prefill), then samples row by row exactly as plain decoding would: greedy
keeps d(i+1) while it is the argmax, sampling keeps it with probability p(d(i+1)) (the standard
accept/reject rule for a drafter whose guess is a point mass q, which both drafters here are:
prompt lookup copies, the draft model guesses greedily) and otherwise draws from p with d(i+1)
removed, renormalised. Either way each token has the target distribution, and the first rejected
row still yields a token. The KV rows of the rejected guesses are dropped (the slot's length set
back), so later steps overwrite them.

Drafters:
  prompt-lookup   the longest recent n-gram (3..4 tokens) ending the prompt + output so far is
                  found earlier in it, and what followed is the guess (no second model)
  draft:<model>   a smaller model with the same vocabulary guesses greedily; its own KV cache
                  follows the text (its rejected rows are dropped the same way)

DraftLength tunes k from the acceptance rate and the measured cost of a step of T rows, and stops
drafting when the expected tokens per second fall below plain decoding's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from .errors import InvalidParameterError

PROMPT_LOOKUP = "prompt-lookup"
AUTO = "auto"                 # prompt lookup for greedy requests, none for sampled ones
DRAFT_PREFIX = "draft:"
OFF = ("off", "none")
MAX_DRAFT = 8                 # tokens guessed per step at most
# n-gram lengths tried, longest first: shorter ones recur by chance in prose and guess wrongly
# (bench_speculative: 2-grams cost free-form text ~9% of its speed)
LOOKUP_NGRAMS = (4, 3)
# prior cost of a step of T rows over one of 1 row before any is measured (the 0.5B model's
# GEMM path: T=5 about 1.6x, T=9 about 2.7x; benchmarks/RESULTS.md)
PRIOR_ROW_COST = 0.2


class SpeculativeError(InvalidParameterError):
    """A speculative decoding request that cannot be served: an unknown drafter, a draft model
    whose vocabulary differs from the target's, or options speculation does not combine with."""

    def __init__(self, message: str, *, code: str = "invalid_value"):
        super().__init__(message, param="speculative", code=code)


@dataclass(frozen=True)
class SpeculativeSpec:
    kind: str                    # "prompt-lookup" or "draft"
    model: str | None = None     # the draft model's name (kind "draft")

    @property
    def name(self) -> str:
        return self.kind if self.kind != "draft" else f"{DRAFT_PREFIX}{self.model}"


def parse_speculative(value: Any) -> SpeculativeSpec | None:
    """"prompt-lookup", "draft:<model>", "auto" (prompt lookup when the request is greedy: where
    it was measured to win, benchmarks/RESULTS.md), or None / "off" / "none" (no speculation)
    -> a spec; SpeculativeError for anything else."""
    if value is None or value is False:
        return None
    if not isinstance(value, str):
        raise SpeculativeError(f"speculative must be a string ('{PROMPT_LOOKUP}', "
                               f"'{DRAFT_PREFIX}<model>') or null, got {type(value).__name__}",
                               code="invalid_type")
    v = value.strip()
    if v.lower() in OFF:
        return None
    if v in (PROMPT_LOOKUP, AUTO):
        return SpeculativeSpec(v)
    if v.startswith(DRAFT_PREFIX):
        name = v[len(DRAFT_PREFIX):].strip()
        if not name:
            raise SpeculativeError("speculative='draft:' names no draft model; write "
                                   "'draft:<model name or path>'")
        return SpeculativeSpec("draft", name)
    raise SpeculativeError(f"unknown speculative drafter {value!r:.80}; use '{PROMPT_LOOKUP}', "
                           f"'{DRAFT_PREFIX}<model>', '{AUTO}' or 'off'")


def check_combinable(spec: SpeculativeSpec | None, *, n: int = 1, logprobs: bool = False) -> None:
    """SpeculativeError for options speculation is not offered with: n > 1 choices (each choice
    would need its own drafter and draft slot; run them without speculation)."""
    if spec is None or spec.kind == AUTO:      # auto steps aside for what it cannot serve
        return
    if n > 1:
        raise SpeculativeError(f"speculative={spec.name!r} serves one choice per request; n={n} "
                               f"asks for several (send n=1, or speculative='off')",
                               code="unsupported_parameter")


@dataclass
class SpeculativeStats:
    """What speculation did in one generation (or, summed, over a model's life)."""
    drafter: str = ""
    steps: int = 0             # forward steps of the generation (plain and verifying)
    verify_steps: int = 0      # steps that checked at least one guessed token
    drafted: int = 0           # guessed tokens checked
    accepted: int = 0          # guessed tokens kept
    tokens: int = 0            # tokens the steps produced (accepted guesses + one per step)
    seconds: float = 0.0       # in forward steps
    plain_seconds_per_token: float = 0.0   # measured cost of a plain (one-row) step
    requested: bool = True     # asked for (load or request), not only the "auto" default: the
                               # OpenAI usage reports only asked-for speculation

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def speedup(self) -> float:
        """Estimated tokens per second over plain decoding's: the steps' time against what the
        same tokens would have taken one row each (the measured one-row step)."""
        if not self.seconds or not self.plain_seconds_per_token:
            return 1.0
        return self.tokens * self.plain_seconds_per_token / self.seconds

    def add(self, other: "SpeculativeStats") -> None:
        self.steps += other.steps
        self.verify_steps += other.verify_steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.tokens += other.tokens
        self.seconds += other.seconds
        if other.plain_seconds_per_token:
            self.plain_seconds_per_token = other.plain_seconds_per_token
        self.drafter = other.drafter or self.drafter

    def as_dict(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "drafted_tokens": self.drafted,
                "accepted_tokens": self.accepted,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "verify_steps": self.verify_steps, "steps": self.steps,
                "speedup": round(self.speedup, 3)}


class Drafter(Protocol):
    name: str
    max_draft: int

    def start(self, prompt: Sequence[int]) -> None: ...
    def draft(self, history: Sequence[int], k: int, sampler: Any = None) -> list[int]: ...


class PromptLookup:
    """Guesses by copying: the longest n-gram (LOOKUP_NGRAMS) that ends the text is looked up in
    the text before it, the most recent occurrence first, and the tokens that followed it are the
    guess. Costs microseconds; guesses nothing (a plain step) when no n-gram recurs."""
    name = PROMPT_LOOKUP
    max_draft = MAX_DRAFT

    def __init__(self, requested: bool = True):
        self.requested = requested          # False: chosen by "auto", not asked for

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, history: Sequence[int], k: int, sampler: Any = None) -> list[int]:
        if k <= 0:
            return []
        h = np.asarray(history, np.int64)
        L = h.size
        for n in LOOKUP_NGRAMS:
            if L <= n:
                continue
            tail = h[L - n:]
            # starts i < L - n of an earlier occurrence of tail, so at least one token follows it
            cand = np.flatnonzero(h[:L - n] == tail[0])
            for i in cand[::-1]:
                if i + n < L and np.array_equal(h[i:i + n], tail):
                    return [int(t) for t in h[i + n:i + n + k]]
        return []


class DraftModel:
    """Guesses with a smaller model of the same vocabulary, greedily. `session` is a KVSession on
    the draft engine's slot that belongs to the target's slot; its prefill reuses the prefix it
    holds, so after a step only the tokens the draft did not guess itself (the corrected one, or
    the bonus) are run, and rejected guesses are dropped by that prefix match (truncate)."""
    max_draft = 4

    def __init__(self, name: str, session: Any, lock: threading.Lock, valid: np.ndarray | None):
        self.name = f"{DRAFT_PREFIX}{name}"
        self.session = session
        self.lock = lock
        self._hole = None if valid is None or valid.all() else np.where(valid, 0.0, -np.inf)

    def _argmax(self, logits: np.ndarray, sampler: Any, ahead: list[int]) -> int:
        if sampler is not None:     # the target's penalties and bias, as they will stand
            return int(np.argmax(sampler.process_ahead(logits, ahead)))
        x = np.asarray(logits, np.float64).reshape(-1)
        return int(np.argmax(x if self._hole is None else x + self._hole[:x.size]))

    def start(self, prompt: Sequence[int]) -> None:
        """Prefill the draft's slot with the prompt (with the target's, before decoding: the
        draft steps' measured cost is then their own)."""
        with self.lock:
            self.session.prefill(list(prompt))

    def draft(self, history: Sequence[int], k: int, sampler: Any = None) -> list[int]:
        """k guesses after history, each the argmax of the draft's logits processed as the
        target's sampler will process its own (repetition and OpenAI penalties, logit_bias)."""
        if k <= 0:
            return []
        n_ctx = self.session.engine.n_ctx
        k = min(k, n_ctx - len(history))
        if k <= 0:
            return []
        out: list[int] = []
        with self.lock:             # the draft engine is shared by the target's slots
            logits = self.session.prefill(list(history))
            while True:
                out.append(self._argmax(logits[-1], sampler, out))
                if len(out) == k:
                    return out
                logits = self.session.step(out[-1])


class DraftLength:
    """How many tokens to guess next: the k maximising expected tokens per second, from the
    acceptance rate (a geometric model: each guess kept with probability a while the ones before
    it were) and the measured seconds of a step of T rows; 0 (plain decoding) when no k beats one
    row. After a stretch at 0 it tries again (cooldown doubles up to 256 tokens), so a text that
    starts repeating itself is noticed."""

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self.kept = 1.0          # decayed counts of kept guesses and of rejections (a prior of 1/2)
        self.rejected = 1.0
        self.cost: dict[int, float] = {}     # rows -> seconds of a step (moving average)
        self.cooldown = 16
        self.pause = 0

    @property
    def rate(self) -> float:
        return self.kept / (self.kept + self.rejected)

    def step_cost(self, rows: int) -> float:
        if rows in self.cost:
            return self.cost[rows]
        one = self.cost.get(1, 1.0)
        guess = one * (1.0 + PRIOR_ROW_COST * (rows - 1))
        below = [c for t, c in self.cost.items() if t < rows]
        return max([guess, *below])

    def observe_step(self, rows: int, seconds: float) -> None:
        old = self.cost.get(rows)
        self.cost[rows] = seconds if old is None else 0.7 * old + 0.3 * seconds

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.kept = 0.9 * self.kept + accepted
        self.rejected = 0.9 * self.rejected + (accepted < drafted)

    def next(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0 if self.pause else 1        # the step after the pause probes with 1 guess
        a = min(self.rate, 0.999)
        base = 1.0 / self.step_cost(1)
        best_k, best = 0, base
        for k in range(1, self.max_draft + 1):
            expected = (1.0 - a ** (k + 1)) / (1.0 - a)     # tokens a step of k guesses yields
            speed = expected / self.step_cost(k + 1)
            if speed > best * 1.02:
                best_k, best = k, speed
        if best_k == 0:
            self.pause = self.cooldown
            self.cooldown = min(self.cooldown * 2, 256)
        else:
            self.cooldown = 16
        return best_k


def accept_draft(sampler: Any, logits: np.ndarray, guess: int | None) -> tuple[int, Any]:
    """The next token from one verified row: what the sampler would draw, given that the drafter
    guessed `guess` (a point mass). Greedy: the argmax (the guess is kept when it is the argmax).
    Sampled: keep the guess with probability p(guess), else draw from p without it, renormalised;
    the token is then distributed exactly as p. Records the token in the sampler (penalties);
    returns (token, its logprob info when the request asks for logprobs)."""
    if guess is None:
        return sampler.sample(logits)
    x = sampler.process(logits)
    if sampler.params.greedy:
        token = int(np.argmax(x))
    else:
        keep, probs = sampler.candidates(x)
        at = np.searchsorted(keep, guess)
        p_guess = float(probs[at]) if at < keep.size and keep[at] == guess else 0.0
        if sampler.rng.random() < p_guess:
            token = guess
        else:
            rest = probs.copy()
            if p_guess > 0.0:
                rest[at] = 0.0
            cdf = np.cumsum(rest)
            if cdf[-1] <= 0.0:          # p was the guess alone (p_guess 1 makes this unreachable)
                token = guess
            else:
                i = int(np.searchsorted(cdf, sampler.rng.random() * cdf[-1], side="right"))
                token = int(keep[min(i, int(np.flatnonzero(rest)[-1]))])
    info = sampler.logprob_info(logits, token) if sampler.params.logprobs else None
    sampler.accept(token)
    return token, info


__all__ = ["DraftLength", "DraftModel", "Drafter", "MAX_DRAFT", "PROMPT_LOOKUP", "PromptLookup",
           "SpeculativeError", "SpeculativeSpec", "SpeculativeStats", "accept_draft",
           "check_combinable", "parse_speculative"]
