"""The sampler: logits of one position -> the next token id, and the logprobs OpenAI reports.

Order of operations (Hugging Face's logits processors, then warpers): repetition penalty,
presence/frequency penalties, logit_bias, the constraint's mask (ids that would leave the
request's grammar get -inf: constrain.py), then temperature, top_k, top_p, min_p, and one draw
from the request's own numpy Generator. Logprobs are the log-softmax of the raw logits (before any
penalty, bias or temperature), with ids that have no token masked out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .params import SamplingParams

if TYPE_CHECKING:
    from .constrain import TokenConstraint


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's logprob and, when asked for, the most likely alternatives (best first).
    text_offset: where the token's text starts in the generated text (set by the generation loop;
    a token that finishes a character begun by the one before starts where that character does)."""
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()
    text_offset: int | None = None


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted)))


def _softmax(x: np.ndarray) -> np.ndarray:
    # a logit pushed to +inf (a repetition penalty near 0 divides by it) is the largest float, so
    # the tokens that reach it share the mass instead of making every probability NaN
    top = np.max(x)
    if top == np.inf:
        x = np.minimum(x, np.finfo(np.float64).max)
        top = np.max(x)
    e = np.exp(x - top)
    return e / e.sum()


_NUCLEUS_GUESS = 1024


def _descending(probs: np.ndarray, mass: float) -> np.ndarray:
    """Ids by decreasing probability (ties by id), at least far enough to cover `mass`. Sorting the
    whole vocabulary costs ~20 ms at 150k ids; the nucleus almost always lies in the top 1024."""
    if probs.size > _NUCLEUS_GUESS:
        top = np.argpartition(-probs, _NUCLEUS_GUESS)[:_NUCLEUS_GUESS]
        if probs[top].sum() >= mass:
            return top[np.lexsort((top, -probs[top]))]
    return np.argsort(-probs, kind="stable")


class Sampler:
    """One request's sampler: holds the token counts the penalties need and the seeded Generator."""

    def __init__(self, params: SamplingParams, vocab_size: int, *, valid: np.ndarray | None = None,
                 prompt_ids: list[int] | None = None, constraint: "TokenConstraint | None" = None):
        self.params = params
        self.constraint = constraint
        self.vocab_size = vocab_size
        # ids with no token (padding rows of the lm_head) must never be drawn or reported
        self._hole = None if valid is None or valid.all() else np.where(valid, 0.0, -np.inf)
        seed = params.seed
        self._seed = None if seed is None else seed % (1 << 64)
        self._rng: np.random.Generator | None = None        # made on the first draw (rng)
        self._counts = np.zeros(vocab_size, np.int64)       # output tokens only (OpenAI penalties)
        self._seen = np.zeros(vocab_size, bool)             # prompt + output (repetition penalty)
        if prompt_ids:
            self._seen[np.asarray(prompt_ids, np.int64)] = True
        self._bias_ids = np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias))
        self._bias = np.fromiter(params.logit_bias.values(), np.float64, len(params.logit_bias))

    @property
    def rng(self) -> np.random.Generator:
        """The request's Generator, seeded from params.seed (fresh entropy without one). Made on
        first use: a greedy request never draws, and never imports numpy.random."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    def accept(self, token_id: int) -> None:
        """Record a generated token (for the penalties)."""
        self._counts[token_id] += 1
        self._seen[token_id] = True
        if self.constraint is not None:
            self.constraint.accept(token_id)

    def process(self, logits: np.ndarray) -> np.ndarray:
        """Penalised, biased, masked logits in float64 (before temperature and the truncation
        filters)."""
        p = self.params
        x = np.asarray(logits, np.float64).reshape(-1)
        if x.size != self.vocab_size:
            raise ValueError(f"logits have {x.size} entries, the vocabulary {self.vocab_size}")
        x = x.copy() if self._hole is None else x + self._hole
        if p.repetition_penalty != 1.0 and self._seen.any():
            s = x[self._seen]
            with np.errstate(over="ignore"):     # a penalty near 0 may reach +inf: see _softmax
                x[self._seen] = np.where(s > 0, s / p.repetition_penalty, s * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            x -= self._counts * p.frequency_penalty + (self._counts > 0) * p.presence_penalty
        if self._bias_ids.size:
            x[self._bias_ids] += self._bias
        if self.constraint is not None:
            self.constraint.mask(x)
        return x

    def process_ahead(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        """process() as it will be once the tokens `ahead` are accepted (penalties and bias; not
        the constraint's mask, which cannot look ahead): what a draft model's guess is chosen by,
        so that it guesses the token the target's own processing would choose."""
        p = self.params
        x = np.asarray(logits, np.float64).reshape(-1)
        n = min(x.size, self.vocab_size)
        x = x[:n].copy() if self._hole is None else x[:n] + self._hole[:n]
        counts = self._counts[:n]
        seen = self._seen[:n]
        if len(ahead):
            a = np.asarray(ahead, np.int64)
            a = a[a < n]
            counts = counts.copy()
            np.add.at(counts, a, 1)
            seen = seen.copy()
            seen[a] = True
        if p.repetition_penalty != 1.0 and seen.any():
            s = x[seen]
            with np.errstate(over="ignore"):
                x[seen] = np.where(s > 0, s / p.repetition_penalty, s * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            x -= counts * p.frequency_penalty + (counts > 0) * p.presence_penalty
        if self._bias_ids.size:
            keep = self._bias_ids < n
            x[self._bias_ids[keep]] += self._bias[keep]
        return x

    def candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending, their probabilities) a non-greedy draw chooses from, given processed
        logits; every other id has probability 0."""
        p = self.params
        n = x.size
        if 0 < p.top_k < n:
            kth = np.partition(x, n - p.top_k)[n - p.top_k]
            keep = np.flatnonzero(x >= kth)       # ties with the k-th are kept, as in HF
        else:
            keep = np.flatnonzero(x > -np.inf)
        # the filters below only ever shrink the candidate set: work on it, not on the vocabulary
        return keep, self._filter(x[keep] / p.temperature)

    def distribution(self, x: np.ndarray) -> np.ndarray:
        """The probabilities over the whole vocabulary a non-greedy draw uses."""
        keep, sub = self.candidates(x)
        probs = np.zeros(x.size, np.float64)
        probs[keep] = sub
        return probs

    def _filter(self, x: np.ndarray) -> np.ndarray:
        p = self.params
        probs = _softmax(x)
        if p.top_p < 1.0:
            order = _descending(probs, p.top_p)
            before = np.cumsum(probs[order]) - probs[order]
            x = x.copy()
            drop = np.ones(x.size, bool)
            drop[order[before < p.top_p]] = False    # the smallest set reaching top_p is kept
            x[drop] = -np.inf
            probs = _softmax(x)
        if p.min_p > 0.0:
            x = np.where(probs < p.min_p * probs.max(), -np.inf, x)
            probs = _softmax(x)
        return probs

    def sample(self, logits: np.ndarray) -> tuple[int, TokenLogprob | None]:
        """Choose the next token; returns (id, logprob info if params.logprobs else None)."""
        x = self.process(logits)
        if self.params.greedy:
            token = int(np.argmax(x))
        else:
            keep, probs = self.candidates(x)
            cdf = np.cumsum(probs)                   # in id order: the draw depends on the seed only
            i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
            token = int(keep[min(i, int(np.flatnonzero(probs)[-1]))])   # guard the edge at cdf[-1]
        info = self._logprobs(logits, token) if self.params.logprobs else None
        self.accept(token)
        return token, info

    def logprob_info(self, logits: np.ndarray, token: int) -> TokenLogprob:
        """What logprobs report for `token` drawn from `logits` (the raw row)."""
        return self._logprobs(logits, token)

    def _logprobs(self, logits: np.ndarray, token: int) -> TokenLogprob:
        x = np.asarray(logits, np.float64).reshape(-1)
        if self._hole is not None:
            x = x + self._hole
        lp = log_softmax(x)
        top: tuple[TopLogprob, ...] = ()
        k = self.params.top_logprobs
        if k:
            cand = np.argpartition(-lp, k - 1)[:k] if k < lp.size else np.arange(lp.size)
            cand = cand[np.lexsort((cand, -lp[cand]))]    # best first, ties by id
            top = tuple(TopLogprob(int(i), float(lp[i])) for i in cand)
        return TokenLogprob(token, float(lp[token]), top)
