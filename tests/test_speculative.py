"""Speculative decoding (ignis.generate.speculative): greedy output identical to plain decoding,
token for token, with prompt lookup and with a draft model (the tiny random models, a Gemma 3
with sliding-window rings, continuous batching, and the real registry models); sampled output
distributed as plain sampling (a chi-square test against the exact distribution the model gives,
over a fixed set of seeds) and reproducible for a seed; bad requests refused with typed errors."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import threading

import numpy as np
import pytest

import ignis
from ignis.generate import Generation, KVSession, resolve_params
from ignis.generate.speculative import (DraftLength, PromptLookup, SpeculativeError,
                                        SpeculativeSpec, parse_speculative)
from ignis.loader.config import GenerationConfig
from tiny_models import complete_tiny_model, write_tiny_model

REPEATS = ["the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the",
           "def f(x):\n    return x + 1\n\ndef f(x):\n    return",
           "abc abc abc abc abc abc", "alpha", "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5",
           "hello hello hello hello"]


@pytest.fixture(scope="module")
def tiny(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def other_chat_dir(tmp_path_factory):
    """Another tiny Qwen2 (other random weights) with the same tokenizer: a draft model whose
    guesses are often wrong."""
    src = write_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-seed1"), arch="qwen2", seed=1)
    return complete_tiny_model(src, tmp_path_factory.mktemp("tiny-chat-1") / "tiny-chat-1")


@pytest.fixture
def pinned(monkeypatch):
    """The draft length pinned at 4: whether guesses are made must not depend on timings (the
    adaptive length measures steps, and on the tiny models it often finds that guessing does not
    pay); the output must be the same for any draft length."""
    from ignis.generate import speculative
    monkeypatch.setattr(speculative.DraftLength, "next", lambda self: 4)


# ---- the pieces ----------------------------------------------------------------------------------

def test_parse_speculative():
    assert parse_speculative(None) is None and parse_speculative("off") is None
    assert parse_speculative("prompt-lookup") == SpeculativeSpec("prompt-lookup")
    assert parse_speculative("draft:qwen2.5-coder-0.5b-instruct").model == "qwen2.5-coder-0.5b-instruct"
    for bad, what in [("lookup", "unknown speculative drafter"), ("draft:", "names no draft"),
                      (3, "must be a string"), ("medusa", "unknown")]:
        with pytest.raises(SpeculativeError, match=what) as ei:
            parse_speculative(bad)
        assert ei.value.param == "speculative" and isinstance(ei.value, ValueError)


def test_prompt_lookup_copies_what_followed_the_latest_longest_match():
    pl = PromptLookup()
    h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 4, 7, 8, 1, 2, 3]
    # "1 2 3" last occurs at 7..9 (followed by 4 7 8); no 4-gram "x 1 2 3" recurs
    assert pl.draft(h, 3) == [4, 7, 8]
    assert pl.draft(h, 1) == [4]
    assert pl.draft([5, 6, 7, 8], 4) == []          # nothing recurs: a plain step
    assert pl.draft([7, 8, 1, 7, 8], 4) == []       # a 2-gram is not enough
    assert pl.draft(h, 0) == []
    # a 4-gram match wins over a later 3-gram one
    h2 = [0, 1, 2, 3, 50, 51, 1, 2, 3, 60, 0, 1, 2, 3]
    assert pl.draft(h2, 2) == [50, 51]


def test_draft_length_grows_on_kept_guesses_and_stops_when_they_do_not_pay():
    dl = DraftLength(8)
    for _ in range(20):
        dl.observe_step(1, 0.010)
        for k in range(2, 10):
            dl.observe_step(k, 0.010 + 0.001 * k)
        dl.observe(8, 8)
    assert dl.next() == 8
    dl = DraftLength(8)
    for _ in range(20):
        dl.observe_step(1, 0.010)
        for k in range(2, 10):
            dl.observe_step(k, 0.010 * k)       # every row costs a full step: never pays
        dl.observe(4, 0)
    assert dl.next() == 0
    # a pause, then a probe with 2 guesses
    ks = [dl.next() for _ in range(dl.pause)]
    assert set(ks[:-1]) == {0} and ks[-1] == 1


# ---- greedy: identical ids ------------------------------------------------------------------------

def _greedy_pairs(model, prompts, **kw):
    for p in prompts:
        model.reset()
        plain = model.generate(p, max_tokens=40, temperature=0, ignore_eos=True,
                               speculative="off", **kw)
        model.reset()
        spec = model.generate(p, max_tokens=40, temperature=0, ignore_eos=True,
                              speculative="prompt-lookup", **kw)
        yield p, plain, spec


def test_greedy_prompt_lookup_gives_the_plain_ids(tiny, pinned):
    drafted = 0
    for p, plain, spec in _greedy_pairs(tiny, REPEATS):
        assert spec.token_ids == plain.token_ids and spec.text == plain.text, p
        assert plain.speculative is None and spec.speculative.drafter == "prompt-lookup"
        drafted += spec.speculative.drafted
        assert spec.speculative.accepted <= spec.speculative.drafted
    assert drafted > 0          # the repetitive prompts made guesses to check


@pytest.mark.parametrize("kw", [dict(repetition_penalty=1.3, logprobs=True, top_logprobs=2),
                                dict(stop=["e"]), dict(frequency_penalty=0.5, presence_penalty=0.3)])
def test_greedy_with_penalties_logprobs_and_stops_is_unchanged(tiny, kw, pinned):
    for p, plain, spec in _greedy_pairs(tiny, REPEATS[:3], **kw):
        assert spec.token_ids == plain.token_ids and spec.text == plain.text
        assert spec.finish_reason == plain.finish_reason
        if plain.logprobs is not None:
            assert [(lp.token_id, lp.logprob, lp.top) for lp in spec.logprobs] == \
                [(lp.token_id, lp.logprob, lp.top) for lp in plain.logprobs]


def test_a_copying_model_takes_the_guesses(tiny, pinned):
    """A prompt that repeats a line the model then repeats: most guesses are kept."""
    tiny.reset()
    prompt = list(range(65, 91)) * 3
    # logit_bias makes the model copy the alphabet: the guesses (the next letters) are kept
    bias = {i: 30.0 for i in range(65, 91)}
    plain = tiny.generate(prompt, max_tokens=30, temperature=0, logit_bias=bias, speculative="off")
    spec = tiny.generate(prompt, max_tokens=30, temperature=0, logit_bias=bias,
                         speculative="prompt-lookup")
    assert spec.token_ids == plain.token_ids
    st = spec.speculative
    assert st.drafted > 0 and st.steps < len(spec.token_ids) - 1


def test_draft_model_of_the_same_weights_keeps_every_guess(tiny_chat_dir, pinned):
    """The target as its own draft: every guess is its argmax, so every one is kept; the draft's
    KV cache follows the text (a lost sync would make guesses wrong)."""
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1,
                   speculative=f"draft:{tiny_chat_dir}")
    try:
        for p in REPEATS[:4]:
            m.reset()
            # no repetition penalty (the tiny model's default 1.05): the draft guesses raw argmaxes
            kw = dict(max_tokens=30, temperature=0, ignore_eos=True, repetition_penalty=1.0)
            plain = m.generate(p, speculative="off", **kw)
            spec = m.generate(p, **kw)
            assert spec.token_ids == plain.token_ids
            st = spec.speculative
            assert st.drafted > 0 and st.accepted == st.drafted
        assert m.speculative_stats.drafted > 0
    finally:
        m._draft.files.weights.close()
        m.weights.close()


def test_draft_model_with_other_weights_gives_the_plain_ids(tiny_chat_dir, other_chat_dir, pinned):
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1,
                   speculative=f"draft:{other_chat_dir}")
    try:
        rejected = 0
        for p in REPEATS:
            m.reset()
            plain = m.generate(p, max_tokens=30, temperature=0, ignore_eos=True, speculative="off")
            spec = m.generate(p, max_tokens=30, temperature=0, ignore_eos=True)
            assert spec.token_ids == plain.token_ids, p
            rejected += spec.speculative.drafted - spec.speculative.accepted
        assert rejected > 0          # rollbacks happened, of the target and of the draft
    finally:
        m._draft.files.weights.close()
        m.weights.close()


def test_continuous_batching_with_speculation_equals_plain_alone(tiny, tiny_chat_dir, pinned):
    jobs = [(p, dict(max_tokens=30, temperature=0, ignore_eos=True)) for p in REPEATS] + \
        [(p, dict(max_tokens=20, temperature=0.8, top_k=20, seed=5, ignore_eos=True))
         for p in REPEATS[:2]]
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1, parallel=3,
                   speculative="prompt-lookup")
    try:
        want = []
        for p, kw in jobs[:len(REPEATS)]:
            tiny.reset()
            want.append(tiny.generate(p, speculative="off", **kw).token_ids)
        out: dict[int, list[int]] = {}
        errors: list[BaseException] = []

        def work(i):
            try:
                out[i] = m.generate(jobs[i][0], **jobs[i][1]).token_ids
            except BaseException as e:    # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for i, w in enumerate(want):
            assert out[i] == w, REPEATS[i]
        assert m.speculative_stats.drafted > 0
    finally:
        m.close()
        m.weights.close()


def test_continuous_batching_with_a_draft_model(tiny, tiny_chat_dir, other_chat_dir, pinned):
    """parallel=3 with a draft model: each slot has its draft slot; concurrent greedy streams
    equal plain decoding alone."""
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1, parallel=3,
                   speculative=f"draft:{other_chat_dir}")
    try:
        assert m._draft.engine.n_seq == 3
        kw = dict(max_tokens=30, temperature=0, ignore_eos=True)
        want = []
        for p in REPEATS:
            tiny.reset()
            want.append(tiny.generate(p, speculative="off", **kw).token_ids)
        out: dict[int, list[int]] = {}

        def work(i):
            out[i] = m.generate(REPEATS[i], **kw).token_ids
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(REPEATS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [out.get(i) for i in range(len(REPEATS))] == want
        assert m.speculative_stats.drafted > 0
    finally:
        m.close()
        m._draft.files.weights.close()
        m.weights.close()


def test_gemma3_sliding_window_rings_roll_back_exactly(tmp_path, pinned):
    """A Gemma 3 whose sliding layers keep a ring of window + max_batch_tokens positions: rolling
    back rejected guesses (at most one step's worth) never overwrites a row the window still
    reads, so speculative greedy ids equal plain ones, on rings wrapped many times."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_models_gemma3 import _hf_model
    from ignis.loader.resolve import open_dir
    from ignis.runtime import Engine
    from ignis.tokenizer import load_tokenizer
    from tiny_models import TOKENIZER_DATA
    model = _hf_model("gemma3-mixed")
    model.save_pretrained(tmp_path / "g")
    files = open_dir(tmp_path / "g", name="g")
    tok = load_tokenizer({"tokenizer.json": json.loads((TOKENIZER_DATA / "tiny-tokenizer.json").read_text()),
                          "tokenizer_config.json": json.loads(
                              (TOKENIZER_DATA / "tiny-tokenizer_config.json").read_text())})
    try:
        vocab = files.config.vocab_size
        params = resolve_params(GenerationConfig(), vocab_size=vocab, temperature=0,
                                max_tokens=40, ignore_eos=True)
        drafted = 0
        for mbt in (4, 8):
            eng = Engine(files, n_ctx=128, max_batch_tokens=mbt)
            assert eng._ring
            for prompt in ([3, 14, 15, 92, 65, 35] * 5, [7, 8, 9] * 8, list(range(10, 40))):
                eng.reset()
                plain = Generation(KVSession(eng), tok, prompt, params, vocab_size=vocab).run()
                eng.reset()
                spec = Generation(KVSession(eng), tok, prompt, params, vocab_size=vocab,
                                  drafter=lambda s: PromptLookup()).run()
                assert spec.token_ids == plain.token_ids, (mbt, prompt)
                drafted += spec.speculative.drafted
        assert drafted > 0
    finally:
        files.weights.close()


# ---- sampled: the target distribution ------------------------------------------------------------

def test_sampled_speculation_follows_the_target_distribution(tiny_chat_dir, other_chat_dir,
                                                             monkeypatch):
    """The second token of a seeded generation (the first the accept/reject rule decides: the
    first comes from the prompt's step; a warm-up generation has measured a plain step, and the
    draft length is pinned, so every run guesses it) is distributed as the model says: the exact
    marginal P(t2) = sum p(t1) p(t2 | t1), computed from the engine's logits through the
    sampler's own processing (top-k, temperature, the repetition penalty), against 3000 draws
    with seeds 0..2999 (fixed: the test is deterministic), by a chi-square goodness-of-fit test.
    A rule that kept guesses too often would put too much mass on the draft model's favourites
    and fail it (checked by hand with a rule biased towards the guess)."""
    from ignis.generate import speculative
    from ignis.generate.sampler import Sampler
    monkeypatch.setattr(speculative.DraftLength, "next", lambda self: 3)
    m = ignis.load(str(tiny_chat_dir), n_ctx=64, threads=1, speculative=f"draft:{other_chat_dir}")
    try:
        prompt = m.tokenize("x")
        kw = dict(max_tokens=3, temperature=2.0, top_k=5, ignore_eos=True)
        params = m.sampling_params(**kw)
        vocab = m.config.vocab_size
        eng = m.engine

        def dist(before: list[int]) -> np.ndarray:
            s = Sampler(params, vocab, valid=m._valid, prompt_ids=prompt)
            for t in before:
                s.accept(t)
            eng.reset()
            return s.distribution(s.process(eng.forward(np.array(prompt + before))[0]))

        exact = np.zeros(vocab)
        p1 = dist([])
        for t1 in np.flatnonzero(p1):
            exact += p1[t1] * dist([int(t1)])
        m.generate(prompt, seed=0, **kw)         # warm-up: measures a plain step
        counts = np.zeros(vocab)
        kept = drafted = 0
        for seed in range(3000):
            r = m.generate(prompt, seed=seed, **kw)
            counts[r.token_ids[1]] += 1
            assert r.speculative.verify_steps == 1
            kept += r.speculative.accepted
            drafted += r.speculative.drafted
        assert 0 < kept < drafted                         # guesses kept, and some rejected
        support = exact > 0
        assert counts[~support].sum() == 0
        # pool the rare categories so every expected count is at least 5
        exp = exact[support] * counts.sum()
        obs = counts[support]
        order = np.argsort(exp)
        small = order[np.cumsum(exp[order]) < 5]
        if small.size:
            exp = np.append(np.delete(exp, small), exp[small].sum())
            obs = np.append(np.delete(obs, small), obs[small].sum())
        chi2, pvalue = _chisquare(obs, exp)
        print(f"\nchi-square {chi2:.1f} over {obs.size} categories: p = {pvalue:.3f}; "
              f"guesses kept {kept}/{drafted}")
        assert pvalue > 0.001, (chi2, pvalue, obs, exp)
        # reproducible: the same seed gives the same ids
        a = m.generate(prompt, seed=11, max_tokens=20, temperature=0.9, ignore_eos=True)
        b = m.generate(prompt, seed=11, max_tokens=20, temperature=0.9, ignore_eos=True)
        assert a.token_ids == b.token_ids
    finally:
        m._draft.files.weights.close()
        m.weights.close()


def test_the_accept_rule_draws_from_the_target_row(tiny):
    """accept_draft on one row of the model's logits, a guess of middling, top and zero
    probability, 4000 seeds each: the tokens follow the sampler's distribution (chi-square)."""
    from ignis.generate.sampler import Sampler
    from ignis.generate.speculative import accept_draft
    prompt = tiny.tokenize("hello world")
    tiny.engine.reset()
    row = tiny.engine.forward(np.array(prompt))[0]
    params = tiny.sampling_params(temperature=1.5, top_k=8, repetition_penalty=1.0)
    vocab = tiny.config.vocab_size
    target = Sampler(params, vocab, valid=tiny._valid).distribution(
        Sampler(params, vocab, valid=tiny._valid).process(row))
    order = np.argsort(-target)
    for guess in (int(order[2]), int(order[0]), int(np.argmin(target))):
        counts = np.zeros(vocab)
        for seed in range(4000):
            s = Sampler(dataclasses.replace(params, seed=seed), vocab, valid=tiny._valid)
            token, _ = accept_draft(s, row, guess)
            counts[token] += 1
        support = target > 0
        assert counts[~support].sum() == 0
        chi2, pvalue = _chisquare(counts[support], target[support] * 4000)
        assert pvalue > 0.001, (guess, chi2, counts[support], target[support] * 4000)


def _chisquare(obs: np.ndarray, exp: np.ndarray) -> tuple[float, float]:
    """Pearson's statistic and its upper-tail p-value (Wilson-Hilferty's normal approximation of
    the chi-square distribution, within 1e-3 of the exact tail for df >= 3)."""
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    df = obs.size - 1
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return chi2, 0.5 * math.erfc(z / math.sqrt(2))


# ---- bad requests ----------------------------------------------------------------------------------

def test_bad_speculative_requests_are_refused_by_name(tiny, tiny_chat_dir, tmp_path):
    with pytest.raises(SpeculativeError, match="unknown speculative drafter 'ngram'"):
        ignis.load(str(tiny_chat_dir), speculative="ngram")
    with pytest.raises(SpeculativeError, match="unknown speculative drafter"):
        tiny.generate("hi", speculative="lookahead")
    with pytest.raises(SpeculativeError, match="was loaded with no draft model") as ei:
        tiny.generate("hi", speculative="draft:qwen2.5-coder-0.5b-instruct")
    assert ei.value.code == "draft_not_loaded"
    with pytest.raises(SpeculativeError, match="n=2") as ei:
        tiny.generate("hi", n=2, speculative="prompt-lookup")
    assert ei.value.code == "unsupported_parameter"
    # the draft model's vocabulary must be the target's: one token's text changed
    other = tmp_path / "other-vocab"
    shutil.copytree(tiny_chat_dir, other)
    tj = json.loads((other / "tokenizer.json").read_text("utf-8"))
    vocab = tj["model"]["vocab"]
    a, b = sorted(k for k, v in vocab.items() if v in (65, 66))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tj), "utf-8")
    with pytest.raises(SpeculativeError, match="another vocabulary") as ei:
        ignis.load(str(tiny_chat_dir), speculative=f"draft:{other}")
    assert ei.value.code == "vocabulary_mismatch"


def test_n_choices_run_without_the_models_default_speculation(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=128, threads=1, speculative="prompt-lookup")
    try:
        rs = m.generate("abc abc abc", n=2, max_tokens=8, temperature=0.7, seed=1)
        assert len(rs) == 2 and all(r.speculative is None for r in rs)
    finally:
        m.weights.close()


# ---- the API: extra_body, usage, /health, the CLI --------------------------------------------------

def test_client_takes_speculative_in_extra_body_and_reports_it_in_usage(tiny):
    client = ignis.Client([tiny])
    msgs = [{"role": "user", "content": "abc abc abc abc abc abc abc"}]
    kw = dict(model=tiny.name, messages=msgs, max_tokens=24, temperature=0)
    plain = client.chat.completions.create(**kw, extra_body={"speculative": "off"})
    spec = client.chat.completions.create(**kw, extra_body={"speculative": "prompt-lookup",
                                                            "ignore_eos": False})
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None
    d = spec.usage.completion_tokens_details
    assert set(d) == {"accepted_prediction_tokens", "rejected_prediction_tokens"}
    with pytest.raises(Exception, match="unknown speculative drafter") as ei:
        client.chat.completions.create(**kw, extra_body={"speculative": "eagle"})
    assert getattr(ei.value, "status_code", 400) == 400


def test_server_health_and_cli_flags(tiny_chat_dir, tmp_path):
    from test_server import Server, _get
    s = Server(tiny_chat_dir, tmp_path / "serve.log", "--speculative", "prompt-lookup")
    try:
        api = s.client()
        r = api.completions.create(model="tiny-chat", prompt="abc abc abc abc abc", max_tokens=20,
                                   temperature=0)
        assert r.usage.completion_tokens_details is not None
        status, health = _get(s.port, "/health")
        assert status == 200 and health["speculative"]["default"] == "prompt-lookup"
        assert health["speculative"]["steps"] > 0
        import openai
        with pytest.raises(openai.BadRequestError, match="unknown speculative drafter") as ei:
            api.completions.create(model="tiny-chat", prompt="x", max_tokens=2,
                                   extra_body={"speculative": "nope"})
        assert ei.value.body["param"] == "speculative"
        with pytest.raises(openai.BadRequestError, match="n=2"):
            api.completions.create(model="tiny-chat", prompt="x", max_tokens=2, n=2,
                                   extra_body={"speculative": "prompt-lookup"})
    finally:
        s.stop()


def test_cli_run_speculative_verbose(tiny_chat_dir):
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "ignis", "run", str(tiny_chat_dir), "abc abc abc abc", "--raw",
           "--temperature", "0", "--max-tokens", "12", "-q", "--verbose"]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    spec = subprocess.run(cmd + ["--speculative", "prompt-lookup"], capture_output=True, text=True,
                          timeout=120)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert "speculative:      prompt-lookup:" in spec.stderr and "speedup" in spec.stderr
    bad = subprocess.run(cmd[:-1] + ["--speculative", "draft:"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "names no draft model" in bad.stderr


# ---- real registry models (slow: marked `model`) ---------------------------------------------------

CODE_EDIT = ("Rewrite this function with the variable `total` renamed to `amount`. Output only the "
             "code.\n\n```python\ndef checkout(cart, tax):\n    total = 0\n    for item in cart:\n"
             "        total += item.price * item.count\n    total = total * (1 + tax)\n"
             "    if total > 100:\n        total -= 5\n    return round(total, 2)\n```")


def _check_real(m, prompts, *, chat: bool, max_tokens: int = 48) -> int:
    drafted = 0
    for p in prompts:
        for spec in ("prompt-lookup",):
            m.reset()
            run = (lambda **kw: m.chat([{"role": "user", "content": p}], **kw)) if chat else \
                (lambda **kw: m.generate(p, **kw))
            plain = run(max_tokens=max_tokens, temperature=0, speculative="off")
            got = run(max_tokens=max_tokens, temperature=0, speculative=spec)
            assert got.token_ids == plain.token_ids, (p if isinstance(p, str) else p[:8], spec)
            drafted += got.speculative.drafted
    return drafted


@pytest.mark.model
@pytest.mark.slow
def test_default_model_reference_prompts_and_a_code_edit(default_model_dir, pinned):
    """The reference prompts (tests/data/reference, made with transformers) and a code edit on
    qwen2.5-coder-0.5b-instruct: speculative greedy ids equal plain ones."""
    from pathlib import Path
    ref = json.loads((Path(__file__).parent / "data" / "reference" /
                      "qwen2.5-coder-0.5b-instruct.logits.json").read_text("utf-8"))
    m = ignis.load(str(default_model_dir), n_ctx=1024, progress=False)
    try:
        drafted = _check_real(m, [p["ids"] for p in ref["prompts"]], chat=False, max_tokens=32)
        drafted += _check_real(m, [CODE_EDIT], chat=True, max_tokens=96)
        assert drafted > 0
    finally:
        m.weights.close()


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_prompt_lookup(tmp_path_factory, pinned):
    from test_gguf_blocks import SMOLLM2_PROMPTS, smollm2_dir   # noqa: F401  (the fixture)
    import os
    from ignis.loader import registry
    from real_models import require_model_packages
    require_model_packages(registry.REGISTRY["smollm2-135m-instruct"])
    home = tmp_path_factory.mktemp("ignis-home-smollm2-spec")
    old = os.environ.get("IGNIS_HOME")
    os.environ["IGNIS_HOME"] = str(home)
    try:
        path = registry.pull("smollm2-135m-instruct", progress=False)
        m = ignis.load(str(path), n_ctx=1024, progress=False)
        try:
            assert _check_real(m, SMOLLM2_PROMPTS + [CODE_EDIT], chat=False, max_tokens=48) > 0
        finally:
            m.weights.close()
    finally:
        os.environ.pop("IGNIS_HOME") if old is None else os.environ.__setitem__("IGNIS_HOME", old)
        shutil.rmtree(home, ignore_errors=True)
