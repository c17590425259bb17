"""ignis.load and the Model object on the tiny model through the real Engine: the ModelFiles view,
tokenize/detokenize, chat templates, defaults, KV-prefix reuse across chat turns, stream == generate,
and one check on the real default model."""
from __future__ import annotations

import numpy as np
import pytest

import ignis
from ignis.generate import ContextLengthExceeded, InvalidParameterError, ModelBusyError
from ignis.runtime import Engine

USER = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=160, threads=1)
    yield m
    m.weights.close()


def test_load_returns_a_model_that_still_looks_like_model_files(model):
    assert isinstance(model, ignis.Model)
    assert model.config.vocab_size == 272 and model.generation_config.eos_token_ids == (258, 256)
    assert (model.path / "config.json").is_file() and model.name == "tiny-chat"
    assert "model.embed_tokens.weight" in model.weights
    assert Engine(model, n_ctx=8, threads=1).n_ctx == 8       # Engine takes it as it took ModelFiles


def test_load_refuses_conflicting_formats(tiny_qwen2_dir):
    with pytest.raises(ignis.ConfigError):
        ignis.load(str(tiny_qwen2_dir), weight_format="f32", dtype="q8")


def test_tokenize_detokenize_round_trip(model):
    text = "def f(x):\n    return x[::-1]  # caf\u00e9"
    ids = model.tokenize(text)
    assert model.detokenize(ids) == text


def test_defaults_come_from_generation_config_and_calls_override_them(model):
    p = model.sampling_params()
    assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty) == (0.7, 20, 0.8, 1.05)
    assert p.eos_token_ids == (258, 256)
    q = model.sampling_params(temperature=0.0, top_k=3)
    assert q.greedy and q.top_k == 3 and q.top_p == 0.8


def test_chat_applies_the_template_and_caches_the_prompt(model):
    model.reset()
    want = model.tokenize(model.apply_chat_template(USER), add_special_tokens=False)
    assert want[0] == 257                                     # <|im_start|>
    r = model.chat(USER, max_tokens=5, temperature=0)
    assert r.prompt_tokens == len(want) and r.cached_tokens == 0
    assert model.cached_tokens == want + r.token_ids[:-1]     # the last sampled id is never run


def test_a_second_chat_turn_forwards_only_the_new_tokens(model):
    model.reset()
    first = model.chat(USER, max_tokens=6, temperature=0)
    history = USER + [{"role": "assistant", "content": first.text},
                      {"role": "user", "content": "Again, please."}]
    before = model._session.forwarded
    second = model.chat(history, max_tokens=6, temperature=0)
    forwarded = model._session.forwarded - before
    prompt2 = model.chat_prompt_ids(history)
    # the whole first prompt is shared, so at least that much came from the cache
    assert second.cached_tokens >= first.prompt_tokens
    assert forwarded == (len(prompt2) - second.cached_tokens) + second.completion_tokens - 1
    # ... and reusing it changes nothing: a cold run gives the same tokens
    model.reset()
    cold = model.chat(history, max_tokens=6, temperature=0)
    assert cold.cached_tokens == 0 and cold.token_ids == second.token_ids


def test_stream_pieces_join_to_generate_text(model):
    kw = dict(max_tokens=24, temperature=0.9, seed=5, ignore_eos=True)
    r = model.chat(USER, **kw)
    pieces = list(model.chat(USER, stream=True, **kw))
    assert "".join(pieces) == r.text and all(pieces)
    assert "".join(model.stream("abc", **kw)) == model.generate("abc", **kw).text


def test_logprobs_through_the_model_match_the_engine(model, tiny_qwen2_dir):
    r = model.generate("xyz", max_tokens=3, temperature=0, logprobs=True, top_logprobs=3,
                       ignore_eos=True)
    eng = Engine(model, n_ctx=32, threads=1, weight_format=model.weight_format,
                 kv_dtype=model.kv_dtype)
    logits = eng.forward(np.array(model.tokenize("xyz"), np.int32))[0].astype(np.float64)
    lp = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    assert r.logprobs[0].token_id == r.token_ids[0] == int(np.argmax(lp))
    assert r.logprobs[0].logprob == pytest.approx(lp.max(), abs=1e-9)
    assert [t.token_id for t in r.logprobs[0].top] == list(np.argsort(-lp, kind="stable")[:3])


def test_one_thread_cannot_open_two_streams_on_one_model(model):
    s = model.stream("abc", max_tokens=30, temperature=0, ignore_eos=True)
    next(s)
    with pytest.raises(ModelBusyError):
        model.generate("abc", max_tokens=2)
    s.close()
    assert model.generate("abc", max_tokens=2, temperature=0).completion_tokens == 2


def test_threads_sharing_a_model_take_turns(model):
    import threading
    prompts = ["alpha", "beta gamma", "delta"] * 2
    kw = dict(max_tokens=8, temperature=0, ignore_eos=True)
    want = {p: model.generate(p, **kw).token_ids for p in set(prompts)}
    got: dict[int, list[int]] = {}

    def work(i: int) -> None:
        got[i] = model.generate(prompts[i], **kw).token_ids

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(prompts))] == [want[p] for p in prompts]


def test_bad_calls_are_refused_before_the_engine_runs(model):
    before = model._session.forwarded
    with pytest.raises(InvalidParameterError):
        model.generate("abc", temperature=-1)
    with pytest.raises(InvalidParameterError):
        model.generate("")
    with pytest.raises(InvalidParameterError):
        model.chat([])
    with pytest.raises(InvalidParameterError):
        model.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(ContextLengthExceeded) as e:
        model.generate("a" * 400)
    assert e.value.n_ctx == 160 and e.value.prompt_tokens == len(model.tokenize("a" * 400))
    assert model._session.forwarded == before


@pytest.mark.model
@pytest.mark.slow
def test_default_model_writes_a_python_function(default_model_dir):
    # one thread: on a shared machine OpenMP barriers make 2 threads far slower than 1
    m = ignis.load(str(default_model_dir), weight_format="q8", n_ctx=512, threads=1)
    try:
        r = m.chat([{"role": "user", "content": "Write a Python function that reverses a string."}],
                   max_tokens=48, temperature=0)
    finally:
        m.weights.close()
    assert r.finish_reason in {"stop", "length"}
    assert "def " in r.text and "\ufffd" not in r.text
    assert r.completion_tokens <= 48 and r.prompt_tokens > 20


def test_the_sampling_mask_is_the_tokenizers_vocabulary(model):
    tok = model.tokenizer
    for size in (0, 5, model.config.vocab_size, model.config.vocab_size + 40):
        assert tok.token_mask(size) == [tok.has_token(i) for i in range(size)]
    assert model._valid.tolist() == tok.token_mask(model.config.vocab_size)


def test_runtime_and_generation_errors_are_importable_from_the_top_level(model):
    # A caller catches ignis.ContextLengthExceeded without knowing which layer raises it; the
    # names resolve lazily, so `import ignis` still does not load the C core.
    import subprocess
    import sys
    names = ("RuntimeInputError", "TokenIdError", "ContextOverflowError", "GenerationError",
             "InvalidParameterError", "ContextLengthExceeded", "GenerationCancelled",
             "ModelBusyError")
    probe = (f"import sys, ignis; [getattr(ignis, n) for n in {names!r}]; "
             "assert 'ignis._core' not in sys.modules and 'ignis.runtime' not in sys.modules; "
             "print(ignis.ContextLengthExceeded.__mro__[1].__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "GenerationError"
    for name in ("RuntimeInputError", "TokenIdError", "ContextOverflowError", "GenerationError",
                 "InvalidParameterError", "ContextLengthExceeded", "GenerationCancelled",
                 "ModelBusyError"):
        assert name in ignis.__all__ and issubclass(getattr(ignis, name), ignis.IgnisError)
    with pytest.raises(ignis.InvalidParameterError):
        model.generate("hi", max_tokens=-1)
