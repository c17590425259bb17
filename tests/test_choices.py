"""n > 1 choices (OpenAI's `n`) on the tiny chat model: through Model.generate/chat, ignis.Client and
`ignis serve` with the official client. Choice i of a request seeded s is the n=1 answer seeded
s + i; usage counts the prompt once and every choice's completion tokens; streams carry each
choice's index; a model with several KV slots runs choices at once and gives the same answers."""
from __future__ import annotations

import json

import pytest

import ignis
from ignis.api.client import BadRequestError
from ignis.api.model import MAX_CHOICES, choice_seed

from test_tools import ASK, SCHEMAS, TIME, WEATHER, tool_model_dir, valid

USER = [{"role": "user", "content": "Say hi."}]
SAMPLED = dict(temperature=2.0, max_tokens=12, seed=7)


@pytest.fixture(scope="module")
def model_dir(tiny_chat_dir, tmp_path_factory):
    return tool_model_dir(tiny_chat_dir, tmp_path_factory.mktemp("choices") / "tiny-choices")


@pytest.fixture(scope="module")
def model(model_dir):
    m = ignis.load(str(model_dir), n_ctx=2048, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def wide(model_dir):
    """The same model with 3 KV slots: choices run at once, their steps batched."""
    m = ignis.load(str(model_dir), n_ctx=2048, threads=1, parallel=3)
    yield m
    m.close()
    m.weights.close()


@pytest.fixture(scope="module")
def client(model, wide):
    return ignis.Client({"one": model, "wide": wide})


def _one(client, name, seed, **kw):
    return client.chat.completions.create(model=name, messages=USER, n=1,
                                          **{**SAMPLED, **kw, "seed": seed}).choices[0]


@pytest.mark.parametrize("name", ["one", "wide"])
def test_choice_i_is_the_n1_answer_seeded_seed_plus_i(client, name):
    r = client.chat.completions.create(model=name, messages=USER, n=4, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1                       # sampled: the choices differ
    for i, c in enumerate(r.choices):
        alone = _one(client, "one", SAMPLED["seed"] + i)
        assert (c.message.content, c.finish_reason) == (alone.message.content, alone.finish_reason)
    one = client.chat.completions.create(model=name, messages=USER, **SAMPLED)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens          # the prompt counted once
    assert r.usage.completion_tokens == sum(
        client.chat.completions.create(model="one", messages=USER,
                                       **{**SAMPLED, "seed": SAMPLED["seed"] + i}).usage.completion_tokens
        for i in range(4))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_choice_seeds_wrap_at_2_64(client):
    assert choice_seed(2 ** 64 - 1, 1) == 0 and choice_seed(-1, 0) == 2 ** 64 - 1
    assert choice_seed(None, 3) is None
    r = client.chat.completions.create(model="one", messages=USER, n=2,
                                       **{**SAMPLED, "seed": 2 ** 64 - 1})
    assert r.choices[1].message.content == _one(client, "one", 0).message.content


def test_greedy_choices_are_identical(client):
    r = client.chat.completions.create(model="wide", messages=USER, n=3, temperature=0,
                                       max_tokens=10)
    assert len({c.message.content for c in r.choices}) == 1


@pytest.mark.parametrize("name", ["one", "wide"])
def test_streamed_choices_carry_their_index(client, name):
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk
    # the prompt is cached first, so that both answers' usage counts it cached, whatever ran before
    client.chat.completions.create(model=name, messages=USER, n=3, **SAMPLED)
    whole = client.chat.completions.create(model=name, messages=USER, n=3, **SAMPLED)
    state = ChatCompletionStreamState()
    finished, usage = [], None
    for chunk in client.chat.completions.create(model=name, messages=USER, n=3, stream=True,
                                                stream_options={"include_usage": True}, **SAMPLED):
        for d in chunk.choices:
            if d.finish_reason is not None:
                finished.append(d.index)
        usage = chunk.usage or usage
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk.model_dump()))
    final = state.current_completion_snapshot      # (get_final_completion refuses "length")
    assert sorted(finished) == [0, 1, 2]
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == \
        [(c.index, c.message.content, c.finish_reason) for c in whole.choices]
    assert usage.model_dump() == whole.usage.model_dump()


def test_completions_index_prompts_then_choices(client, model):
    r = client.completions.create(model="wide", prompt=["Once", "The sky"], n=2, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(["Once", "The sky"]):
        for j in range(2):
            alone = client.completions.create(model="one", prompt=prompt,
                                              **{**SAMPLED, "seed": SAMPLED["seed"] + j})
            assert r.choices[p * 2 + j].text == alone.choices[0].text
    texts = {}
    for chunk in client.completions.create(model="wide", prompt="Once", n=2, stream=True, **SAMPLED):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[0], texts[1]] == [r.choices[0].text, r.choices[1].text]


def test_model_generate_and_chat_take_n(model, wide):
    rs = wide.generate("Once", n=3, **SAMPLED)
    assert [r.text for r in rs] == [model.generate("Once", **{**SAMPLED, "seed": 7 + i}).text
                                    for i in range(3)]
    rs = model.chat(USER, n=2, **SAMPLED)
    assert [r.text for r in rs] == [model.chat(USER, **{**SAMPLED, "seed": 7 + i}).text
                                    for i in range(2)]
    pieces: dict[int, str] = {}
    for i, text in wide.chat(USER, n=2, stream=True, **SAMPLED):
        pieces[i] = pieces.get(i, "") + text
    assert [pieces.get(0, ""), pieces.get(1, "")] == [r.text for r in rs]


def test_closing_a_stream_of_choices_frees_every_slot(client, wide):
    stream = client.chat.completions.create(model="wide", messages=USER, n=5, stream=True,
                                            temperature=1.0, max_tokens=200, seed=1)
    next(iter(stream))
    next(iter(stream))
    stream.close()
    assert wide._free == set(range(wide.parallel)) and not wide._owners


def test_a_constraint_object_with_n_is_refused(model):
    """A TokenConstraint holds one answer's state: generate(n > 1) refuses one by name, as chat
    does (it was called as start_choices' per-choice factory: a TypeError)."""
    from ignis.generate import InvalidParameterError
    c = model.constraint(guided_choice=["yes", "no"])
    for call in (lambda: model.generate("Hi", n=2, constraint=c, max_tokens=4),
                 lambda: model.chat(USER, n=2, constraint=c, max_tokens=4)):
        with pytest.raises(InvalidParameterError, match="constraint"):
            call()


def test_a_cancelled_request_of_choices_stops_at_once_and_frees_every_slot(wide):
    """Choices running at once on their threads whose request is cancelled (the server's
    cancel_when, when a client of a non-streamed request hangs up) stop at the next item, though
    their threads keep the queue full, and free their slots."""
    import threading
    from ignis.generate import GenerationCancelled, cancel_when
    gone = threading.Event()
    prompt = wide.chat_prompt_ids(USER)
    with cancel_when(gone):
        choices = wide.start_choices(prompt, 3, temperature=1.0, max_tokens=1500, seed=1,
                                     ignore_eos=True)
        it = iter(choices)
        for _ in range(30):
            next(it)
        gone.set()
        with pytest.raises(GenerationCancelled):
            next(it)
    assert wide._free == set(range(wide.parallel)) and not wide._owners


@pytest.mark.parametrize("name", ["one", "wide"])
def test_each_choice_has_its_own_tool_calls(client, name):
    r = client.chat.completions.create(model=name, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", n=3, max_tokens=300,
                                       temperature=1.2, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        for call in c.message.tool_calls:
            valid(call)
            assert call.function.name in SCHEMAS
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y", "z"]}}, "required": ["a"],
              "additionalProperties": False}
    r = client.chat.completions.create(
        model=name, messages=USER, n=3, max_tokens=100, temperature=0.7, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                                "strict": True}})
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        assert json.loads(c.message.content)["a"] in "xyz"


def test_the_most_choices(client):
    """n = MAX_CHOICES runs (choices are made as they start, so their samplers are not all held
    at once)."""
    r = client.chat.completions.create(model="wide", messages=USER, n=MAX_CHOICES, max_tokens=1,
                                       temperature=1.0, seed=0)
    assert [c.index for c in r.choices] == list(range(MAX_CHOICES))
    assert r.usage.completion_tokens == MAX_CHOICES


@pytest.mark.parametrize("n,code", [(0, "invalid_value"), (MAX_CHOICES + 1, "invalid_value"),
                                    ("2", "invalid_type"), (True, "invalid_type"),
                                    (2.0, "invalid_type")])
def test_n_out_of_bounds_is_a_400_naming_n(client, model, n, code):
    before = model._session.forwarded
    for create in (lambda: client.chat.completions.create(model="one", messages=USER, n=n),
                   lambda: client.completions.create(model="one", prompt="x", n=n)):
        with pytest.raises(BadRequestError) as e:
            create()
        assert e.value.param == "n" and e.value.code == code
    with pytest.raises(ignis.InvalidParameterError):
        model.generate("x", n=n)
    assert model._session.forwarded == before


def test_n_through_ignis_serve(model_dir, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(model_dir, tmp_path / "server.log", "--ctx", "2048", "--parallel", "2")
    try:
        api = s.client()
        r = api.chat.completions.create(model=model_dir.name, messages=USER, n=3, **SAMPLED)
        assert [c.index for c in r.choices] == [0, 1, 2]
        for i, c in enumerate(r.choices):
            alone = api.chat.completions.create(model=model_dir.name, messages=USER,
                                                **{**SAMPLED, "seed": 7 + i})
            assert c.message.content == alone.choices[0].message.content
        texts = {}
        for chunk in api.chat.completions.create(model=model_dir.name, messages=USER, n=3,
                                                 stream=True, **SAMPLED):
            for d in chunk.choices:
                texts[d.index] = texts.get(d.index, "") + (d.delta.content or "")
        assert [texts[i] for i in range(3)] == [c.message.content for c in r.choices]
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=model_dir.name, messages=USER, n=MAX_CHOICES + 1)
        assert e.value.body["param"] == "n"
    finally:
        s.stop()


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_the_prompt_is_run_once_and_copied_to_the_other_slots(model_dir, kv_dtype):
    """n=4 on 4 KV slots: the prompt runs once (all but its last token, on one slot), the other
    slots get a copy of its keys and values (Engine.copy_slot), and each choice runs the last
    prompt token and its own tokens: the engine sees P - 1 + 4 prompt rows, not 4 P. The answers
    are the n=1 answers of a one-slot model, token for token; usage counts the prompt once and
    (choice 0's) nothing as cached the first time; a second request reuses what the slots hold."""
    alone = ignis.load(str(model_dir), n_ctx=2048, threads=1, kv_dtype=kv_dtype)
    wide = ignis.load(str(model_dir), n_ctx=2048, threads=1, parallel=4, kv_dtype=kv_dtype)
    try:
        assert wide.kv_dtype == alone.kv_dtype == kv_dtype
        prompt = wide.tokenize("Once upon a time there was a tiny model that " * 6)
        stats = wide._scheduler.stats
        rs = wide.generate(prompt, n=4, **SAMPLED)
        decode_rows = sum(r.completion_tokens - 1 for r in rs)   # the last sampled id never runs
        assert stats.rows - decode_rows == len(prompt) - 1 + 4
        assert [r.token_ids for r in rs] == [alone.generate(prompt, **{**SAMPLED, "seed": 7 + i})
                                             .token_ids for i in range(4)]
        assert [r.prompt_tokens for r in rs] == [len(prompt)] * 4
        assert rs[0].cached_tokens == 0          # what usage reports: the copy is not a cache hit
        assert len({tuple(r.token_ids) for r in rs}) > 1
        before = stats.rows
        again = wide.generate(prompt, n=4, **SAMPLED)
        assert [r.token_ids for r in again] == [r.token_ids for r in rs]
        # the slot holding the longest prefix runs one token of it again, the others copy it
        assert stats.rows - before - decode_rows == 1 + 4
        assert all(r.cached_tokens >= len(prompt) - 1 for r in again)
        assert wide._free == set(range(4)) and not wide._owners
    finally:
        wide.close()
        wide.weights.close()
        alone.weights.close()
