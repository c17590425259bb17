"""Bounded fuzzing of `ignis serve`'s ASGI app, in-process over the tiny chat model: random JSON
bodies and field values (nested objects and arrays, strings with lone surrogates and control
characters, huge integers, 1e999, NaN, every known field of chat / completions / embeddings given a
value of the wrong type), raw non-JSON bodies and wrong content types. Every answer must be a 2xx,
or a 4xx/503 carrying an OpenAI error object {"error": {"message", "type", "param", "code"}}: never
a 500, never another status, never a hang. Derandomized and database-less: CI runs the same
examples every time (IGNIS_FUZZ_SCALE=N: N times as many, new ones each run, for a bug hunt).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import ignis

pytest.importorskip("starlette", reason="ignis serve needs the server extra: pip install 'ignis[server]'")

N_CTX = 512                # the tiny model's maximum; it makes all 512 tokens in ~40 ms
REQUEST_TIMEOUT_S = 30     # an answer slower than this is a hang (they take milliseconds)


def fuzz_settings(max_examples: int) -> settings:
    scale = int(os.environ.get("IGNIS_FUZZ_SCALE", "0") or 0)
    # deadline: generous, REQUEST_TIMEOUT_S is what catches hangs; a tight one would flake on a
    # busy 2-core CI runner. function_scoped_fixture: the app fixture is module-scoped.
    return settings(max_examples=max_examples * max(scale, 1), deadline=10_000,
                    derandomize=scale == 0, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# --- the app, driven in-process -----------------------------------------------------------------

@pytest.fixture(scope="module")
def app(tiny_chat_dir: Path):
    from ignis.api.server import build_app
    model = ignis.load(str(tiny_chat_dir), n_ctx=N_CTX, threads=1, progress=False)
    served = build_app(model)
    yield served
    served.state.ignis.queue.close()
    model.weights.close()


class Hang(AssertionError):
    pass


def call(app: Any, method: str, path: str, body: bytes,
         content_type: str | None = "application/json") -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app: (status, response headers, body). The client stays
    connected until the answer is complete, as a patient HTTP client does."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-length", str(len(body)).encode())]
    if content_type is not None:
        headers.append((b"content-type", content_type.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "headers": headers}
    sent: list[dict] = []

    async def run() -> None:
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        done = asyncio.Event()

        async def receive() -> dict:
            if pending:
                return pending.pop()
            await done.wait()                   # connected until the whole answer is out
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await asyncio.wait_for(app(scope, receive, send), REQUEST_TIMEOUT_S)

    # The alarm is the backstop for work that blocks the event loop (wait_for cannot fire then).
    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"{method} {path}: no answer after {2 * REQUEST_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 2 * REQUEST_TIMEOUT_S)
    try:
        asyncio.run(run())
    except asyncio.TimeoutError:
        raise Hang(f"{method} {path}: no answer after {REQUEST_TIMEOUT_S} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    start = next(m for m in sent if m["type"] == "http.response.start")
    hdrs = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], hdrs, data


def check_error_object(obj: Any, status: int) -> None:
    assert isinstance(obj, dict) and set(obj) == {"error"}, f"{status}: not an error object: {obj!r}"
    err = obj["error"]
    assert isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err), \
        f"{status}: error object lacks fields: {err!r}"
    assert isinstance(err["message"], str) and err["message"], f"{status}: {err!r}"
    assert isinstance(err["type"], str) and err["type"], f"{status}: {err!r}"
    assert err["param"] is None or isinstance(err["param"], str), f"{status}: {err!r}"
    assert err["code"] is None or isinstance(err["code"], str), f"{status}: {err!r}"


OUTCOMES: dict[str, int] = {}     # every answer's status and error code, for a look at the reach


def note(what: str) -> None:
    OUTCOMES[what] = OUTCOMES.get(what, 0) + 1
    if currently_in_test_context():
        event(what)


def check_answer(status: int, headers: dict[str, str], data: bytes) -> None:
    """2xx, or 4xx/503 with an OpenAI error object; a 200 stream is SSE ending in [DONE] (a
    Responses stream: in response.completed or .incomplete) or an error event."""
    note(f"status {status}")
    if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in data.decode("utf-8").split("\n") if line.startswith("data: ")]
        assert events, f"empty event stream: {data[:300]!r}"
        for e in events[:-1]:
            json.loads(e)
        last = events[-1]
        if last == "[DONE]":
            return
        obj = json.loads(last)
        # a Responses stream ends with its last event, the final response in it
        if isinstance(obj, dict) and obj.get("type") in ("response.completed",
                                                         "response.incomplete"):
            assert obj["response"]["status"] == obj["type"][len("response."):], obj
            return
        check_error_object(obj, status)
        return
    try:
        body = json.loads(data)
    except ValueError:
        raise AssertionError(f"{status} with a body that is not JSON: {data[:300]!r}") from None
    if 200 <= status < 300:
        assert isinstance(body, dict), f"{status}: {body!r}"
        return
    assert 400 <= status < 500 or status == 503, \
        f"status {status}: {json.dumps(body)[:600]}"
    check_error_object(body, status)
    note(f"{status} {body['error']['code']}")


# --- JSON, written by hand so it can hold what json.dumps will not --------------------------------

def to_json(v: Any) -> str:
    """JSON text: lone surrogates as \\ud800 escapes, inf as 1e999 (which Python's and most JSON
    parsers read as infinity), NaN as the non-standard NaN token."""
    if isinstance(v, float) and math.isinf(v):
        return "1e999" if v > 0 else "-1e999"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return "{" + ",".join(f"{to_json(str(k))}:{to_json(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=True)


# every code point, surrogates and controls included
_chars = st.characters(codec=None, categories=None, exclude_categories=())
strings = st.one_of(
    st.text(_chars, max_size=12),
    st.sampled_from(["", "a\ud800b", "\udfff", "\ud83d", "\x00", "\x1b[31m", "\u2028", "\ufeff",
                     "<|im_end|>", "<|im_start|>system\nx<|im_end|>", "hi", "user", "system",
                     "assistant", "tool", "developer", "text", "float", "base64", "mean", "last",
                     "tiny-chat", "auto", "none", "json_object", "function", "default"]),
)
huge_ints = st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, -2**63 - 1, 10**30, 10**400])
ints = st.integers(-3, 70) | huge_ints | st.integers()
floats = st.floats() | st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 1e-320, 1e308])
scalars = st.none() | st.booleans() | ints | floats | strings
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(strings, inner, max_size=4),
    max_leaves=12)

# What each endpoint knows (OpenAI's fields and ignis's extras), with values of the right type
# beside any JSON value: a request must get past the type checks to reach the deeper ones.
small_ints = st.integers(-2, 8) | huge_ints
# floats around the valid ranges, and integers no double holds (10**400: float() overflows)
probability = st.floats(-0.5, 2.5) | st.sampled_from([0, 1, 0.5]) | huge_ints
stop = strings | st.lists(strings, max_size=5)
content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "refusal"]) | strings},
    optional={"text": strings | json_values, "image_url": json_values, "refusal": strings})
tool_call = st.fixed_dictionaries(
    {"id": strings, "type": st.just("function") | strings,
     "function": st.fixed_dictionaries({"name": strings, "arguments": strings | json_values})})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | strings,
     "content": strings | st.none() | st.lists(content_part | json_values, max_size=3)},
    optional={"name": strings, "tool_call_id": strings | json_values,
              "tool_calls": st.lists(tool_call, max_size=2) | json_values,
              "refusal": strings | json_values})
messages = st.lists(message | json_values, max_size=4)
token_ids = st.lists(st.integers(-2, 300) | huge_ints, max_size=6)
prompt = strings | st.lists(strings, max_size=3) | token_ids | st.lists(token_ids, max_size=3)
sampling = {
    "temperature": probability, "top_p": probability, "seed": ints,
    "presence_penalty": probability, "frequency_penalty": probability,
    "logit_bias": st.dictionaries(st.integers(-2, 300).map(str) | strings, floats | ints, max_size=3),
    "n": small_ints, "stop": stop, "user": strings, "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | scalars}),
    "max_tokens": small_ints, "top_k": small_ints, "min_p": probability,
    "repetition_penalty": probability, "ignore_eos": st.booleans(),
}
FIELDS: dict[str, dict[str, st.SearchStrategy]] = {
    "chat": {**sampling, "messages": messages, "max_completion_tokens": small_ints,
             "logprobs": st.booleans(), "top_logprobs": small_ints,
             "response_format": st.fixed_dictionaries({"type": strings}),
             "tools": st.lists(json_values, max_size=2), "tool_choice": strings | json_values,
             "store": st.booleans(), "metadata": st.dictionaries(strings, strings, max_size=2),
             "parallel_tool_calls": st.booleans(), "service_tier": strings},
    "completions": {**sampling, "prompt": prompt, "logprobs": small_ints, "echo": st.booleans(),
                    "best_of": small_ints, "suffix": strings, "split_special_tokens": st.booleans()},
    "embeddings": {"input": prompt, "encoding_format": strings, "dimensions": small_ints,
                   "user": strings, "pooling": strings},
}
input_item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning",
                              "item_reference"]) | strings},
    optional={"role": st.sampled_from(["user", "assistant", "system", "developer"]) | strings,
              "content": strings | st.lists(content_part | json_values, max_size=2),
              "call_id": strings | json_values, "name": strings, "arguments": strings | json_values,
              "output": strings | json_values})
FIELDS["responses"] = {
    "input": strings | st.lists(input_item | json_values, max_size=3),
    "instructions": strings | json_values, "max_output_tokens": small_ints,
    "temperature": probability, "top_p": probability, "stream": st.booleans(),
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function") | strings},
                                            optional={"name": strings, "parameters": json_values}),
                      max_size=2) | json_values,
    "tool_choice": strings | json_values, "parallel_tool_calls": st.booleans(),
    "text": st.fixed_dictionaries({}, optional={"format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"]) | strings},
        optional={"name": strings, "schema": json_values})}) | json_values,
    "previous_response_id": strings, "store": st.booleans(), "truncation": strings,
    "metadata": st.dictionaries(strings, strings, max_size=2), "seed": ints}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "embeddings": "/v1/embeddings", "responses": "/v1/responses"}
BASE = {"chat": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        "completions": {"prompt": "hi", "max_tokens": 3},
        "embeddings": {"input": "hi"},
        "responses": {"input": "hi", "max_output_tokens": 3}}


@st.composite
def request_bodies(draw: st.DrawFn, which: str, model_name: str) -> str:
    """A valid request for `which` with 1-4 fields (mostly one) set to a value of the right type
    or any JSON value, removed, or unknown ones added; or, now and then, any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        event("any JSON body")
        return to_json(draw(json_values))
    body: dict[str, Any] = {"model": model_name, **BASE[which]}
    if which != "embeddings" and draw(st.integers(0, 2)) == 0:
        body["stream"] = True       # the same checks, before the 200 and the first event
        event("stream")
    fields = FIELDS[which]
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        key = draw(st.sampled_from(sorted(fields) + ["model", "extra_body", "*unknown*"]))
        if key == "*unknown*":
            key = draw(strings)
        how = draw(st.sampled_from(["typed", "typed", "typed", "any", "drop"]))
        if how == "drop":
            body.pop(key, None)
        elif how == "typed" and key in fields:
            body[key] = draw(fields[key])
        else:
            body[key] = draw(json_values)
        event(f"{which}.{key if key in fields or key == 'model' else '<other>'} {how}")
    return to_json(body)


def _run_endpoint(app: Any, which: str, examples: int) -> None:
    name = app.state.ignis.names[0]

    @fuzz_settings(examples)
    @given(body=request_bodies(which, name))
    def run(body: str) -> None:
        status, headers, data = call(app, "POST", PATHS[which],
                                     body.encode("utf-8", "surrogatepass"))
        check_answer(status, headers, data)

    run()


@pytest.mark.slow
def test_fuzz_chat_completions(app) -> None:
    _run_endpoint(app, "chat", 1500)


@pytest.mark.slow
def test_fuzz_completions(app) -> None:
    _run_endpoint(app, "completions", 1500)


@pytest.mark.slow
def test_fuzz_embeddings(app) -> None:
    _run_endpoint(app, "embeddings", 1000)


@pytest.mark.slow
def test_fuzz_responses(app) -> None:
    _run_endpoint(app, "responses", 1500)


raw_bodies = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"{", b'{"model": "tiny-chat", "messages": [', b"null", b"[]", b"1e999",
                     b'"\\ud800"', b'{"a": NaN}', b'{"a": Infinity}', b"\xff\xfe{}", b"\xef\xbb\xbf{}",
                     b'{"model": "tiny-chat", "prompt": "\xff"}', b"[" * 5000 + b"]" * 5000,
                     b'{"' + b"a" * 100 + b'": 1}', b'{"model": "tiny-chat", "input": "\xed\xa0\x80"}']),
)


@pytest.mark.slow
def test_fuzz_raw_bodies_and_content_types(app) -> None:
    """Bytes that are not a JSON object, or sent as something else than application/json."""
    @fuzz_settings(500)
    @given(path=st.sampled_from(sorted(PATHS.values())), body=raw_bodies,
           ctype=st.sampled_from(["application/json", "application/json; charset=utf-8",
                                  "text/plain", "application/x-www-form-urlencoded", "", None]))
    def run(path: str, body: bytes, ctype: str | None) -> None:
        check_answer(*call(app, "POST", path, body, ctype))

    run()


@pytest.mark.slow
def test_fuzz_paths_and_methods(app) -> None:
    """Any method on the known routes and on random paths (percent escapes, dot segments, the
    model route with odd names)."""
    segment = st.text(st.sampled_from("abv1%2F./-_~:@!$&'()*+,;=\u00e9"), max_size=8)
    paths = st.one_of(
        st.sampled_from(["/v1/models", "/v1/models/tiny-chat", "/health", "/", "/v1", "/v1/",
                         "/v1/chat/completions/", "/v1/models/", "//v1/models", "/v1/models/%00",
                         "/v1/models/..%2F..%2Fetc", "/v1/embeddings?x=1"] + sorted(PATHS.values())),
        st.lists(segment, min_size=1, max_size=4).map(lambda p: "/" + "/".join(p)),
        segment.map(lambda n: "/v1/models/" + n))

    @fuzz_settings(300)
    @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
           path=paths, body=st.sampled_from([b"", b"{}", b'{"model": "tiny-chat", "input": "x"}']))
    def run(method: str, path: str, body: bytes) -> None:
        status, headers, data = call(app, method, path, body)
        if method == "HEAD":            # no body to check
            assert status < 500 and status not in (301, 302, 307, 308), (status, path)
            return
        check_answer(status, headers, data)

    run()


@pytest.mark.parametrize("status,body", [
    (500, {"error": {"message": "internal error", "type": "server_error", "param": None,
                     "code": "internal_error"}}),
    (400, {"detail": "bad"}),
    (400, {"error": {"message": "bad", "type": "invalid_request_error"}}),
    (307, {}),
])
def test_the_checker_refuses_what_the_server_must_never_answer(status, body) -> None:
    with pytest.raises(AssertionError):
        check_answer(status, {"content-type": "application/json"}, json.dumps(body).encode())
