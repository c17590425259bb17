"""Tool calls: the parser (whole answers and streams, Hermes and Llama 3 JSON), the grammar that
forces calls (arguments validated by jsonschema), the Client and `ignis serve` with the official
openai client's stream accumulation, rendering checked against transformers, and bad requests.
The slow tests run the real default model."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

import ignis
from ignis.api.client import BadRequestError
from ignis.generate.tools import HERMES, LLAMA3_JSON, ToolCallParser, parse_tool_calls, tool_format

jsonschema = pytest.importorskip("jsonschema", reason="the reference validator (in the test extras)")
pytest.importorskip("llguidance", reason="constrained decoding needs pip install 'ignis[structured]'")

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER_PARAMS = {"type": "object",
                  "properties": {"city": {"type": "string"},
                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string"},
                                                "hour24": {"type": "boolean"}},
               "required": ["zone"]}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def valid(call: dict) -> dict:
    """A call's arguments read and validated against its function's schema."""
    assert call["type"] == "function" and call["id"].startswith("call_")
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, SCHEMAS[call["function"]["name"]])
    return args


# ---- the parser ------------------------------------------------------------------------------------

HERMES_TEXT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris", '
               '"unit": "celsius", "x": [1,{"a":"}"}]}}\n</tool_call>\n<tool_call>\n'
               '{"name": "get_time", "arguments": {}}\n</tool_call>')


def stream(parser: ToolCallParser, text: str, rng: random.Random) -> list:
    events, at = [], 0
    while at < len(text):
        n = rng.randint(1, 6)
        events += parser.feed(text[at:at + n])
        at += n
    return events + parser.finish()


def accumulate(events: list) -> tuple[str | None, list[tuple[str, str]]]:
    """What a client rebuilds from the events: content, and (name, arguments) per index."""
    content, calls = "", {}
    for e in events:
        if e.kind == "content":
            content += e.text
        elif e.kind == "call":
            assert e.index not in calls          # name and id once, in the first event of a call
            calls[e.index] = [e.name, ""]
        else:
            calls[e.index][1] += e.text
    return content or None, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_a_stream_in_any_pieces_rebuilds_the_whole_answer(live, seed):
    content, calls = parse_tool_calls(HERMES_TEXT, HERMES)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": 'Pa"ris', "unit": "celsius", "x": [1, {"a": "}"}]}),
        ("get_time", {})]
    assert calls[0].arguments == '{"city": "Pa\\"ris", "unit": "celsius", "x": [1,{"a":"}"}]}'
    p = ToolCallParser(HERMES, live=live)
    events = stream(p, HERMES_TEXT, random.Random(seed))
    assert accumulate(events) == (content, [(c.name, c.arguments) for c in calls])
    assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in calls]
    if live:       # the name goes out before the arguments are complete
        first_args = next(i for i, e in enumerate(events) if e.kind == "arguments")
        assert events[first_args - 1].kind == "call" and events[first_args].text != calls[0].arguments


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',     # bad JSON
    '<tool_call>\n{"arguments": {}}\n</tool_call>',                                   # no name
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',                     # not an object
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}, "extra": 2}\n</tool_call>',
    'text <tool_call>\n{"name": "f", "arguments": {"a": 1}',                          # cut short
    'just words',
])
def test_text_that_is_no_call_stays_content(text):
    content, calls = parse_tool_calls(text, HERMES)
    assert calls == [] and content == text
    assert accumulate(stream(ToolCallParser(HERMES), text, random.Random(0))) == (text, [])


def test_a_call_without_its_closing_tag_and_string_arguments():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', HERMES)
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
                                HERMES)
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]


def test_parallel_false_keeps_the_first_call():
    content, calls = parse_tool_calls(HERMES_TEXT, HERMES, parallel=False)
    assert content == "Let me look." and [c.name for c in calls] == ["get_weather"]
    p = ToolCallParser(HERMES, parallel=False)
    assert [n for n, _ in accumulate(stream(p, HERMES_TEXT, random.Random(1)))[1]] == ["get_weather"]


@pytest.mark.parametrize("text,want", [
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
     [("get_weather", '{"city": "Oslo"}')]),
    ('  {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1, 2]}}',
     [("a", "{}"), ("b", '{"x": [1, 2]}')]),
])
@pytest.mark.parametrize("live", [False, True])
def test_llama3_json_calls(text, want, live):
    content, calls = parse_tool_calls(text, LLAMA3_JSON)
    assert content is None and [(c.name, c.arguments) for c in calls] == want
    p = ToolCallParser(LLAMA3_JSON, live=live)
    assert accumulate(stream(p, text, random.Random(2))) == (None, want)


BARE = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'


@pytest.mark.parametrize("text,names,calls", [
    (BARE, ["get_weather"], [("get_weather", '{"city": "Paris"}')]),
    (BARE.replace("```json\n", "```\n"), ["get_weather"], [("get_weather", '{"city": "Paris"}')]),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', ["get_weather"],
     [("get_weather", '{"city": "Oslo"}')]),
    (BARE, ["get_time"], []),                      # not an offered function: the text it is
    (BARE, [], []),
    (BARE + " and then some", ["get_weather"], []),
    ("```python\nprint({'name': 1})\n```", ["get_weather"], []),
    ('{"name": "get_weather", "city": "Paris"}', ["get_weather"], []),
])
def test_bare_calls_of_offered_functions(text, names, calls):
    """Qwen2.5-Coder answers a call as a fenced JSON object instead of <tool_call> (vLLM issue
    #32926): read as a call when the answer is only that and names an offered function."""
    want = (None if calls else text, calls)
    content, got = parse_tool_calls(text, HERMES, names=names)
    assert (content, [(c.name, c.arguments) for c in got]) == want
    for seed in range(3):
        p = ToolCallParser(HERMES, names=names)
        assert accumulate(stream(p, text, random.Random(seed))) == want


def test_other_answers_are_not_held_back():
    p = ToolCallParser(HERMES, names=["get_weather"])
    assert [e.text for e in p.feed("```python\n")] == ["```python"]
    assert [e.text for e in p.feed("Hello")] == ["\nHello"]


@pytest.mark.parametrize("text", ['{"name": "a", "parameters": {}} and more', "Hello {", "{oops"])
def test_llama3_text_that_is_no_call_stays_content(text):
    assert parse_tool_calls(text, LLAMA3_JSON) == (text, [])


def test_the_format_comes_from_the_template(tiny_chat_dir):
    qwen25 = json.loads((tiny_chat_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert tool_format(qwen25) is HERMES
    assert tool_format((TEMPLATES / "qwen3.jinja").read_text()) is HERMES
    assert tool_format((TEMPLATES / "llama3.2.jinja").read_text()) is LLAMA3_JSON
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None


# ---- the tiny model through the Client and ignis serve --------------------------------------------

def tool_model_dir(src: Path, dst: Path, template: str | None = None, **tokens: str) -> Path:
    """The tiny chat model with room for a tools prompt (the byte-level tiny tokenizer makes it
    ~700 tokens), optionally another chat template."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["max_position_embeddings"] = 4096
    (dst / "config.json").write_text(json.dumps(cfg))
    if template is not None or tokens:
        tc = json.loads((dst / "tokenizer_config.json").read_text())
        if template is not None:
            tc["chat_template"] = template
        tc.update(tokens)
        (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    return dst


@pytest.fixture(scope="module")
def tools_dir(tiny_chat_dir, tmp_path_factory):
    return tool_model_dir(tiny_chat_dir, tmp_path_factory.mktemp("tools") / "tiny-tools")


@pytest.fixture(scope="module")
def model(tools_dir):
    m = ignis.load(str(tools_dir), n_ctx=2048, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def client(model):
    return ignis.Client([model])


NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("seed", range(3))
def test_required_and_named_calls_validate(client, model, seed):
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=300, temperature=1.2,
                                       seed=seed)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        valid(call)
        assert call.function.name in SCHEMAS          # attribute access, as the official client
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=NAMED, parallel_tool_calls=False,
                                       max_tokens=300, temperature=1.2, seed=seed)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_time"
    valid(calls[0])


@pytest.mark.parametrize("choice,reason", [("required", "tool_calls"), (NAMED, "stop")])
def test_finish_reason_of_forced_calls_is_openais(client, model, choice, reason):
    """OpenAI ends an answer forced to a named function with "stop", and one forced by
    "required" (or chosen under "auto") with "tool_calls" (vLLM matched it in its PR 25054, from
    OpenAI's answers), streamed or not."""
    kw = dict(model=model.name, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
              max_tokens=300, temperature=1.2, seed=5)
    r = client.chat.completions.create(**kw).choices[0]
    assert r.message.tool_calls and r.finish_reason == reason
    last = [d.finish_reason for ch in client.chat.completions.create(stream=True, **kw)
            for d in ch.choices if d.finish_reason is not None]
    assert last == [reason]


def test_streamed_calls_accumulate_to_the_answer(client, model):
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk
    kw = dict(model=model.name, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
              max_tokens=300, temperature=1.2, seed=11)
    whole = client.chat.completions.create(**kw).choices[0]
    state = ChatCompletionStreamState()
    firsts = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        data = chunk.model_dump()
        for d in data["choices"]:
            for tc in d["delta"]["tool_calls"] or ():
                if "id" in tc:      # id, type and name once, with empty arguments
                    assert tc["type"] == "function" and tc["function"]["arguments"] == ""
                    firsts.append(tc["index"])
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
        state.handle_chunk(ChatCompletionChunk.model_validate(data))
    final = state.get_final_completion().choices[0]
    assert firsts == list(range(len(whole.message.tool_calls)))
    assert final.finish_reason == "tool_calls" and final.message.content is None
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_auto_reads_what_the_model_wrote(client, model):
    for seed in range(3):
        r = client.chat.completions.create(model=model.name, messages=ASK, tools=[WEATHER],
                                           max_tokens=40, temperature=1.0, seed=seed)
        raw = model.chat(ASK, tools=[WEATHER], max_tokens=40, temperature=1.0, seed=seed).text
        msg = r.choices[0].message
        content, calls = parse_tool_calls(raw, HERMES, names=["get_weather"])
        assert msg.content == content
        assert [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()] == \
            [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("seed", range(3))
def test_auto_holds_a_begun_call_to_the_grammar(model, seed):
    """tool_choice "auto": free text until the model writes <tool_call>, then only a valid call
    (driven here by random logits under the mask: the tiny model seldom begins a call itself)."""
    import numpy as np
    from ignis.generate.tools import check_tools
    con = model.tool_constraint(check_tools([WEATHER, TIME], "auto", False))
    prefix = model.tokenize("Sure. <tool_call>", add_special_tokens=False)
    rng = np.random.default_rng(seed)
    # closing marks drawn more often, so that strings and objects end within the test's steps
    closers = [t for c in '"}]' for t in model.tokenize(c, add_special_tokens=False)]
    free = np.zeros(model.config.vocab_size)
    con.mask(free)
    assert np.isfinite(free).all()                 # before the call: nothing is masked
    ids = list(prefix)
    for t in prefix:
        con.accept(t)
    while not con.finished and len(ids) < 400:
        logits = rng.normal(size=model.config.vocab_size)
        logits[~model._valid] = -np.inf
        logits[closers] += 2.0
        con.mask(logits)
        t = int(np.argmax(logits))
        if t in model.eos_token_ids:
            break
        con.accept(t)
        ids.append(t)
    content, calls = parse_tool_calls(model.detokenize(ids, skip_special_tokens=True), HERMES)
    assert content == "Sure." and len(calls) == 1
    valid(calls[0].to_openai())


def test_none_leaves_the_tools_out(client, model):
    plain = model.chat_prompt_ids(ASK)
    assert model.chat_prompt_ids(ASK, tools=[WEATHER]) != plain
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=[WEATHER],
                                       tool_choice="none", max_tokens=5, temperature=0)
    assert r.usage.prompt_tokens == len(plain) and r.choices[0].message.tool_calls is None


def test_a_tool_round_trip_renders_as_transformers_does(model):
    """An assistant message with tool_calls and the tool's answer, rendered through the
    template: the same text as transformers' apply_chat_template."""
    transformers = pytest.importorskip("transformers")
    from ignis.api.client import _messages
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model.path / "tokenizer.json"))
    hf_msgs = json.loads(json.dumps(msgs))
    hf_msgs[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": "celsius"}
    for template in (model.tokenizer.chat_template, (TEMPLATES / "qwen3.jinja").read_text()):
        want = hf.apply_chat_template(hf_msgs, tools=[WEATHER], tokenize=False,
                                      add_generation_prompt=True, chat_template=template)
        got = model.tokenizer.apply_chat_template(_messages(msgs), tools=[WEATHER],
                                                  add_generation_prompt=True,
                                                  chat_template=template)
        assert got == want and "<tool_response>\n{\"temp\": 21}\n</tool_response>" in got
    ids = model.chat_prompt_ids(_messages(msgs), tools=[WEATHER])
    r = ignis.Client([model]).chat.completions.create(model=model.name, messages=msgs,
                                                      tools=[WEATHER], max_tokens=3, temperature=0)
    assert r.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("kw,param", [
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name"),
    (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[{"type": "retrieval"}]), "tools.[0].type"),
    (dict(tools=["get_weather"]), "tools.[0]"),
    (dict(tools=[{"type": "function", "function": {"description": "x"}}]), "tools.[0].function.name"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
     "tools.[0].function.parameters"),
    (dict(tools=[WEATHER, WEATHER]), "tools.[1].function.name"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)],
          tool_choice="required"), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "description": "x" * 70000}}}]), "tools.[0].function.parameters"),
    (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice"),
    (dict(tools=[WEATHER], extra_body={"chat_template_kwargs": {"tools": []}}),
     "chat_template_kwargs.tools"),
    (dict(extra_body={"chat_template_kwargs": {"enable_thinking": "no"}}),
     "chat_template_kwargs.enable_thinking"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client, model, kw, param):
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=ASK, max_tokens=3, **kw)
    assert e.value.param == param and e.value.status_code == 400


def test_the_tools_limit_is_openais(model, monkeypatch):
    """128 tools pass the check, 129 are refused before any grammar is compiled."""
    from ignis.generate.tools import check_tools
    many = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]
    assert len(check_tools(many[:128], "required").tools) == 128

    def compile(*a, **k):
        raise AssertionError("a grammar was compiled for a request that is refused")
    monkeypatch.setattr(model.constrainer, "compile", compile)
    with pytest.raises(ignis.InvalidParameterError) as e:
        model.chat(ASK, tools=many, tool_choice="required", max_tokens=1)
    assert e.value.param == "tools"


def test_a_schema_the_engine_cannot_enforce(client, model):
    """required: a 400 naming the keyword (never an unconstrained call); auto: answered, the
    calls only read."""
    tool = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=ASK, tools=[tool],
                                       tool_choice="required", max_tokens=3)
    assert "uniqueItems" in e.value.body["message"] and e.value.param == "tools"
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=[tool], max_tokens=3)
    assert r.choices[0].finish_reason == "length"


def test_a_template_without_tools_is_a_400(tiny_chat_dir, tmp_path):
    d = tool_model_dir(tiny_chat_dir, tmp_path / "no-tools",
                       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                       "{% endfor %}<|im_start|>assistant\n")
    m = ignis.load(str(d), n_ctx=512, threads=1)
    try:
        with pytest.raises(BadRequestError) as e:
            ignis.Client([m]).chat.completions.create(model=m.name, messages=ASK, tools=[WEATHER])
        assert e.value.param == "tools" and "does not render tool" in e.value.body["message"]
        r = ignis.Client([m]).chat.completions.create(model=m.name, messages=ASK, tools=[WEATHER],
                                                      tool_choice="none", max_tokens=2)
        assert r.choices[0].message.tool_calls is None
    finally:
        m.weights.close()


def test_llama3_template_constrained_calls(tiny_chat_dir, tmp_path):
    """The Llama 3.2 template (its published text, tests/data/templates/llama3.2.jinja, from
    meta-llama/Llama-3.2-1B-Instruct's tokenizer_config.json) on the tiny model: its JSON call
    syntax forced by the grammar and read back, streamed and not."""
    d = tool_model_dir(tiny_chat_dir, tmp_path / "llama-tpl", (TEMPLATES / "llama3.2.jinja").read_text(),
                       bos_token="<|endoftext|>")
    m = ignis.load(str(d), n_ctx=2048, threads=1)
    try:
        assert m.tool_format is LLAMA3_JSON
        c = ignis.Client([m])
        kw = dict(model=m.name, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                  parallel_tool_calls=False, max_tokens=200, temperature=1.2, seed=3)
        r = c.chat.completions.create(**kw)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        valid(calls[0])
        args = "".join(tc.function.arguments for ch in c.chat.completions.create(stream=True, **kw)
                       for d_ in ch.choices for tc in d_.delta.tool_calls or ())
        assert args == calls[0].function.arguments
    finally:
        m.weights.close()


def test_the_official_client_against_ignis_serve(tools_dir, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(tools_dir, tmp_path / "server.log", "--ctx", "2048")
    try:
        api = s.client()
        kw = dict(model=tools_dir.name, messages=ASK, tools=[WEATHER, TIME], max_tokens=300,
                  temperature=1.2, seed=4, tool_choice={"type": "function",
                                                         "function": {"name": "get_weather"}})
        whole = api.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "stop"        # a named function: OpenAI's "stop"
        valid(whole.message.tool_calls[0].model_dump())
        with api.chat.completions.stream(**kw) as st:
            for _ in st:
                pass
            final = st.get_final_completion().choices[0]
        assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=tools_dir.name, messages=ASK, tools=[WEATHER],
                                        tool_choice={"type": "function", "function": {"name": "x"}})
        assert e.value.body["param"] == "tool_choice.function.name"
        # the template's variables, as vLLM takes them (this template has no enable_thinking)
        r = api.chat.completions.create(model=tools_dir.name, messages=ASK, max_tokens=2,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].message.content is not None
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model=tools_dir.name, messages=ASK, max_tokens=2,
                                        extra_body={"chat_template_kwargs": {"messages": []}})
        assert e.value.body["param"] == "chat_template_kwargs.messages"
    finally:
        s.stop()


# ---- the real default model ----------------------------------------------------------------------

REAL_ASK = [{"role": "system", "content": "You are a helpful assistant. When a tool result is given, "
                                         "answer the user in one sentence using it."},
            {"role": "user", "content": "What's the weather like in Paris right now, in celsius?"}]


@pytest.fixture(scope="module")
def real(default_model_files):
    from ignis.api.model import Model
    return Model(default_model_files, n_ctx=2048, weight_format="f32")


def _agent_loop(create, name: str, stream_create=None) -> None:
    """required, named, auto, then the tool's answer sent back and a final answer in words."""
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}, "auto"):
        r = create(model=name, messages=REAL_ASK, tools=[WEATHER, TIME], tool_choice=choice,
                   max_tokens=80, temperature=0)
        msg = r.choices[0].message
        # a named function ends with "stop", as OpenAI's answers do
        assert r.choices[0].finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls"), \
            (choice, msg)
        call = msg.tool_calls[0]
        call = call if isinstance(call, dict) else call.model_dump()
        args = valid(call)
        assert call["function"]["name"] == "get_weather" and "paris" in args["city"].lower()
    history = REAL_ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"],
                           "content": json.dumps({"temperature": 21, "unit": "celsius",
                                                  "sky": "sunny"})}]
    # the final answer in words: with "auto" this 0.5B model calls the tool again, so the last
    # step leaves the tools out, as an agent does to end its loop (the result is still read
    # from the rendered tool message)
    r = create(model=name, messages=history, tools=[WEATHER, TIME], tool_choice="none",
               max_tokens=60, temperature=0)
    final = r.choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert "21" in final.message.content


@pytest.mark.model
@pytest.mark.slow
def test_real_model_agent_loop_through_the_client(real):
    c = ignis.Client([real])
    _agent_loop(c.chat.completions.create, real.name)
    kw = dict(model=real.name, messages=REAL_ASK, tools=[WEATHER, TIME], tool_choice="required",
              max_tokens=80, temperature=0)
    whole = c.chat.completions.create(**kw).choices[0].message.tool_calls
    args = "".join(tc.function.arguments for ch in c.chat.completions.create(stream=True, **kw)
                   for d in ch.choices for tc in d.delta.tool_calls or ())
    assert args == whole[0].function.arguments


@pytest.mark.model
@pytest.mark.slow
def test_real_model_agent_loop_against_ignis_serve(default_model_dir, tmp_path):
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(default_model_dir, tmp_path / "server.log", "--ctx", "2048", "--weights", "f32")
    try:
        api = s.client()
        name = default_model_dir.name
        _agent_loop(api.chat.completions.create, name)
        for choice in ("auto", "required"):
            kw = dict(model=name, messages=REAL_ASK, tools=[WEATHER, TIME], tool_choice=choice,
                      max_tokens=80, temperature=0)
            whole = api.chat.completions.create(**kw).choices[0].message
            with api.chat.completions.stream(**kw) as st:
                for _ in st:
                    pass
                final = st.get_final_completion().choices[0]
            assert final.finish_reason == "tool_calls"
            assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
                [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    finally:
        s.stop()


# ---- auto calls streamed: the wire JSON equals the whole answer ------------------------------------

# guided_choice holds the tiny model to one answer that holds a call, under tool_choice "auto"
# (the auto grammar steps aside for a caller's guided_* field, and the reader still reads calls)
AUTO_CALL = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
             '"unit": "celsius"}}\n</tool_call>')


def test_auto_call_deltas_dump_the_whole_arguments(client, model):
    """Each streamed delta's JSON (model_dump_json, what `ignis serve` sends) accumulates to the
    non-streamed call: a held auto call's arguments arrive in several pieces joined into one
    delta, and every piece must be in its JSON, not only in an attribute."""
    kw = dict(model=model.name, messages=ASK, tools=[WEATHER, TIME], max_tokens=200,
              extra_body={"guided_choice": [AUTO_CALL]})
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Checking."
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert want == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for d in json.loads(chunk.model_dump_json())["choices"]:
            for tc in d["delta"]["tool_calls"] or ():
                c = calls.setdefault(tc["index"], ["", ""])
                c[0] += tc["function"].get("name") or ""
                c[1] += tc["function"]["arguments"]
    assert [tuple(c) for _, c in sorted(calls.items())] == want


def test_auto_call_streamed_over_ignis_serve(tools_dir, tmp_path):
    """The same auto call over `ignis serve`: the openai client's accumulation of the SSE chunks
    equals the non-streamed answer."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(tools_dir, tmp_path / "server.log", "--ctx", "2048")
    try:
        api = s.client()
        kw = dict(model=tools_dir.name, messages=ASK, tools=[WEATHER, TIME], max_tokens=200,
                  extra_body={"guided_choice": [AUTO_CALL]})
        whole = api.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls"
        with api.chat.completions.stream(**kw) as st:
            for _ in st:
                pass
            final = st.get_final_completion().choices[0]
        assert final.message.content == whole.message.content == "Checking."
        assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == \
            [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    finally:
        s.stop()


# ---- the auto constraint: when it arms, compiled once, bounded scanning ---------------------------

def _armed(m, con) -> bool:
    import numpy as np
    logits = np.zeros(m.config.vocab_size)
    con.mask(logits)
    return not np.isfinite(logits).all()


def test_llama3_auto_holds_only_python_tag_calls(tiny_chat_dir, tmp_path):
    """Llama 3 under "auto": an answer that starts with `{` is free (JSON is also a plain
    answer, and is only read); one that starts with <|python_tag|> is held to the grammar."""
    from ignis.generate.tools import check_tools
    d = tool_model_dir(tiny_chat_dir, tmp_path / "llama-auto",
                       (TEMPLATES / "llama3.2.jinja").read_text(), bos_token="<|endoftext|>")
    m = ignis.load(str(d), n_ctx=2048, threads=1)
    try:
        req = check_tools([WEATHER], "auto")
        con = m.chat_constraint(req, m.chat_prompt_ids(ASK, tools=[WEATHER]))
        for t in m.tokenize('{"a": 1', add_special_tokens=False):
            con.accept(t)
        assert not _armed(m, con)
        con = m.chat_constraint(req, m.chat_prompt_ids(ASK, tools=[WEATHER]))
        for t in m.tokenize('<|python_tag|>', add_special_tokens=False):
            con.accept(t)
        assert _armed(m, con)
    finally:
        m.weights.close()


def test_auto_compiles_once_before_decoding(model, monkeypatch):
    """The grammar is compiled when the constraint is made: reaching the trigger compiles
    nothing (an engine error there would escape the decode loop), and the scan keeps only a
    marker's worth of the output, however long the text before the call."""
    from ignis.generate.tools import check_tools
    con = model.chat_constraint(check_tools([WEATHER], "auto"), model.chat_prompt_ids(ASK))

    def compile(*a, **k):
        raise AssertionError("compiled inside the decode loop")
    monkeypatch.setattr(model.constrainer, "compile", compile)
    for t in model.tokenize("words " * 300, add_special_tokens=False):
        con.accept(t)
        assert len(con._tail) < len("<tool_call>")
    for t in model.tokenize("<tool_call>", add_special_tokens=False):
        con.accept(t)
    assert _armed(model, con)


def test_model_chat_refuses_required_with_another_grammar(model):
    """Model.chat follows the Client's rule: a forced call cannot also follow response_format,
    a guided_* field or the caller's constraint (never one of them silently dropped)."""
    from ignis.generate.tools import check_tools
    for extra in ({"response_format": {"type": "json_object"}}, {"guided_regex": "a+"},
                  {"constraint": model.constraint(guided_regex="a+")}):
        with pytest.raises(ignis.InvalidParameterError) as e:
            model.chat(ASK, tools=[WEATHER], tool_choice="required", max_tokens=2, **extra)
        assert e.value.param == "tool_choice"
    # auto steps aside for them: the caller's grammar holds the answer
    r = model.chat(ASK, tools=[WEATHER], max_tokens=8, guided_regex="a{3}")
    assert r.text == "aaa"
    assert model.chat_constraint(check_tools([WEATHER], "auto"), [1], other=True) is None
