"""ignis.generate: the sampler against hand-computed distributions, stop strings and EOS with a
scripted fake engine, UTF-8-safe streaming, context limits, parameter validation, and greedy
generation on the tiny model against an argmax reference run straight on Engine.forward."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ignis.generate import (ContextLengthExceeded, Generation, InvalidParameterError, KVSession,
                            Sampler, StopMatcher, resolve_params)
from ignis.loader.config import GenerationConfig
from ignis.runtime import Engine
from ignis.tokenizer import load_tokenizer

DATA = Path(__file__).parent / "data" / "tokenizer"
VOCAB = 272
IM_END, ENDOFTEXT = 258, 256


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer({"tokenizer.json": json.loads((DATA / "tiny-tokenizer.json").read_text()),
                           "tokenizer_config.json": json.loads(
                               (DATA / "tiny-tokenizer_config.json").read_text())})


class FakeEngine:
    """Engine API (forward/n_past/n_ctx/truncate/reset) whose logits make `script` the greedy
    continuation: after the prompt it puts the highest logit on script[0], then script[1], ..."""

    def __init__(self, script: list[int], *, n_ctx: int = 64, vocab: int = VOCAB):
        self.script = list(script)
        self.n_ctx = n_ctx
        self.vocab = vocab
        self.n_past = 0
        self.calls: list[list[int]] = []
        self._step = 0

    def forward(self, tokens, *, logits_for="last"):
        tokens = [int(t) for t in tokens]
        assert self.n_past + len(tokens) <= self.n_ctx, "the loop overran the context"
        self.calls.append(tokens)
        self.n_past += len(tokens)
        out = np.zeros((1, self.vocab), np.float32)
        out[0, self.script[min(self._step, len(self.script) - 1)]] = 10.0
        self._step += 1
        return out

    def truncate(self, n):
        assert 0 <= n <= self.n_past
        self.n_past = n

    def reset(self):
        self.n_past = 0


def run(tok, script, *, prompt=(1, 2, 3), n_ctx=64, **kw):
    eng = FakeEngine(script, n_ctx=n_ctx)
    params = resolve_params(GenerationConfig(eos_token_ids=(IM_END, ENDOFTEXT)), vocab_size=VOCAB,
                            **{"temperature": 0, **kw})
    gen = Generation(KVSession(eng), tok, list(prompt), params, vocab_size=VOCAB)
    pieces = [c.text for c in gen]
    return gen.result, pieces, eng


def ids_of(tok, text):
    return tok.encode(text, add_special_tokens=False)


# ---- the sampler ---------------------------------------------------------------------------------

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float64)).astype(np.float32)


def sampler(**kw):
    return Sampler(resolve_params(GenerationConfig(), vocab_size=4, **kw), 4)


def support(s: Sampler, logits=LOGITS) -> set[int]:
    return set(np.flatnonzero(s.distribution(s.process(logits))).tolist())


def test_greedy_is_the_first_argmax():
    s = sampler(temperature=0)
    x = np.array([1.0, 3.0, 3.0, 0.0], np.float32)
    assert [s.sample(x)[0] for _ in range(3)] == [1, 1, 1]


def test_a_temperature_too_small_to_divide_by_is_greedy():
    s = sampler(temperature=5e-324, seed=1)
    assert s.params.greedy and [s.sample(LOGITS)[0] for _ in range(3)] == [0, 0, 0]


def test_a_repetition_penalty_near_zero_leaves_a_distribution_not_nans():
    s = Sampler(resolve_params(GenerationConfig(), vocab_size=4, repetition_penalty=5e-324,
                               temperature=1.0, seed=0), 4, prompt_ids=[0, 1])
    probs = s.distribution(s.process(np.array([2.0, 1.0, 0.5, 0.1], np.float32)))
    # both seen tokens are divided to +inf: they share the mass instead of making it NaN
    np.testing.assert_array_equal(probs, [0.5, 0.5, 0.0, 0.0])


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "repetition_penalty",
                                  "presence_penalty", "frequency_penalty"])
def test_an_integer_past_the_float_range_is_invalid_value(name):
    with pytest.raises(InvalidParameterError) as e:
        resolve_params(GenerationConfig(), vocab_size=4, **{name: 10**400})
    assert e.value.param == name and e.value.code == "invalid_value"
    with pytest.raises(InvalidParameterError) as e:
        resolve_params(GenerationConfig(), vocab_size=4, logit_bias={"0": 10**400})
    assert e.value.param == "logit_bias"


def test_temperature_scales_logits_before_softmax():
    s = sampler(temperature=0.5)
    want = np.exp(LOGITS / 0.5) / np.exp(LOGITS / 0.5).sum()
    np.testing.assert_allclose(s.distribution(s.process(LOGITS)), want, rtol=1e-6)


@pytest.mark.parametrize("top_k,kept", [(1, {0}), (2, {0, 1}), (3, {0, 1, 2}), (0, {0, 1, 2, 3})])
def test_top_k_keeps_the_k_most_likely(top_k, kept):
    assert support(sampler(temperature=1.0, top_k=top_k)) == kept


@pytest.mark.parametrize("top_p,kept", [(0.5, {0}), (0.51, {0, 1}), (0.79, {0, 1}),
                                        (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    # probabilities 0.5, 0.3, 0.15, 0.05: the nucleus for p is the shortest prefix with mass >= p
    assert support(sampler(temperature=1.0, top_p=top_p)) == kept


@pytest.mark.parametrize("min_p,kept", [(0.0, {0, 1, 2, 3}), (0.09, {0, 1, 2, 3}), (0.11, {0, 1, 2}),
                                        (0.5, {0, 1}), (1.0, {0})])
def test_min_p_drops_tokens_below_a_fraction_of_the_best(min_p, kept):
    assert support(sampler(temperature=1.0, min_p=min_p)) == kept


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_on_a_large_vocabulary_follows_the_definition(top_p):
    # 5000 ids: the sampler's partial sort (top 1024 first) must agree with the plain definition
    v = 5000
    x = (np.random.default_rng(0).standard_normal(v) * 3).astype(np.float32)
    s = Sampler(resolve_params(GenerationConfig(), vocab_size=v, temperature=1.0, top_p=top_p), v)
    got = s.distribution(s.process(x))
    e = [math.exp(float(t)) for t in x]
    total = math.fsum(e)
    kept, mass = [], 0.0
    for i in sorted(range(v), key=lambda i: (-e[i], i)):
        if mass >= top_p:
            break
        kept.append(i)
        mass += e[i] / total
    assert set(np.flatnonzero(got).tolist()) == set(kept)
    kept_total = math.fsum(e[i] for i in kept)
    np.testing.assert_allclose(got[kept], [e[i] / kept_total for i in kept], rtol=1e-9)


def test_filters_renormalise():
    s = sampler(temperature=1.0, top_k=2)
    np.testing.assert_allclose(s.distribution(s.process(LOGITS)), [0.5 / 0.8, 0.3 / 0.8, 0, 0],
                               rtol=1e-6)


def test_draws_follow_the_distribution():
    s = sampler(temperature=1.0, seed=1234)
    n = 20000
    counts = np.bincount([s.sample(LOGITS)[0] for _ in range(n)], minlength=4)
    # binomial standard errors at n=20000 are <= 0.0036; 5 sigma is a fixed-seed sanity bound
    np.testing.assert_allclose(counts / n, [0.5, 0.3, 0.15, 0.05], atol=0.018)


def test_same_seed_same_draws_and_other_seeds_differ():
    def draws(seed):
        s = sampler(temperature=1.0, seed=seed)
        return [s.sample(LOGITS)[0] for _ in range(50)]
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    params = resolve_params(GenerationConfig(), vocab_size=4, repetition_penalty=2.0)
    s = Sampler(params, 4, prompt_ids=[0, 3])
    x = np.array([2.0, 1.0, 0.5, -1.0], np.float32)
    np.testing.assert_allclose(s.process(x), [1.0, 1.0, 0.5, -2.0])


def test_presence_and_frequency_penalties_follow_openai():
    # OpenAI: mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, over the output
    params = resolve_params(GenerationConfig(), vocab_size=4, presence_penalty=0.5,
                            frequency_penalty=0.25)
    s = Sampler(params, 4, prompt_ids=[2])          # prompt tokens are not penalised
    for t in (1, 1, 3):
        s.accept(t)
    x = np.zeros(4, np.float32)
    np.testing.assert_allclose(s.process(x), [0.0, -(2 * 0.25 + 0.5), 0.0, -(0.25 + 0.5)])


def test_logit_bias_bans_and_forces():
    s = sampler(temperature=1.0, seed=0, logit_bias={"0": -100, 1: -100, 2: -100})
    assert {s.sample(LOGITS)[0] for _ in range(20)} == {3}
    assert sampler(temperature=0, logit_bias={3: 100}).sample(LOGITS)[0] == 3


def test_ids_without_a_token_are_never_drawn_nor_reported():
    valid = np.array([False, True, True, True])
    params = resolve_params(GenerationConfig(), vocab_size=4, temperature=0, logprobs=True,
                            top_logprobs=4)
    token, info = Sampler(params, 4, valid=valid).sample(LOGITS)
    assert token == 1
    assert [t.token_id for t in info.top][:3] == [1, 2, 3] and info.top[3].logprob == -math.inf


def test_logprobs_are_the_log_softmax_of_the_raw_logits():
    x = np.array([1.5, -0.25, 3.0, 0.0], np.float32)
    params = resolve_params(GenerationConfig(), vocab_size=4, temperature=0.3, seed=3,
                            repetition_penalty=1.7, logprobs=True, top_logprobs=2)
    token, info = Sampler(params, 4).sample(x)
    lse = math.log(math.fsum(math.exp(float(v)) for v in x))
    assert info.token_id == token
    assert info.logprob == pytest.approx(float(x[token]) - lse, abs=1e-12)
    assert [t.token_id for t in info.top] == [2, 0]
    assert info.top[0].logprob == pytest.approx(3.0 - lse, abs=1e-12)


# ---- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,param", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": 2.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"), ({"min_p": 1.1}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"stop": ""}, "stop"), ({"stop": ["a", ""]}, "stop"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 3}, "stop"), ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {VOCAB: 1}}, "logit_bias"),
    ({"logit_bias": {1: 101}}, "logit_bias"), ({"logit_bias": [1]}, "logit_bias"),
    ({"seed": 1.5}, "seed"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": 1}, "logprobs"),
    ({"temprature": 1.0}, "temprature"), ({"stop": "a\ud800b"}, "stop"), ({"stop": ["x", "\udfff"]}, "stop"),
    ({"max_tokens_given": True}, "max_tokens_given"),
])
def test_invalid_parameters_are_typed_errors_naming_the_parameter(tok, kw, param):
    eng = FakeEngine([65])
    with pytest.raises(InvalidParameterError) as e:
        params = resolve_params(GenerationConfig(), vocab_size=VOCAB, **kw)
        Generation(KVSession(eng), tok, [1, 2], params, vocab_size=VOCAB)
    assert e.value.param == param
    assert isinstance(e.value, ValueError)
    assert eng.calls == []


def test_defaults_come_from_the_generation_config():
    g = GenerationConfig(eos_token_ids=(5,), do_sample=True, temperature=0.7, top_k=20, top_p=0.8,
                         repetition_penalty=1.1, max_new_tokens=33)
    p = resolve_params(g, vocab_size=VOCAB)
    assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.max_tokens, p.eos_token_ids) == \
        (0.7, 20, 0.8, 1.1, 33, (5,))
    assert resolve_params(g, vocab_size=VOCAB, temperature=0.2, top_k=None).temperature == 0.2
    assert resolve_params(GenerationConfig(do_sample=False), vocab_size=VOCAB).greedy


# ---- stops, EOS, limits (scripted engine) --------------------------------------------------------

def test_a_stop_string_across_tokens_is_cut_and_never_streamed(tok):
    script = ids_of(tok, "Hello END tail")
    assert len(ids_of(tok, "END")) > 1            # the stop really spans several tokens
    r, pieces, _ = run(tok, script, stop="END")
    assert r.text == "Hello " and r.finish_reason == "stop" and r.stop_reason == "END"
    assert "".join(pieces) == r.text
    assert not any("E" in p for p in pieces)
    assert r.completion_tokens == len(ids_of(tok, "Hello END"))   # no token after the match


def test_a_partial_stop_match_is_held_then_released(tok):
    r, pieces, _ = run(tok, ids_of(tok, "a EN b END"), stop=["END", "xyz"])
    assert r.text == "a EN b "
    assert "".join(pieces) == r.text
    # one token per step: "a", " " come out (each a step late: the last grapheme is held), "E" and
    # "N" are held while they could start "END", and leave together once " " rules that out
    assert pieces[:3] == ["a", " ", "EN"]


def test_the_earliest_of_several_stops_wins(tok):
    r, _, _ = run(tok, ids_of(tok, "one two three"), stop=["three", "two"])
    assert r.text == "one " and r.stop_reason == "two"


@pytest.mark.parametrize("eos", [IM_END, ENDOFTEXT])
def test_every_eos_id_stops_and_is_not_in_the_text(tok, eos):
    r, pieces, eng = run(tok, ids_of(tok, "hi") + [eos, 65, 66])
    assert r.text == "hi" and r.finish_reason == "stop" and r.stop_reason == eos
    assert r.token_ids[-1] == eos and r.completion_tokens == 3
    assert eng.calls[-1] == [ids_of(tok, "hi")[-1]]      # the EOS itself is never forwarded


def test_ignore_eos_runs_to_max_tokens(tok):
    r, _, _ = run(tok, [IM_END], max_tokens=4, ignore_eos=True)
    assert r.finish_reason == "length" and r.completion_tokens == 4


def test_max_tokens_finishes_with_length(tok):
    r, pieces, _ = run(tok, ids_of(tok, "abcdefgh"), max_tokens=5)
    assert r.finish_reason == "length" and r.text == "abcde" and "".join(pieces) == "abcde"


def test_streamed_pieces_are_whole_characters(tok):
    text = "h\u00e9llo \u4e16\u754c \U0001F389 q\u0301!"
    script = ids_of(tok, text)
    assert len(script) > len(text)                # multi-byte characters span several tokens
    r, pieces, _ = run(tok, script, max_tokens=len(script))
    assert r.text == text and "".join(pieces) == text
    for p in pieces:
        assert "\ufffd" not in p
        p.encode("utf-8")                         # whole code points only
    assert "q" not in pieces
    assert any(p.startswith("q\u0301") for p in pieces)   # the combining mark stayed with its base


def chunks_of(tok, script, **kw):
    eng = FakeEngine(script)
    params = resolve_params(GenerationConfig(eos_token_ids=(IM_END, ENDOFTEXT)), vocab_size=VOCAB,
                            **{"temperature": 0, "logprobs": True, **kw})
    gen = Generation(KVSession(eng), tok, [1, 2, 3], params, vocab_size=VOCAB)
    return list(gen), gen.result


def check_logprobs_follow_the_text(tok, chunks, result):
    """Each chunk carries the logprobs of exactly the tokens whose text it completes."""
    sent = [lp for c in chunks for lp in c.logprobs]
    assert [lp.token_id for lp in sent] == [lp.token_id for lp in result.logprobs]
    assert sent == result.logprobs                          # once each, in order
    text, ends = "", []
    for c in chunks:
        text += c.text
        for lp in c.logprobs:
            # a token's own text ends inside the text sent so far...
            ends.append(len(text))
            assert lp.text_offset <= len(text)
    # ...and not inside an earlier chunk. Each token's text ends at the end of the character its
    # last byte belongs to: replay the bytes to find it
    pieces = [tok.token_bytes(lp.token_id) if lp.token_id not in tok.special_ids else b""
              for lp in result.logprobs]
    whole = b"".join(pieces)
    at, seen = 0, []
    for piece, lp in zip(pieces, result.logprobs):
        begin = at
        while 0 < begin < len(whole) and 0x80 <= whole[begin] < 0xC0:
            begin -= 1                    # a token that finishes a character starts where it does
        assert lp.text_offset == len(whole[:begin].decode())
        at += len(piece)
        end = at
        while end < len(whole) and 0x80 <= whole[end] < 0xC0:
            end += 1
        seen.append(len(whole[:end].decode()))
    lengths = list(np.cumsum([len(c.text) for c in chunks]))
    for end, got in zip(seen, ends):
        assert got == min((n for n in lengths if n >= min(end, len(result.text))),
                          default=len(result.text))


def test_a_streamed_token_logprob_comes_with_the_last_of_its_text(tok):
    # " the" is one token; its last letter is held back (a combining mark could follow), so its
    # text goes out as " th" ... "e": its logprob must come with "e", not with " th"
    script = ids_of(tok, "on the")
    assert tok.token_bytes(script[-1]) == b" the"
    chunks, r = chunks_of(tok, script + [IM_END])
    assert [(c.text, [tok.token_bytes(lp.token_id) for lp in c.logprobs]) for c in chunks] == \
        [("o", []), ("n th", [b"on"]), ("e", [b" the"])]
    assert [lp.text_offset for lp in r.logprobs] == [0, 2]
    check_logprobs_follow_the_text(tok, chunks, r)


@pytest.mark.parametrize("text,kw", [
    ("h\u00e9llo \u4e16\u754c \U0001F389 q\u0301!", {}),       # characters split over tokens
    ("the other then", {"stop": ["then"]}),                    # held back for a stop, then cut
    ("in the end", {"stop": ["e e", "thx"]}),                  # partial stop matches released
    ("on the", {"max_tokens": 2}),
])
def test_streamed_logprobs_join_to_the_results_and_follow_the_text(tok, text, kw):
    script = ids_of(tok, text)
    chunks, r = chunks_of(tok, script + [IM_END], **kw)
    assert "".join(c.text for c in chunks) == r.text
    check_logprobs_follow_the_text(tok, chunks, r)


def test_a_prompt_that_fills_the_context_is_refused_before_the_engine_runs(tok):
    eng = FakeEngine([65], n_ctx=8)
    params = resolve_params(GenerationConfig(), vocab_size=VOCAB)
    with pytest.raises(ContextLengthExceeded) as e:
        Generation(KVSession(eng), tok, list(range(9)), params, vocab_size=VOCAB)
    assert (e.value.prompt_tokens, e.value.n_ctx) == (9, 8)
    assert "9" in str(e.value) and "8" in str(e.value)
    assert eng.calls == []


def test_without_max_tokens_generation_runs_to_the_context_end(tok):
    r, _, eng = run(tok, [65] * 50, prompt=[1, 2, 3, 4, 5], n_ctx=12)
    assert r.finish_reason == "length" and r.completion_tokens == 12 - 5
    assert eng.n_past <= 12
    # generation_config's max_new_tokens is a default, not the caller's: it caps, never refuses
    eng = FakeEngine([65] * 50, n_ctx=12)
    params = resolve_params(GenerationConfig(max_new_tokens=100), vocab_size=VOCAB, temperature=0)
    r = Generation(KVSession(eng), tok, [1, 2, 3, 4, 5], params, vocab_size=VOCAB).run()
    assert r.finish_reason == "length" and r.completion_tokens == 7


def test_an_explicit_max_tokens_past_the_context_is_refused_with_both_numbers(tok):
    # OpenAI answers prompt + max_tokens > context with context_length_exceeded, not a short answer
    eng = FakeEngine([65] * 50, n_ctx=12)
    params = resolve_params(GenerationConfig(), vocab_size=VOCAB, max_tokens=8)
    with pytest.raises(ContextLengthExceeded) as e:
        Generation(KVSession(eng), tok, [1, 2, 3, 4, 5], params, vocab_size=VOCAB)
    assert (e.value.prompt_tokens, e.value.max_tokens, e.value.n_ctx) == (5, 8, 12)
    assert str(e.value).startswith("This model's maximum context length is 12 tokens. However, "
                                   "you requested 13 tokens (5 in the prompt, 8 in the completion).")
    assert eng.calls == []
    r, _, _ = run(tok, [65] * 50, prompt=[1, 2, 3, 4, 5], n_ctx=12, max_tokens=7)   # exactly fits
    assert r.finish_reason == "length" and r.completion_tokens == 7


def test_stop_matcher_safe_end():
    m = StopMatcher(["END", "xy"])
    assert m.safe_end("abcEN", 0) == 3
    assert m.safe_end("abcx", 0) == 3
    assert m.safe_end("abcd", 0) == 4
    assert m.find("aENDxy", 0) == (1, "END")


# ---- the loop on the tiny model via the real Engine --------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tiny_chat_dir):
    return tiny_chat_dir


@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    import ignis
    m = ignis.load(str(tiny_dir), n_ctx=96, threads=1)
    yield m
    m.weights.close()


def test_greedy_generation_equals_argmax_over_full_recomputation(tiny_model, tiny_dir):
    from ignis.loader.resolve import open_model
    prompt = tiny_model.tokenize("Hello, tiny world")
    r = tiny_model.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True)
    files = open_model(tiny_dir)
    eng = Engine(files, n_ctx=96, threads=1)
    seq, want = list(prompt), []
    for _ in range(12):          # no KV cache reuse: every step recomputes the whole sequence
        eng.reset()
        nxt = int(np.argmax(eng.forward(np.array(seq, np.int32), logits_for="all")[-1]))
        want.append(nxt)
        seq.append(nxt)
    files.weights.close()
    assert r.token_ids == want
    assert r.text == tiny_model.detokenize(want, skip_special_tokens=True)


def test_seeded_sampling_is_reproducible_and_stream_equals_generate(tiny_model):
    kw = dict(max_tokens=20, temperature=1.2, top_k=50, top_p=0.95, seed=42, ignore_eos=True)
    a = tiny_model.generate("abc", **kw)
    b = tiny_model.generate("abc", **kw)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert "".join(tiny_model.stream("abc", **kw)) == a.text
    assert tiny_model.generate("abc", **{**kw, "seed": 43}).token_ids != a.token_ids


def test_cancel_when_stops_before_the_next_forward_step(tok):
    import threading
    from ignis.generate import GenerationCancelled, cancel_when
    script = ids_of(tok, "abcdefgh")
    eng = FakeEngine(script)
    params = resolve_params(GenerationConfig(eos_token_ids=(IM_END,)), vocab_size=VOCAB,
                            temperature=0, max_tokens=8)
    stop = threading.Event()
    gen = Generation(KVSession(eng), tok, [1, 2, 3], params, vocab_size=VOCAB)
    with cancel_when(stop):
        it = iter(gen)
        next(it)
        stop.set()
        with pytest.raises(GenerationCancelled):
            next(it)
    calls = len(eng.calls)
    assert calls <= 3 and gen.result is None
    # set before the start: not even the prompt runs; outside the block nothing is cancelled
    eng2 = FakeEngine(script)
    with cancel_when(stop), pytest.raises(GenerationCancelled):
        list(Generation(KVSession(eng2), tok, [1, 2, 3], params, vocab_size=VOCAB))
    assert eng2.calls == []
    assert run(tok, script, max_tokens=8)[0].completion_tokens == 8


def test_model_calls_refuse_an_explicit_max_tokens_past_the_context(tiny_model):
    # Model.generate / stream / chat follow the API's rule: an explicit max_tokens must fit after
    # the prompt; without one the answer may run to the end of the context
    prompt = [65] * 90                                       # the fixture's context holds 96
    for call in (tiny_model.generate, tiny_model.stream):
        with pytest.raises(ContextLengthExceeded) as e:
            call(prompt, max_tokens=7)
        assert (e.value.prompt_tokens, e.value.max_tokens, e.value.n_ctx) == (90, 7, 96)
    with pytest.raises(ContextLengthExceeded) as e:
        tiny_model.chat([{"role": "user", "content": "hi"}], max_tokens=96)
    assert e.value.max_tokens == 96 and e.value.prompt_tokens < 96
    r = tiny_model.generate(prompt, max_tokens=6, temperature=0, ignore_eos=True)
    assert r.completion_tokens == 6
    r = tiny_model.generate(prompt, temperature=0, ignore_eos=True)
    assert r.completion_tokens == 6 and r.finish_reason == "length"


# ---- the checks every reader of a request shares (ignis.Client, ignis serve) ----------------------

def _nested(depth: int, leaf=0):
    """`leaf` inside `depth` lists, the outermost first."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_request_values_nest_at_most_max_nesting_deep_whatever_the_depth():
    from ignis.generate.params import MAX_NESTING, check_request_value
    check_request_value({"a": _nested(MAX_NESTING - 1)}, None)      # the body is level 1
    with pytest.raises(InvalidParameterError) as e:
        check_request_value({"a": _nested(MAX_NESTING)}, None)
    # the list at level 65: the body, then "a" (level 2), then 63 more
    assert e.value.param == "a" + ".[0]" * (MAX_NESTING - 1) and e.value.code == "invalid_value"
    assert f"at most {MAX_NESTING} levels" in str(e.value)
    for depth in (1_000, 100_000):                    # past the recursion limit: a loop, no recursion
        with pytest.raises(InvalidParameterError) as e:
            check_request_value(_nested(depth, "x"), "messages", level=2)
        assert e.value.param.startswith("messages.[0].[0]")
    check_request_value(list(range(100_000)), "prompt", level=2)    # wide is fine


def test_lone_surrogates_are_found_in_values_and_field_names_and_named_by_path():
    from ignis.generate.params import check_request_value, lone_surrogate
    assert lone_surrogate("ok \U0001F389") is None and lone_surrogate("ab\udc00") == 2
    cases = [({"messages": [{"content": "a\ud800"}]}, "messages.[0].content"),
             ({"stop": ["ok", "\udbff"]}, "stop.[1]"),
             ({"m": [{"na\udc00me": 1}]}, "m.[0].na\\udc00me"),   # escaped: the error is UTF-8
             ({"x\ud800": 1}, "x\\ud800")]
    for value, param in cases:
        with pytest.raises(InvalidParameterError) as e:
            check_request_value(value, None)
        assert (e.value.param, e.value.code) == (param, "invalid_value")
        assert "surrogate" in str(e.value)
        str(e.value).encode("utf-8")
    check_request_value({"x\ud800": "\udfff"}, None, texts=False)    # nesting only
    with pytest.raises(InvalidParameterError) as e:                # Model.generate's own check
        resolve_params(GenerationConfig(), vocab_size=VOCAB, stop=["\ud800"])
    assert e.value.param == "stop" and "surrogate" in str(e.value)


def test_one_builder_words_the_context_length_error_for_any_field():
    from ignis.generate.errors import context_length_message
    e = ContextLengthExceeded(5, 12, 8)
    assert e.param == "prompt" and str(e) == context_length_message(12, 5, 8, "prompt")
    assert str(e).startswith("This model's maximum context length is 12 tokens. However, you "
                             "requested 13 tokens (5 in the prompt, 8 in the completion). Please "
                             "reduce the length of the prompt or completion.")
    chat = ContextLengthExceeded(20, 12, field="messages")
    assert chat.param == "messages" and str(chat).startswith(
        "This model's maximum context length is 12 tokens. However, your messages resulted in 20 "
        "tokens, which leaves no room for a completion. Please reduce the length of the messages.")
    assert "n_ctx" in str(chat)                       # and how to get a longer context
