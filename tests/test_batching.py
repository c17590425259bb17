"""Continuous batching on the tiny chat model: ignis.load(parallel=N) serves N generations at once
with their steps batched; each generation equals the same generation run alone, token for token
(greedy and seeded sampling, stop strings, long prompts prefilled a chunk at a time beside others'
decodes); slots are reused by prefix, and errors in one generation leave the others running."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import ignis
from ignis.generate import ContextLengthExceeded, InvalidParameterError, ModelBusyError
from ignis.generate.batch import BatchScheduler
from ignis.runtime import Engine
from ignis.runtime.errors import TokenIdError

PROMPTS = ["alpha", "beta gamma delta", "the quick brown fox " * 6, "x", "def f(s):\n    return",
           "zzz", "hello hello hello", "1 2 3 4 5 6 7 8 9 10"]


@pytest.fixture(scope="module")
def alone(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=200, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def batched(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=200, threads=2, parallel=4)
    yield m
    m.close()
    m.weights.close()


def _in_threads(fn, n):
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as e:      # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return [out[i] for i in range(n)]


KWARGS = [dict(max_tokens=24, temperature=0, ignore_eos=True),
          dict(max_tokens=20, temperature=0.9, top_k=40, seed=7, ignore_eos=True),
          dict(max_tokens=30, temperature=0.8, top_p=0.9, seed=123, stop=["e"]),
          dict(max_tokens=16, temperature=0, repetition_penalty=1.3, logprobs=True, top_logprobs=2)]


def test_concurrent_generations_equal_each_run_alone(alone, batched):
    jobs = [(p, KWARGS[i % len(KWARGS)]) for i, p in enumerate(PROMPTS)]
    want = []
    for p, kw in jobs:
        alone.reset()
        want.append(alone.generate(p, **kw))
    before = batched._scheduler.stats.steps, batched._scheduler.stats.sequences
    got = _in_threads(lambda i: batched.generate(*jobs[i][:1], **jobs[i][1]), len(jobs))
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        if w.logprobs is not None:
            assert [lp.token_id for lp in g.logprobs] == [lp.token_id for lp in w.logprobs]
            np.testing.assert_allclose([lp.logprob for lp in g.logprobs],
                                       [lp.logprob for lp in w.logprobs], rtol=0, atol=1e-9)
    steps = batched._scheduler.stats.steps - before[0]
    seqs = batched._scheduler.stats.sequences - before[1]
    tokens = sum(len(w.token_ids) for w in want)
    # 8 generations on 4 slots: far fewer steps than tokens, because slots share steps
    assert seqs / steps > 1.5 and steps < tokens


def test_streams_on_several_threads_equal_their_non_streamed_text(batched):
    kw = dict(max_tokens=20, temperature=0.7, seed=3, ignore_eos=True)
    want = [batched.generate(p, **kw).text for p in PROMPTS[:4]]
    got = _in_threads(lambda i: "".join(batched.stream(PROMPTS[i], **kw)), 4)
    assert got == want


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=512, threads=1, parallel=2)
    ref = ignis.load(str(tiny_chat_dir), n_ctx=512, threads=1)
    long_prompt = "a long prompt, longer than one step of rows. " * 9   # > 128 tokens
    assert len(m.tokenize(long_prompt)) > m.engine.options.max_batch_tokens
    kw = dict(max_tokens=40, temperature=0, ignore_eos=True)
    want = [ref.generate("short", **kw).token_ids]
    ref.reset()
    want.append(ref.generate(long_prompt, **kw).token_ids)
    got = _in_threads(lambda i: m.generate(["short", long_prompt][i], **kw).token_ids, 2)
    assert got == want
    m.close()


def test_a_thread_cannot_wait_for_its_own_slots(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=100, threads=1, parallel=2)
    kw = dict(max_tokens=30, temperature=0, ignore_eos=True)
    a, b = m.stream("abc", **kw), m.stream("abd", **kw)
    next(a), next(b)                    # both slots taken by this thread
    with pytest.raises(ModelBusyError, match="every one of its 2 slot"):
        m.generate("abc", max_tokens=2)
    # another thread waits for a slot instead, and gets one when a stream is closed
    done = threading.Event()
    result: list = []
    t = threading.Thread(target=lambda: (result.append(m.generate("q", max_tokens=3, temperature=0)),
                                         done.set()))
    t.start()
    assert not done.wait(0.3)
    a.close()
    assert done.wait(30) and result[0].completion_tokens == 3
    rest = "".join(b)                   # the open stream still finishes
    assert b.result.completion_tokens == 30 and isinstance(rest, str)
    t.join()
    m.close()


def test_a_chat_follow_up_goes_to_the_slot_holding_its_prefix(batched):
    batched.reset()
    first = [{"role": "user", "content": "Say hi."}]
    r1 = batched.chat(first, max_tokens=6, temperature=0)
    batched.generate("something else entirely", max_tokens=4, temperature=0)
    turn2 = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "Again."}]
    r2 = batched.chat(turn2, max_tokens=4, temperature=0)
    assert r2.cached_tokens >= r1.prompt_tokens


def test_bad_requests_fail_alone_and_the_others_finish(batched):
    kw = dict(max_tokens=12, temperature=0, ignore_eos=True)
    want = batched.generate("fine", **kw).token_ids

    def job(i: int):
        if i == 1:
            with pytest.raises(ContextLengthExceeded):
                batched.generate("a" * 500, **kw)
            with pytest.raises(InvalidParameterError):
                batched.generate("fine", temperature=-2)
            return None
        return batched.generate("fine", **kw).token_ids

    got = _in_threads(job, 3)
    assert got[0] == got[2] == want


def test_parallel_must_be_a_positive_integer(tiny_chat_dir):
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidParameterError, match="parallel must be a positive integer"):
            ignis.load(str(tiny_chat_dir), n_ctx=50, parallel=bad)


def test_the_scheduler_isolates_a_failing_part(tiny_chat_dir):
    """A step whose rows include a bad part is rerun part by part: only the bad one fails."""
    files = ignis.load(str(tiny_chat_dir), n_ctx=50, threads=1).files
    eng = Engine(files, n_ctx=50, threads=1, n_seq=2)
    sched = BatchScheduler(eng, window=0.5)
    ref = Engine(files, n_ctx=50, threads=1).forward([5, 6, 7])
    real_check = eng.check_tokens
    eng.check_tokens = lambda tokens, seq=0: np.asarray(tokens, np.int32)   # let a bad id through
    sched.activate(0)
    sched.activate(1)
    out: dict[int, object] = {}

    def call(seq, toks):
        try:
            out[seq] = sched.forward(seq, toks)
        except Exception as e:      # noqa: BLE001
            out[seq] = e

    ts = [threading.Thread(target=call, args=(0, [5, 6, 7])),
          threading.Thread(target=call, args=(1, [5, 10**6]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    eng.check_tokens = real_check
    np.testing.assert_array_equal(out[0], ref)
    assert isinstance(out[1], TokenIdError)
    assert eng.seq_n_past(0) == 3 and eng.seq_n_past(1) == 0
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        sched.forward(0, [1])
