"""Structured outputs: response_format (json_object, json_schema) and vLLM's guided_choice /
guided_regex / guided_grammar by constrained decoding, checked against references nobody here
wrote: every answer parses with `json` and validates with the `jsonschema` package (formats
included), regex answers match Python's `re`. The tiny random model's outputs are random, which is
what stresses the mask: any id the mask wrongly allows is soon chosen. Also the typed 400s for
malformed and unsupported requests, batched slots with a grammar each, and the official client's
parse() against ignis.Client and `ignis serve`."""
from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ignis
from ignis.api.client import BadRequestError, LengthFinishReasonError
from structured_schemas import SCHEMAS, UNSUPPORTED

jsonschema = pytest.importorskip("jsonschema", reason="the reference validator (in the test extras)")
pytest.importorskip("llguidance", reason="constrained decoding needs pip install 'ignis[structured]'")

N_CTX = 512
PROMPT = [{"role": "user", "content": "Answer in JSON."}]
# greedy, and sampled at a high temperature (the random model then wanders across the mask)
MODES = {"greedy": dict(temperature=0), "seed0": dict(temperature=1.5, seed=0),
         "seed1": dict(temperature=1.5, seed=1)}


def check(text: str, schema: dict) -> object:
    """The answer read by json and validated by jsonschema, with its format checkers."""
    value = json.loads(text)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    errors = list(jsonschema.Draft202012Validator(schema, format_checker=checker).iter_errors(value))
    # RFC 3339's full-date allows year 0000; Python's datetime (jsonschema's date checker) has no
    # year 0: that one disagreement is checked by the RFC's own grammar instead
    errors = [e for e in errors if not (e.validator == "format" and e.validator_value == "date"
                                        and re.fullmatch(r"0000-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", e.instance))]
    assert not errors, f"{text!r}: {errors[0].message}"
    return value


def rf(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def client(model):
    return ignis.Client([model])


def test_the_corpus_covers_the_features():
    assert len(SCHEMAS) >= 30
    text = json.dumps(SCHEMAS)
    for word in ("minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "minimum",
                 "maximum", "exclusiveMinimum", '"integer"', '"boolean"', '"null"', "required",
                 '"additionalProperties": false', "pattern", "format", "$defs", "$ref"):
        assert word in text, word


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SCHEMAS)
def test_every_answer_validates(client, model, name, mode):
    schema = SCHEMAS[name]
    kw = dict(model=model.name, messages=PROMPT, max_tokens=400, response_format=rf(schema),
              **MODES[mode])
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    value = check(choice.message.content, schema)
    # streamed: the same answer in pieces
    pieces, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == choice.message.content and finish == "stop"
    assert json.loads("".join(pieces)) == value


@pytest.mark.parametrize("mode", MODES)
def test_json_object_is_any_json_object(model, mode):
    r = model.chat(PROMPT, max_tokens=400, response_format={"type": "json_object"},
                   **MODES[mode])
    # an object with no schema may grow until the context ends: a complete one parses, a cut one
    # is a prefix of an object
    if r.finish_reason == "stop":
        assert isinstance(json.loads(r.text), dict)
    else:
        assert r.finish_reason == "length" and r.text.startswith("{")


def test_max_tokens_cuts_the_answer_with_length(model):
    r = model.chat(PROMPT, max_tokens=3, temperature=0, response_format=rf(SCHEMAS["flat_object"]))
    assert r.finish_reason == "length" and r.completion_tokens == 3
    assert r.text.startswith('{"')


def test_the_answer_ends_when_the_grammar_is_complete(model):
    """No end-of-sequence step is needed: the answer stops at the grammar's end, "stop"."""
    r = model.generate("x", max_tokens=50, temperature=0, guided_choice=["alpha", "beta"])
    assert r.finish_reason == "stop" and r.text in ("alpha", "beta")
    assert model.tokenizer.decode(r.token_ids) == r.text


def test_a_grammar_complete_on_the_last_allowed_token_is_stop(model):
    r = model.generate("x", max_tokens=2, temperature=0, guided_choice=["ab"])   # two byte tokens
    assert (r.text, r.finish_reason, r.completion_tokens) == ("ab", "stop", 2)
    r = model.generate("x", max_tokens=1, temperature=0, guided_choice=["ab"])
    assert (r.text, r.finish_reason) == ("a", "length")


@pytest.mark.parametrize("seed", range(4))
def test_guided_choice_regex_and_grammar(client, model, seed):
    kw = dict(model=model.name, messages=PROMPT, max_tokens=60, temperature=1.5, seed=seed)
    choices = ["yes", "no", "maybe later", "日本"]
    r = client.chat.completions.create(extra_body={"guided_choice": choices}, **kw)
    assert r.choices[0].message.content in choices and r.choices[0].finish_reason == "stop"
    pattern = r"[a-c]{2,4}-\d{1,3}(\.[xyz])?"
    r = client.chat.completions.create(extra_body={"guided_regex": pattern}, **kw)
    assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
    lark = 'start: "(" item ("," item)* ")"\nitem: /[0-9]/ | "x"\n'
    r = client.chat.completions.create(extra_body={"guided_grammar": lark}, **kw)
    assert re.fullmatch(r"\((\d|x)(,(\d|x))*\)", r.choices[0].message.content) or \
        r.choices[0].finish_reason == "length"
    gbnf = 'root ::= "say " word\nword ::= "hi" | "bye"\n'
    r = client.chat.completions.create(extra_body={"guided_grammar": gbnf}, **kw)
    assert r.choices[0].message.content in ("say hi", "say bye")
    r = client.chat.completions.create(extra_body={"guided_json": SCHEMAS["defs_ref"]}, **kw)
    check(r.choices[0].message.content, SCHEMAS["defs_ref"])


@pytest.mark.parametrize("seed", range(3))
def test_a_lark_grammar_embedding_a_schema(model, seed):
    """The shape a tool call takes (free markup around JSON arguments): lark_json's rule inside a
    larger grammar, through the same hook (Model.constraint / start(constraint=...))."""
    from ignis.generate.constrain import GrammarSpec, lark_json
    schema = SCHEMAS["pydantic_like"]
    lark = ('start: "<tool_call>\\n{\\"name\\": \\"plan\\", \\"arguments\\": " args "}\\n</tool_call>"\n'
            "args: " + lark_json(schema) + "\n")
    con = model.constraint(GrammarSpec("grammar", lark, "tools"))
    run = model.start(model.chat_prompt_ids(PROMPT), max_tokens=300, temperature=1.5, seed=seed,
                      constraint=con)
    for _ in run:
        pass
    text = run.result.text
    assert run.result.finish_reason == "stop"
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text[len("<tool_call>\n"):-len("\n</tool_call>")])
    assert call["name"] == "plan"
    check(json.dumps(call["arguments"]), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_take_response_format(client, model, stream):
    schema = SCHEMAS["nested_object"]
    kw = dict(model=model.name, prompt="JSON:", max_tokens=200, temperature=1.5, seed=3,
              extra_body={"response_format": rf(schema)})
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)
                       if c.choices)
    else:
        r = client.completions.create(**kw)
        text = r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
    check(text, schema)


def test_batched_slots_each_follow_their_own_grammar(tiny_chat_dir):
    """Two generations at once in one batched engine, each with its own schema, equal to the
    same generations run alone (greedy: the mask must not leak between slots)."""
    m = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1, parallel=2)
    alone = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1)
    try:
        names = ["defs_ref", "array_of_objects", "oneof_disjoint", "format_uuid"]
        want = {n: alone.chat(PROMPT, max_tokens=300, temperature=0,
                              response_format=rf(SCHEMAS[n])).text for n in names}
        got: dict[str, str] = {}

        def run(n: str) -> None:
            got[n] = m.chat(PROMPT, max_tokens=300, temperature=0, response_format=rf(SCHEMAS[n])).text
        threads = [threading.Thread(target=run, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == want
        for n in names:
            check(got[n], SCHEMAS[n])
        assert m._scheduler.stats.mean_batch > 1
    finally:
        m.close()
        m.weights.close()
        alone.weights.close()


# ---- bad requests: typed 400s, nothing generated ---------------------------------------------------

BAD = [
    ("json", "response_format", "invalid_type"),
    ({"type": "yaml"}, "response_format.type", "invalid_value"),
    ({"type": 3}, "response_format.type", "invalid_type"),
    ({"type": "json_object", "schema": {}}, "response_format.schema", "unknown_parameter"),
    ({"type": "json_schema"}, "response_format.json_schema", "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": []}, "response_format.json_schema", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name",
     "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
     "response_format.json_schema.name", "invalid_value"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema",
     "missing_required_parameter"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}},
     "response_format.json_schema.schema", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
     "response_format.json_schema.schema", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict", "invalid_type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "schema_": 1}},
     "response_format.json_schema.schema_", "unknown_parameter"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
     "response_format.json_schema.schema", "unsupported_schema"),
]


@pytest.mark.parametrize("fmt,param,code", BAD, ids=[b[1] + "-" + b[2] for b in BAD])
def test_malformed_response_formats_are_400s(client, model, fmt, param, code):
    before = model._session.forwarded
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=PROMPT, response_format=fmt)
    assert (e.value.param, e.value.code) == (param, code), e.value.body["message"]
    assert model._session.forwarded == before


@pytest.mark.parametrize("keyword", UNSUPPORTED)
def test_unsupported_keywords_are_400s_naming_them(client, model, keyword):
    before = model._session.forwarded
    for call in (lambda: client.chat.completions.create(
                     model=model.name, messages=PROMPT, response_format=rf(UNSUPPORTED[keyword])),
                 lambda: model.chat(PROMPT, response_format=rf(UNSUPPORTED[keyword]))):
        with pytest.raises((BadRequestError, ignis.InvalidParameterError)) as e:
            call()
        assert e.value.code == "unsupported_schema" and f'"{keyword}"' in str(e.value)
        assert e.value.param == "response_format.json_schema.schema"
    assert model._session.forwarded == before


def test_a_schema_cannot_ask_the_engine_to_ignore_keywords(client, model):
    """llguidance reads options from a schema's "x-guidance"; lenient (skip what it cannot
    enforce) would make an unconstrained answer, so ignis overrides it."""
    schema = {**UNSUPPORTED["uniqueItems"], "x-guidance": {"lenient": True}}
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=PROMPT, response_format=rf(schema))
    assert e.value.code == "unsupported_schema" and "uniqueItems" in e.value.body["message"]


BAD_GUIDED = [
    ({"guided_choice": []}, "guided_choice", "invalid_value"),
    ({"guided_choice": "yes"}, "guided_choice", "invalid_type"),
    ({"guided_choice": ["a", 1]}, "guided_choice", "invalid_type"),
    ({"guided_choice": ["a", ""]}, "guided_choice", "invalid_value"),
    ({"guided_regex": "([a-z"}, "guided_regex", "invalid_grammar"),
    ({"guided_regex": 5}, "guided_regex", "invalid_type"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "invalid_grammar"),
    ({"guided_grammar": ""}, "guided_grammar", "invalid_value"),
    ({"guided_json": "{not json"}, "guided_json", "invalid_value"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex", "invalid_value"),
]


@pytest.mark.parametrize("extra,param,code", BAD_GUIDED, ids=[str(b[0])[:40] for b in BAD_GUIDED])
def test_bad_guided_fields_are_400s(client, model, extra, param, code):
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=PROMPT, extra_body=extra)
    assert (e.value.param, e.value.code) == (param, code), e.value.body["message"]


def test_response_format_with_a_guided_field_is_a_400(client, model):
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=PROMPT,
                                       response_format={"type": "json_object"},
                                       extra_body={"guided_choice": ["a"]})
    assert e.value.param == "guided_choice"


def test_without_the_extra_a_constrained_request_is_a_400_naming_it(client, model, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)       # import llguidance fails
    for call in (lambda: client.chat.completions.create(model=model.name, messages=PROMPT,
                                                        response_format={"type": "json_object"}),
                 lambda: client.completions.create(model=model.name, prompt="x",
                                                   extra_body={"guided_regex": "a+"})):
        with pytest.raises(BadRequestError) as e:
            call()
        assert e.value.code == "missing_extra" and "ignis[structured]" in e.value.body["message"]
    # a plain request still works
    assert client.chat.completions.create(model=model.name, messages=PROMPT, max_tokens=2).choices


# ---- parse(): pydantic models -------------------------------------------------------------------

pydantic = pytest.importorskip("pydantic")


class Step(pydantic.BaseModel):
    n: int = pydantic.Field(ge=0, le=9)
    op: str = pydantic.Field(pattern="^(add|sub)$")


class Plan(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=5)
    steps: list[Step] = pydantic.Field(max_length=2)
    done: bool


def test_client_parse_with_a_pydantic_model(client, model):
    for seed in range(3):
        r = client.chat.completions.parse(model=model.name, messages=PROMPT, response_format=Plan,
                                          max_tokens=300, temperature=1.5, seed=seed)
        msg = r.choices[0].message
        assert isinstance(msg.parsed, Plan) and Plan.model_validate_json(msg.content) == msg.parsed
        assert json.loads(r.model_dump_json())["choices"][0]["message"]["parsed"] == \
            json.loads(msg.content)
    with pytest.raises(LengthFinishReasonError):
        client.chat.completions.parse(model=model.name, messages=PROMPT, response_format=Plan,
                                      max_tokens=2)
    # Model.chat takes the class too
    r = model.chat(PROMPT, max_tokens=300, temperature=1.5, seed=7, response_format=Plan)
    assert r.finish_reason == "stop" and isinstance(Plan.model_validate_json(r.text), Plan)
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.parse(model=model.name, messages=PROMPT, response_format=int)
    assert e.value.param == "response_format"


def test_the_official_client_parse_against_ignis_serve(tiny_chat_dir, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(tiny_chat_dir, tmp_path / "server.log")
    try:
        api = s.client()
        for seed in range(2):
            r = api.chat.completions.parse(model=tiny_chat_dir.name, messages=PROMPT,
                                           response_format=Plan, max_tokens=300, temperature=1.5,
                                           seed=seed)
            assert isinstance(r.choices[0].message.parsed, Plan)
        # streamed over SSE, and the completions endpoint with response_format at the top level
        schema = SCHEMAS["array_of_objects"]
        text = "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(
            model=tiny_chat_dir.name, messages=PROMPT, max_tokens=300, temperature=1.5, seed=5,
            response_format=rf(schema), stream=True) if c.choices)
        check(text, schema)
        r = api.completions.create(model=tiny_chat_dir.name, prompt="JSON:", max_tokens=300,
                                   extra_body={"response_format": rf(schema)}, temperature=0)
        check(r.choices[0].text, schema)
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=tiny_chat_dir.name, messages=PROMPT,
                                        response_format=rf(UNSUPPORTED["uniqueItems"]))
        assert e.value.status_code == 400 and "uniqueItems" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=tiny_chat_dir.name, messages=PROMPT,
                                        extra_body={"guided_choice": []})
        assert e.value.param == "guided_choice"
    finally:
        s.stop()


# ---- the real default model ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def real(default_model_files):
    from ignis.api.model import Model
    m = Model(default_model_files, n_ctx=1024, weight_format="f32")
    yield m


@pytest.mark.model
@pytest.mark.slow
def test_real_model_answers_sensible_json(real):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                               "population_millions": {"type": "number"}},
              "required": ["city", "country", "population_millions"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]
    r = real.chat(msgs, max_tokens=60, temperature=0, response_format=rf(schema))
    value = check(r.text, schema)
    assert r.finish_reason == "stop" and value["city"] == "Paris" and value["country"] == "France"
    pieces = "".join(real.chat(msgs, max_tokens=60, temperature=0, response_format=rf(schema),
                               stream=True))
    assert pieces == r.text


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["nested_object", "array_of_objects", "oneof_disjoint", "defs_ref",
                                  "format_date", "pydantic_like"])
def test_real_model_follows_the_corpus(real, name):
    msgs = [{"role": "user", "content": "Write an example JSON value."}]
    for kw in (dict(temperature=0), dict(temperature=0.8, seed=1)):
        r = real.chat(msgs, max_tokens=200, response_format=rf(SCHEMAS[name]), **kw)
        assert r.finish_reason == "stop"
        check(r.text, SCHEMAS[name])


@pytest.mark.model
@pytest.mark.slow
def test_real_model_json_object_and_choice(real):
    r = real.chat([{"role": "user", "content": "Describe a cat as a JSON object with name and age."}],
                  max_tokens=80, temperature=0, response_format={"type": "json_object"})
    assert r.finish_reason == "stop" and isinstance(json.loads(r.text), dict)
    r = real.chat([{"role": "user", "content": "Is the sky blue? Answer yes or no."}], max_tokens=5,
                  temperature=0, guided_choice=["yes", "no"])
    assert r.text == "yes"


# ---- a SentencePiece vocabulary ------------------------------------------------------------------

@pytest.fixture(scope="module")
def spm_model(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with a Llama-2-layout SentencePiece tokenizer (byte-fallback tokens <0xNN>,
    ▁ for spaces): the grammar engine reads each id's bytes as the decoder makes them."""
    pytest.importorskip("tokenizers")
    import shutil
    from test_tokenizer_spm import tiny_spm_files
    d = tmp_path_factory.mktemp("spm") / "tiny-llama-spm"
    shutil.copytree(tiny_llama_dir, d)
    for name, content in tiny_spm_files().items():
        (d / name).write_text(json.dumps(content), encoding="utf-8")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2)
    (d / "config.json").write_text(json.dumps(cfg))
    m = ignis.load(str(d), n_ctx=N_CTX, threads=1, progress=False)
    yield m
    m.weights.close()


@pytest.mark.parametrize("name", ["nested_object", "string_unicode_enum", "format_email", "min_length",
                                  "array_of_objects", "pattern"])
def test_sentencepiece_vocabulary(spm_model, name):
    schema = SCHEMAS[name]
    for kw in (dict(temperature=0), dict(temperature=1.5, seed=0), dict(temperature=1.5, seed=1)):
        r = spm_model.generate("ab ba", max_tokens=300, response_format=rf(schema), **kw)
        assert r.finish_reason == "stop"
        check(r.text, schema)
        assert spm_model.tokenizer.decode(r.token_ids, skip_special_tokens=True) == r.text
    r = spm_model.generate("ab", max_tokens=30, temperature=1.5, seed=2, guided_choice=["ab ba", "é你"])
    assert r.text in ("ab ba", "é你")


def test_ignis_run_json_flags(tiny_chat_dir, tmp_path, capsys):
    from ignis.api.cli import main
    schema = SCHEMAS["defs_ref"]
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["run", str(tiny_chat_dir), "hi", "-q", "--temperature", "0", "--max-tokens", "200",
                 "--json-schema", str(path)]) == 0
    check(capsys.readouterr().out.strip(), schema)
    assert main(["run", str(tiny_chat_dir), "hi", "-q", "--json-schema",
                 json.dumps(UNSUPPORTED["uniqueItems"])]) == 1
    assert "uniqueItems" in capsys.readouterr().err
    assert main(["run", str(tiny_chat_dir), "hi", "-q", "--json-schema", str(tmp_path / "none")]) == 1
    assert "--json-schema" in capsys.readouterr().err


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 151_936, 262_144])
def test_mask_logits_writes_minus_infinity_exactly_where_the_bitmask_says_no(n):
    """_core.mask_logits (the sampler's one pass over llguidance's bitmask) against numpy's
    unpackbits of the same words: -inf on every id whose bit is 0, the rest untouched."""
    from ignis import _core
    rng = np.random.default_rng(n)
    words = rng.integers(0, 2**32, (n + 31) // 32, dtype=np.uint64).astype(np.uint32)
    words[::3], words[1::5] = 0xFFFFFFFF, 0
    x = rng.standard_normal(n)
    ok = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
    y = x.copy()
    assert _core.mask_logits(y, words, n) == ok.sum()
    assert np.array_equal(np.isneginf(y), ~ok) and np.array_equal(y[ok], x[ok])
    with pytest.raises(ValueError, match="words"):
        _core.mask_logits(y, words[:-1], n)
