"""The Responses API on the tiny chat model: ignis.Client().responses and `POST /v1/responses` on
`ignis serve`, driven by the official openai SDK (its own types validate every object and event):
text and streamed events, a function tool round trip, text.format json_schema, previous_response_id
within the server's memory, and bad requests answered as 400/404 naming the field."""
from __future__ import annotations

import http.client
import json

import pytest

import ignis
from ignis.api.client import BadRequestError, NotFoundError
from ignis.api.responses import ResponseStore, Response

from test_tools import SCHEMAS, WEATHER_PARAMS, jsonschema, tool_model_dir

openai = pytest.importorskip("openai", reason="the Responses API's reference types (test extras)")
from openai.types.responses import Response as SDKResponse, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": WEATHER_PARAMS}
ASK = "What is the weather in Paris?"
ENUM = {"type": "object", "properties": {"a": {"enum": ["x", "y", "z"]}}, "required": ["a"],
        "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir(tiny_chat_dir, tmp_path_factory):
    return tool_model_dir(tiny_chat_dir, tmp_path_factory.mktemp("responses") / "tiny-responses")


@pytest.fixture(scope="module")
def model(model_dir):
    m = ignis.load(str(model_dir), n_ctx=2048, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def client(model):
    return ignis.Client([model])


def _final(events: list) -> dict:
    """Check a stream's events against the SDK's types and their order; the last one's response."""
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for e in events:
        EVENTS.validate_python(e.model_dump())
    return events[-1]["response"]


def _rebuilt(events: list) -> list[dict]:
    """The output items as a client rebuilds them from the deltas alone."""
    items: dict[int, dict] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            items[e["output_index"]] = {"type": e["item"]["type"], "text": "", "arguments": ""}
        elif e["type"] == "response.output_text.delta":
            items[e["output_index"]]["text"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
    return [items[i] for i in sorted(items)]


def test_text_streamed_and_not_agree(client, model):
    kw = dict(model=model.name, input="Say hi.", instructions="Be brief.", max_output_tokens=12,
              temperature=1.0, extra_body={"seed": 5})
    r = client.responses.create(**kw)
    SDKResponse.model_validate(r.model_dump())
    assert r.object == "response" and r.status == "incomplete"
    assert r.incomplete_details == {"reason": "max_output_tokens"}
    assert r.usage["output_tokens"] == 12
    assert r.usage["total_tokens"] == r.usage["input_tokens"] + 12
    chat = client.chat.completions.create(
        model=model.name, max_tokens=12, temperature=1.0, seed=5,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}])
    assert r.output_text == chat.choices[0].message.content      # the same answer as chat's
    assert r.usage["input_tokens"] == chat.usage.prompt_tokens
    events = list(client.responses.create(stream=True, **kw))
    final = _final(events)
    assert [o["content"][0]["text"] for o in final["output"]] == [r.output_text]
    assert [i["text"] for i in _rebuilt(events)] == [r.output_text]
    kinds = [e["type"] for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]


def test_a_function_tool_round_trip(client, model):
    kw = dict(model=model.name, tools=[WEATHER], tool_choice="required", max_output_tokens=300,
              temperature=1.2, extra_body={"seed": 4})
    r = client.responses.create(input=ASK, **kw)
    SDKResponse.model_validate(r.model_dump())
    calls = [o for o in r.output if o["type"] == "function_call"]
    assert calls and r.status == "completed"
    for c in calls:
        assert c["name"] == "get_weather" and c["call_id"].startswith("call_")
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS["get_weather"])
    events = list(client.responses.create(input=ASK, stream=True, **kw))
    final = _final(events)
    assert [(o["name"], o["arguments"]) for o in final["output"]] == \
        [(c["name"], c["arguments"]) for c in calls]
    assert [i["arguments"] for i in _rebuilt(events)] == [c["arguments"] for c in calls]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" in kinds
    # the tool's result, sent back after the call: by previous_response_id and as whole items
    outputs = [{"type": "function_call_output", "call_id": c["call_id"],
                "output": '{"temperature": 21}'} for c in calls]
    follow = dict(model=model.name, tools=[WEATHER], max_output_tokens=8, temperature=0)
    by_id = client.responses.create(input=outputs, previous_response_id=r.id, **follow)
    whole = client.responses.create(input=[{"role": "user", "content": ASK}, *r.output, *outputs],
                                    **follow)
    assert by_id.previous_response_id == r.id
    assert by_id.usage["input_tokens"] == whole.usage["input_tokens"]
    assert by_id.output_text == whole.output_text


def test_a_named_function_and_tool_choice_none(client, model):
    r = client.responses.create(model=model.name, input=ASK, tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=300, temperature=1.2, extra_body={"seed": 2})
    assert [o["type"] for o in r.output] == ["function_call"]
    assert r.tool_choice == {"type": "function", "name": "get_weather"}
    assert r.tools[0]["name"] == "get_weather" and r.tools[0]["type"] == "function"
    r = client.responses.create(model=model.name, input=ASK, tools=[WEATHER], tool_choice="none",
                                max_output_tokens=5, temperature=0)
    assert [o["type"] for o in r.output] == ["message"]


def test_text_format_json_schema(client, model):
    fmt = {"type": "json_schema", "name": "pick", "schema": ENUM, "strict": True}
    r = client.responses.create(model=model.name, input="Pick one.", text={"format": fmt},
                                max_output_tokens=100, temperature=0.7, extra_body={"seed": 1})
    assert r.status == "completed" and r.text == {"format": fmt}
    jsonschema.validate(json.loads(r.output_text), ENUM)


def test_previous_response_id_continues_the_conversation(client, model):
    a = client.responses.create(model=model.name, input="Say hi.", instructions="Be brief.",
                                max_output_tokens=6, temperature=0)
    b = client.responses.create(model=model.name, input="Again.", previous_response_id=a.id,
                                max_output_tokens=6, temperature=0)
    # instructions are not carried over (OpenAI's rule): the same as sending the turns as items
    same = client.responses.create(model=model.name, max_output_tokens=6, temperature=0,
                                   input=[{"role": "user", "content": "Say hi."},
                                          {"role": "assistant", "content": a.output_text},
                                          {"role": "user", "content": "Again."}])
    assert (b.output_text, b.usage["input_tokens"]) == (same.output_text, same.usage["input_tokens"])
    assert client.responses.retrieve(b.id).output_text == b.output_text
    gone = client.responses.create(model=model.name, input="x", store=False, max_output_tokens=2)
    with pytest.raises(NotFoundError) as e:
        client.responses.create(model=model.name, input="y", previous_response_id=gone.id)
    assert e.value.param == "previous_response_id" and e.value.code == "previous_response_not_found"


def test_the_store_is_bounded():
    s = ResponseStore(limit=2)
    for i in range(3):
        s.put(Response(id=f"resp_{i}", output=[]), [])
    assert s.get("resp_0") is None and s.get("resp_1") is not None and s.get("resp_2") is not None


BAD = [
    ({"input": [{"type": "computer_call_output", "call_id": "a"}]}, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": "hi", "colour": 1}]}, "input[0].colour"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].function"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "description": "no name"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools[0].parameters"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": ENUM}}}, "text.format.name"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"background": True}, "background"),
    ({"input": None}, "input"),
    # an output answering no call, a bogus status or effort, include items that are not names
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "input"),
    ({"input": [{"role": "user", "content": "hi", "status": 5}]}, "input[0].status"),
    ({"reasoning": {"effort": "bogus"}}, "reasoning.effort"),
    ({"include": [1, 2]}, "include"),
]


@pytest.mark.parametrize("kw,param", BAD, ids=[p for _, p in BAD])
def test_bad_requests_are_400s_naming_the_field(client, model, kw, param):
    before = model._session.forwarded
    with pytest.raises(BadRequestError) as e:
        client.responses.create(**{"model": model.name, "input": "hi", **kw})
    assert e.value.param == param, e.value.message
    assert model._session.forwarded == before


def test_the_official_sdk_against_ignis_serve(model_dir, tmp_path):
    pytest.importorskip("uvicorn")
    from test_server import Server, _post
    s = Server(model_dir, tmp_path / "server.log", "--ctx", "2048")
    try:
        api = s.client()
        name = model_dir.name
        r = api.responses.create(model=name, input="Say hi.", max_output_tokens=8, temperature=0)
        assert isinstance(r, SDKResponse) and r.output_text
        # cut by max_output_tokens: the stream ends with response.incomplete, as OpenAI's
        # (the SDK's get_final_response() wants response.completed, so read the last event)
        with api.responses.stream(model=name, input="Say hi.", max_output_tokens=8,
                                  temperature=0) as st:
            last = list(st)[-1]
        assert last.type == "response.incomplete" and last.response.output_text == r.output_text
        # a tool round trip as an agent runs it: call, result, answer
        call = api.responses.create(model=name, input=ASK, tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=300, temperature=1.2,
                                    extra_body={"seed": 4}).output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
        with api.responses.stream(model=name, input=ASK, tools=[WEATHER], tool_choice="required",
                                  max_output_tokens=300, temperature=1.2,
                                  extra_body={"seed": 4}) as st:
            events = list(st)
            final = st.get_final_response()
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [e.arguments for e in done] == [call.arguments]
        assert [(o.name, o.arguments) for o in final.output] == [(call.name, call.arguments)]
        answer = api.responses.create(
            model=name, tools=[WEATHER], max_output_tokens=8, temperature=0,
            previous_response_id=events[-1].response.id,
            input=[{"type": "function_call_output", "call_id": final.output[0].call_id,
                    "output": "21 C"}])
        assert answer.status == "incomplete" and answer.output[0].type == "message"
        assert api.responses.retrieve(answer.id).output_text == answer.output_text
        with pytest.raises(openai.NotFoundError) as e:
            api.responses.create(model=name, input="x", previous_response_id="resp_nope")
        assert e.value.body["param"] == "previous_response_id"
        with pytest.raises(openai.BadRequestError) as e:
            api.responses.create(model=name, input=[{"type": "banana"}])
        assert e.value.body["param"] == "input[0].type"
        with pytest.raises(openai.BadRequestError) as e:
            api.responses.create(model=name, input="x", tools=[{"type": "function",
                                                              "function": {"name": "f"}}])
        assert e.value.body["param"] == "tools[0].function"
        # on the wire each event is named, as OpenAI sends them, and no [DONE] follows
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("POST", "/v1/responses", body=json.dumps(
            {"model": name, "input": "x", "max_output_tokens": 2, "stream": True}),
            headers={"Content-Type": "application/json"})
        blocks = c.getresponse().read().decode().strip().split("\n\n")
        c.close()
        for block in blocks:
            event, data = block.split("\n")
            assert event == "event: " + json.loads(data[len("data: "):])["type"]
        status, body = _post(s.port, "/v1/responses", {"model": name, "input": "x", "n": 2})
        assert status == 400 and body["error"]["param"] == "n"
    finally:
        s.stop()
