"""The generation loop: prefill (reusing the cached prefix), sample, detokenize, stop, stream.

Text leaves the loop only when it is final: whole grapheme clusters, and never a tail that could
still become a stop string. The pieces a stream yields concatenate to the non-streamed text.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from ..tokenizer.stream import StreamDecoder
from .errors import ContextLengthExceeded, GenerationCancelled, InvalidParameterError
from .markers import partial_suffix
from .params import SamplingParams
from .sampler import Sampler, TokenLogprob
from .speculative import MAX_DRAFT, DraftLength, Drafter, SpeculativeStats, accept_draft

if TYPE_CHECKING:
    from .constrain import TokenConstraint

_CANCEL: ContextVar[threading.Event | None] = ContextVar("ignis_cancel", default=None)


@contextmanager
def cancel_when(event: threading.Event):
    """Generations iterated inside this block (on this thread) stop with GenerationCancelled
    before their next forward step once `event` is set: a server stops the work of a client that
    has hung up after at most one more token, whether or not that token produced text."""
    token = _CANCEL.set(event)
    try:
        yield
    finally:
        _CANCEL.reset(token)


def current_cancel() -> threading.Event | None:
    """The event cancel_when set for this thread (None outside it): work handed to other threads
    (the choices of an n > 1 request) watches it too."""
    return _CANCEL.get()


def _check_cancel(event: threading.Event | None) -> None:
    if event is not None and event.is_set():
        raise GenerationCancelled("the generation was cancelled (its client is gone)")


def raise_if_cancelled() -> None:
    """Inside cancel_when(event), GenerationCancelled once the event is set: for work other than a
    Generation (embeddings) to stop between its steps."""
    _check_cancel(_CANCEL.get())


class EngineLike(Protocol):
    """What the loop needs from ignis.runtime.Engine (tests script a fake with the same API)."""
    n_past: int
    n_ctx: int

    def forward(self, tokens: np.ndarray, *, logits_for: str = "last") -> np.ndarray: ...
    def truncate(self, n: int) -> None: ...
    def reset(self) -> None: ...


class TokenizerLike(Protocol):
    special_ids: set[int] | frozenset[int]
    vocab_size: int

    def token_bytes(self, token_id: int) -> bytes: ...
    def has_token(self, token_id: int) -> bool: ...


class KVSession:
    """An engine plus the ids its KV cache holds, so a request shares the longest common prefix
    with the previous one and forwards only the rest (a second chat turn recomputes nothing)."""

    def __init__(self, engine: EngineLike):
        self.engine = engine
        self.cached: list[int] = []
        self.last_reused = 0          # prompt tokens the last prefill took from the cache
        self.forwarded = 0            # tokens run through the engine, over the session's life
        # set when the current request's prompt prefix was put here for it (n > 1 choices share
        # one prefill): the prefix the slot held before, what the next prefill reports as reused
        self.held_before: int | None = None
        self.draft: "KVSession | None" = None    # the draft model's slot paired with this one
        # per drafter: the draft length's state (acceptance, measured step costs), kept across
        # this slot's requests so a new request starts from what the last ones learned
        self.draft_lengths: dict[str, DraftLength] = {}

    def reset(self) -> None:
        self.engine.reset()
        self.cached = []
        self.held_before = None

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Logits after the prompt `ids`; only the part past the shared cached prefix is run."""
        if self.engine.n_past != len(self.cached):    # the engine was used behind our back
            self.reset()
        common = 0
        limit = min(len(self.cached), len(ids) - 1)   # at least one token must run to get logits
        while common < limit and self.cached[common] == ids[common]:
            common += 1
        self.engine.truncate(common)
        common = self.engine.n_past       # less when the engine cannot step back that far (a ring)
        del self.cached[common:]
        rest = list(ids[common:])
        try:
            logits = self.engine.forward(np.asarray(rest, np.int32))
        except BaseException:
            self.reset()
            raise
        self.cached.extend(rest)
        self.forwarded += len(rest)
        self.last_reused = common if self.held_before is None else min(common, self.held_before)
        self.held_before = None
        return logits

    def step(self, token_id: int) -> np.ndarray:
        try:
            logits = self.engine.forward(np.asarray([token_id], np.int32))
        except BaseException:
            self.reset()
            raise
        self.cached.append(token_id)
        self.forwarded += 1
        return logits

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Run ids (the last token and guesses after it) in one step; logits of every row
        ([len(ids), vocab]: row i predicts the token after ids[i])."""
        try:
            logits = self.engine.forward(np.asarray(ids, np.int32), logits_for="all")
        except BaseException:
            self.reset()
            raise
        self.cached.extend(int(i) for i in ids)
        self.forwarded += len(ids)
        return logits

    def rollback(self, n: int) -> None:
        """Drop the last n cached positions (rejected guesses): the slot's length is set back,
        so the next step overwrites their keys and values."""
        keep = len(self.cached) - n
        self.engine.truncate(keep)
        if self.engine.n_past != keep:      # a ring that cannot step back that far: never reached,
            self.reset()                    # the loop verifies at most max_batch_tokens rows
            raise RuntimeError(f"the KV cache cannot step back {n} positions (its sliding-window "
                               f"rings hold fewer); speculation must verify fewer rows per step")
        del self.cached[keep:]
        self.forwarded -= n             # counts the text's tokens run, as plain decoding does


@dataclass(frozen=True)
class Chunk:
    """A piece of final text and the logprobs of the tokens whose text it completes: a token's
    logprob comes with the chunk that carries the last of its text (a token "Hello" streamed as
    "Hell" then "o" is reported with "o"), so the chunks' logprobs, joined, are the result's, once
    each and in order. A token without text of its own (a special token) goes with the next chunk."""
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class GenerationResult:
    text: str
    finish_reason: str                     # "stop" (EOS, stop string, complete grammar), "length"
    token_ids: list[int]                   # every sampled id, the EOS included
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0                 # prompt tokens served from the KV cache
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None   # the stop string or EOS id that ended it (None: the
                                           # grammar of a constrained answer was complete)
    prompt_seconds: float = 0.0
    generate_seconds: float = 0.0       # from the first sampled token to the end
    speculative: SpeculativeStats | None = None   # what speculative decoding did (None: off)


class StopMatcher:
    """Earliest occurrence of any stop string in growing text, and how much text is safe to release
    (everything before a suffix that is still a prefix of some stop string)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, start: int) -> tuple[int, str] | None:
        best = None
        for s in self.stops:
            i = text.find(s, max(0, start - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def safe_end(self, text: str, start: int) -> int:
        """Largest n >= start such that text[n:] could still begin a stop string (or len(text))."""
        return len(text) - partial_suffix(text, self.stops, start)


class Generation:
    """One request, iterated as Chunks; `result` is filled when the iteration ends."""

    def __init__(self, session: KVSession, tokenizer: TokenizerLike, prompt_ids: Sequence[int],
                 params: SamplingParams, *, vocab_size: int, valid: np.ndarray | None = None,
                 constraint: "TokenConstraint | None" = None,
                 drafter: "Callable[[KVSession], Drafter] | None" = None):
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise InvalidParameterError("the prompt is empty: give at least one token of text",
                                        param="prompt")
        bad = [i for i in prompt if not 0 <= i < vocab_size]
        if bad:
            raise InvalidParameterError(f"prompt token id {bad[0]} is outside the vocabulary "
                                        f"0..{vocab_size - 1}", param="prompt")
        n_ctx = session.engine.n_ctx
        if len(prompt) >= n_ctx:
            raise ContextLengthExceeded(len(prompt), n_ctx)
        # OpenAI's rule: a max_tokens the caller chose must fit after the prompt (a default only caps)
        if params.max_tokens_given and params.max_tokens is not None and \
                len(prompt) + params.max_tokens > n_ctx:
            raise ContextLengthExceeded(len(prompt), n_ctx, params.max_tokens)
        self.session = session
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.params = params
        self.budget = n_ctx - len(prompt)
        if params.max_tokens is not None:
            self.budget = min(self.budget, params.max_tokens)
        # constraint: the output stays a prefix of a grammar's language (the sampler masks every
        # other id) and ends, finish_reason "stop", once the grammar is complete
        self.constraint = constraint
        self.sampler = Sampler(params, vocab_size, valid=valid, prompt_ids=prompt,
                               constraint=constraint)
        # speculative decoding: made from the session the generation runs on (a draft model's
        # drafter uses the draft slot paired with it)
        self.make_drafter = drafter
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Chunk]:
        p = self.params
        tok = self.tokenizer
        eos = set() if p.ignore_eos else set(p.eos_token_ids)
        stops = StopMatcher(p.stop)
        # dec.text: everything decoded so far (complete characters); dec.text[:dec.emitted] yielded
        # the completion continues the prompt's text (a prompt of special tokens only has none)
        special = getattr(tok, "special_ids", ())
        dec = StreamDecoder(tok, skip_special_tokens=True,
                            continuation=any(i not in special for i in self.prompt))
        # logprobs not sent yet, as [start, end, logprob] with the token's text at text[start:end];
        # end is None while the decoder holds bytes of the token (its character is not complete)
        pending: list[list[Any]] = []
        ids: list[int] = []
        all_lp: list[TokenLogprob] = []
        finish, stop_reason, cut = "length", None, None
        grammar_done = False

        def release(n: int) -> tuple[TokenLogprob, ...]:
            out = tuple(lp for _, _, lp in pending[:n])
            del pending[:n]
            return out

        def complete_by(end: int) -> int:
            """How many pending tokens have all their text in text[:end] (ends never decrease)."""
            n = 0
            while n < len(pending) and pending[n][1] is not None and pending[n][1] <= end:
                n += 1
            return n

        cancel = _CANCEL.get()
        _check_cancel(cancel)
        drafter = self.make_drafter(self.session) if self.make_drafter is not None else None
        stats = (SpeculativeStats(drafter.name, requested=getattr(drafter, "requested", True))
                 if drafter is not None else None)
        length = None
        if drafter is not None:
            length = self.session.draft_lengths.get(drafter.name)
            if length is None:
                length = self.session.draft_lengths[drafter.name] = DraftLength(drafter.max_draft)
        t0 = time.perf_counter()
        logits = self.session.prefill(self.prompt)
        if drafter is not None:
            drafter.start(self.prompt)
        t1 = time.perf_counter()
        # rows[i]: logits of the next position given the guesses before it; guesses[i]: what the
        # drafter guessed for that position (none for the last row)
        rows: list[np.ndarray] = [logits[-1]]
        guesses: list[int] = []
        drafted = kept = 0                   # of the last verifying step
        while True:
            row = rows.pop(0)
            guess = guesses.pop(0) if guesses else None
            if drafter is None:
                token, info = self.sampler.sample(row)
            else:
                token, info = accept_draft(self.sampler, row, guess)
                kept += token == guess
            ids.append(token)
            if token in eos:
                finish, stop_reason = "stop", token
                break
            start = dec.add(token)
            if info is not None:
                if dec.whole:
                    for entry in pending:
                        if entry[1] is None:
                            entry[1] = len(dec.text)
                info = replace(info, text_offset=start)
                pending.append([start, len(dec.text) if dec.whole else None, info])
                all_lp.append(info)
            hit = stops.find(dec.text, dec.emitted) if stops.stops else None
            if hit is not None:
                finish, stop_reason, cut = "stop", hit[1], hit[0]
                break
            end = stops.safe_end(dec.text, dec.emitted) if stops.stops else len(dec.text)
            # hold back the last grapheme cluster: a combining mark may still extend it
            end = min(end, dec.final_end())
            if end > dec.emitted:
                piece = dec.take(end)
                yield Chunk(piece, release(complete_by(end)))
            if self.constraint is not None and self.constraint.finished:
                finish, grammar_done = "stop", True     # nothing but an end id could follow
                break
            if len(ids) >= self.budget:
                break
            if rows and token == guess:
                continue                      # the next row was computed after this very token
            _check_cancel(cancel)
            if drafter is None:
                rows = [self.session.step(token)[-1]]
                continue
            assert length is not None and stats is not None
            if rows:                          # a guess was rejected: drop the rows after it
                self.session.rollback(len(rows))
            length.observe(drafted, kept)
            stats.accepted += kept
            # until a plain step has been measured, the first is plain (the speedup's baseline)
            k = length.next() if stats.steps or 1 in length.cost else 0
            # room: the tokens still wanted after this one, the context, and one engine step
            # (rolling back within a step is what a sliding-window ring allows: Engine.truncate)
            eng = self.session.engine
            k = min(k, self.budget - len(ids) - 1, eng.n_ctx - len(self.session.cached) - 2,
                    getattr(eng, "max_batch_tokens", MAX_DRAFT + 1) - 1)
            ts = time.perf_counter()       # a step's cost includes the drafter's
            guesses = drafter.draft(self.prompt + ids, k, self.sampler)[:k] if k > 0 else []
            if guesses:
                rows = list(self.session.verify([token, *guesses]))
            else:
                rows = [self.session.step(token)[-1]]
            dt = time.perf_counter() - ts
            length.observe_step(len(rows), dt)
            drafted, kept = len(guesses), 0
            stats.steps += 1
            stats.seconds += dt
            stats.verify_steps += bool(guesses)
            stats.drafted += drafted
        if stats is not None and length is not None:
            if rows:          # rows past the last token: the cache keeps what plain decoding does
                self.session.rollback(len(rows))
            stats.accepted += kept
            stats.tokens = max(len(ids) - 1, 0)     # the first token came from the prompt's step
            stats.plain_seconds_per_token = length.cost.get(1, 0.0)
        if cut is None:
            dec.flush()
            cut = len(dec.text)
        text, emitted = dec.text, dec.emitted
        if finish == "length" or stop_reason in eos or grammar_done:
            lps = release(len(pending))
        else:          # cut at a stop string: the tokens with text before the cut are the answer's
            lps = release(sum(1 for start, _, _ in pending if start < cut))
        if pending:    # tokens that start inside the cut stop string are not part of the answer
            dropped = {id(lp) for _, _, lp in pending}
            all_lp = [lp for lp in all_lp if id(lp) not in dropped]
        t2 = time.perf_counter()
        self.result = GenerationResult(
            text=text[:cut], finish_reason=finish, token_ids=ids, prompt_tokens=len(self.prompt),
            completion_tokens=len(ids), cached_tokens=self.session.last_reused,
            logprobs=all_lp if p.logprobs else None, stop_reason=stop_reason,
            prompt_seconds=t1 - t0, generate_seconds=t2 - t1, speculative=stats)
        if cut > emitted or lps:
            yield Chunk(text[emitted:cut], lps)

    def run(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result
