"""ignis.Client(native="DIR"): the compiled library through ctypes, held to the in-process
ignis.Client on the tiny chat model. The same response types, text, finish_reason and usage
(cached_tokens aside: the library runs every prompt whole) for greedy and seeded chat and
completions; streams whose chunks arrive while the library generates, concatenate to the whole
answer and cancel generation when closed; the same exception classes and bodies for bad requests;
a typed error with the library's own message for a missing or damaged directory. The C example
examples/c/chat.c streams the Python path's greedy answer."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tools_required import require_tool

import ignis
from ignis.api.client import APIError, BadRequestError, NotFoundError
from ignis.api.native_client import STREAM_LAG, NativeLibraryError, _NativeStream

ROOT = Path(__file__).resolve().parent.parent


def _strip(d: dict) -> dict:
    """A response's JSON without what differs by design: id, created, and cached_tokens (the
    in-process Client reuses the KV cache's common prefix with the previous request)."""
    d = {k: v for k, v in d.items() if k not in ("id", "created")}
    if d.get("usage"):
        d["usage"] = {**d["usage"], "prompt_tokens_details": {
            **(d["usage"]["prompt_tokens_details"] or {}), "cached_tokens": None}}
    return d


def _same(got, want) -> None:
    assert type(got) is type(want)
    assert type(got.choices[0]) is type(want.choices[0])
    assert _strip(got.model_dump()) == _strip(want.model_dump())


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "developer", "content": "日本語で"}, {"role": "user", "content": "é\u0301 <|im_end|>"}],
]
CHAT_SETTINGS = [
    {"max_tokens": 20, "temperature": 0},
    {"max_tokens": 30, "seed": 6},
    {"max_completion_tokens": 25, "temperature": 1.2, "seed": 3, "stop": ["a", "en"]},
    {"max_tokens": 12, "temperature": 1.5, "seed": 1, "n": 2, "extra_body": {"top_k": 1}},
    # the tiny model answers a chat with newlines: without them, other (and control) characters
    {"max_tokens": 30, "temperature": 0, "logit_bias": {"10": -100}},
    {"max_tokens": 30, "temperature": 1.0, "seed": 3, "logit_bias": {"10": -100}},
    {"max_tokens": 16, "temperature": 1.3, "seed": 5, "n": 2, "logit_bias": {"10": -100},
     "extra_body": {"top_k": 3}},
]


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_chat_equals_the_in_process_client(tiny_chat_native, tiny_chat_local, conv):
    for s in CHAT_SETTINGS:
        kw = {"model": "tiny-chat", "messages": CONVERSATIONS[conv], **s}
        got = tiny_chat_native.chat.completions.create(**kw)
        want = tiny_chat_local.chat.completions.create(**kw)
        _same(got, want)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.id.startswith("chatcmpl-") and got.usage.total_tokens > 0


PROMPTS = ["Hello world", "The cat sat on", [5, 17, 3, 33, 42]]
COMPLETION_SETTINGS = [
    {"max_tokens": 30, "temperature": 0},
    {"seed": 0},
    {"max_tokens": 30, "temperature": 1.1, "seed": 4, "stop": ["e ", "at"], "presence_penalty": 0.5},
    {"max_tokens": 10, "seed": 2, "n": 3, "extra_body": {"min_p": 0.05, "repetition_penalty": 1.2}},
]


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_completions_equal_the_in_process_client(tiny_chat_native, tiny_chat_local, prompt):
    for s in COMPLETION_SETTINGS:
        kw = {"model": "tiny-chat", "prompt": PROMPTS[prompt], **s}
        _same(tiny_chat_native.completions.create(**kw), tiny_chat_local.completions.create(**kw))


def test_streams_equal_the_in_process_client(tiny_chat_native, tiny_chat_local):
    """Chunk for chunk the in-process Client's (same types), and their text is the whole answer."""
    for endpoint, kw in (("chat", {"messages": CONVERSATIONS[1], "max_tokens": 30, "seed": 2}),
                         ("completions", {"prompt": "The cat sat on", "max_tokens": 30, "seed": 5})):
        kw = {"model": "tiny-chat", **kw, "stream": True, "stream_options": {"include_usage": True}}
        create = (lambda c: c.chat.completions.create) if endpoint == "chat" else \
            (lambda c: c.completions.create)
        got, want = list(create(tiny_chat_native)(**kw)), list(create(tiny_chat_local)(**kw))
        assert len(got) == len(want) >= 3
        for g, w in zip(got, want):
            assert type(g) is type(w)
            assert _strip(g.model_dump()) == _strip(w.model_dump())
        whole = create(tiny_chat_native)(**{k: v for k, v in kw.items() if k not in ("stream", "stream_options")})
        if endpoint == "chat":
            text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
            assert text == whole.choices[0].message.content
        else:
            assert "".join(c.choices[0].text for c in got if c.choices) == whole.choices[0].text
        assert got[-1].usage.completion_tokens == whole.usage.completion_tokens


def _long_stream(client):
    return client.completions.create(model="tiny-chat", prompt="Hello", max_tokens=200,
                                     temperature=1.0, seed=3, stream=True,
                                     extra_body={"ignore_eos": True})


def _worker(stream) -> _NativeStream:
    return stream._close.__self__


def test_stream_is_incremental_and_close_cancels(tiny_chat_native):
    """The first chunk is read while the library still generates (it may run at most STREAM_LAG
    chunks ahead of the reader); closing the stream stops it through the callback's nonzero
    answer: the library answers "cancelled" after a few of the 200 tokens."""
    s = _long_stream(tiny_chat_native)
    w = _worker(s)
    first = next(s)
    assert first.choices[0].text is not None and first.choices[0].finish_reason is None
    assert not w._done and w._thread.is_alive()
    s.close()
    assert not w._thread.is_alive()
    assert w.answer["error"]["code"] == "cancelled"
    assert len(w._queue) <= STREAM_LAG
    assert list(s) == []
    # the handle still answers
    r = tiny_chat_native.completions.create(model="tiny-chat", prompt="Hello", max_tokens=3)
    assert r.usage.completion_tokens <= 3


def test_a_call_while_a_stream_is_unread_runs(tiny_chat_native, tiny_chat_local):
    """A request made while a stream is open and unread is answered (the stream's bound is lifted so
    its generation can finish and free the handle), and the stream then gives its whole text."""
    s = _long_stream(tiny_chat_native)
    head = next(s).choices[0].text
    r = tiny_chat_native.chat.completions.create(model="tiny-chat", messages=CONVERSATIONS[0], max_tokens=8,
                                       temperature=0)
    want = tiny_chat_local.chat.completions.create(model="tiny-chat", messages=CONVERSATIONS[0], max_tokens=8,
                                         temperature=0)
    assert r.choices[0].message.content == want.choices[0].message.content
    rest = [c for c in s]
    assert rest[-1].choices[0].finish_reason == "length"
    whole = tiny_chat_native.completions.create(model="tiny-chat", prompt="Hello", max_tokens=200,
                                      temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    assert head + "".join(c.choices[0].text for c in rest) == whole.choices[0].text


BAD = [
    ("chat", {"messages": []}),
    ("chat", {"messages": [{"role": "boss", "content": "hi"}]}),
    ("chat", {"messages": [{"role": "user", "content": 5}]}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "max_completion_tokens": 6}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "top_p": 7}),
    ("completions", {"prompt": []}),
    ("completions", {"prompt": "hi", "max_tokens": 0}),
    ("completions", {"prompt": "hi", "logprobs": 9}),
    ("completions", {"prompt": "hi", "extra_body": {"top_k": "many"}}),
    ("completions", {"prompt": "hi", "extra_body": {"bogus": 1}}),
    ("completions", {"prompt": "hi", "stream": True, "max_tokens": 1000}),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_requests_raise_what_the_in_process_client_raises(tiny_chat_native, tiny_chat_local, case):
    endpoint, kw = BAD[case]
    kw = {"model": "tiny-chat", **kw}
    errors = []
    for client in (tiny_chat_local, tiny_chat_native):
        create = client.chat.completions.create if endpoint == "chat" else client.completions.create
        with pytest.raises(APIError) as e:
            create(**kw)
        errors.append(e.value)
    want, got = errors
    assert type(got) is type(want)
    assert got.body == want.body and str(got) == str(want) and got.status_code == want.status_code


def test_another_models_name_is_not_found(tiny_chat_native):
    with pytest.raises(NotFoundError) as e:
        tiny_chat_native.completions.create(model="gpt-4o", prompt="hi")
    assert e.value.param == "model" and e.value.code == "model_not_found"


def test_embeddings_equal_the_in_process_client(tiny_chat_native, tiny_chat_local):
    """ignis_embeddings (issue 18; tests/test_native_embed.py has the rest)."""
    kw = {"model": "tiny-chat", "input": ["hi", "The cat sat on"]}
    got, want = tiny_chat_native.embeddings.create(**kw), tiny_chat_local.embeddings.create(**kw)
    assert got.usage == want.usage and got.model == want.model
    np.testing.assert_allclose([d.embedding for d in got.data], [d.embedding for d in want.data],
                               rtol=0, atol=1e-6)


def test_missing_or_damaged_directories_are_typed_errors(tiny_chat_compiled, tmp_path):
    src = Path(tiny_chat_compiled.directory)
    with pytest.raises(NativeLibraryError, match="is not a directory"):
        ignis.Client(native=str(tmp_path / "nowhere"))
    with pytest.raises(NativeLibraryError, match="has no manifest.json"):
        ignis.Client(native=str(tmp_path))
    bad = tmp_path / "bad-manifest"
    shutil.copytree(src, bad)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(NativeLibraryError, match="cannot be read as JSON"):
        ignis.Client(native=str(bad))
    # weights.bin cut short: ignis_open refuses it, and its message is the error's
    short = tmp_path / "short"
    shutil.copytree(src, short)
    data = (short / "weights.bin").read_bytes()
    (short / "weights.bin").write_bytes(data[:len(data) // 2])
    with pytest.raises(NativeLibraryError, match=r"ignis_open\(.*weights\.bin") as e:
        ignis.Client(native=str(short))
    assert str(len(data) // 2) in str(e.value) or "size" in str(e.value)
    # an unknown open option is the library's error too
    with pytest.raises(NativeLibraryError, match="ignis_open") as e:
        ignis.Client(native=str(src), native_options={"bogus": 1})
    assert "bogus" in str(e.value)


def test_close_ends_the_handle(tiny_chat_compiled):
    c = ignis.Client(native=str(tiny_chat_compiled.directory), native_options={"threads": 1})
    s = _long_stream(c)
    next(s)
    c.close()                                 # cancels the open stream first
    assert _worker(s).answer["error"]["code"] == "cancelled"
    with pytest.raises(NativeLibraryError, match="closed"):
        c.completions.create(model="tiny-chat", prompt="hi")
    c.close()                                 # twice is fine


def test_c_chat_example_streams_the_greedy_answer(tiny_chat_native, tiny_chat_local, tiny_chat_compiled, tmp_path):
    """examples/c/chat.c, built with -Wall -Wextra -Werror against the compiled directory and run
    with an empty environment: the text it prints is the Python path's greedy answer."""
    cc = require_tool("cc", "apt-get install gcc", "the C example")
    r = tiny_chat_compiled
    exe = tmp_path / "chat"
    lib = r.library.name[len("lib"):-len(".so")]
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", str(ROOT / "examples/c/chat.c"),
                    f"-I{r.directory}", f"-L{r.directory}", f"-l{lib}",
                    f"-Wl,-rpath,{r.directory}", "-o", str(exe)], check=True, capture_output=True, text=True)
    texts = set()
    for conv, n, bias in ((CONVERSATIONS[0], 40, None), (CONVERSATIONS[1], 24, None),
                          (CONVERSATIONS[0], 30, {"10": -100}), (CONVERSATIONS[1], 30, {"10": -100}),
                          (CONVERSATIONS[2], 30, {"10": -100})):
        args = []
        for m in conv:
            args += [m["role"], m["content"]]
        extra = ["-x", '"logit_bias": ' + json.dumps(bias)] if bias else []
        p = subprocess.run([str(exe), "-n", str(n), *extra, str(r.directory), *args], env={},
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        want = tiny_chat_local.chat.completions.create(model="tiny-chat", messages=conv, max_tokens=n,
                                             temperature=0, logit_bias=bias)
        assert p.stdout.decode("utf-8") == want.choices[0].message.content + "\n"
        texts.add(want.choices[0].message.content)
    assert len(texts) >= 4             # not one answer for every request
    p = subprocess.run([str(exe), str(tmp_path), "user", "hi"], env={}, capture_output=True)
    assert p.returncode == 1 and b"ignis_open" in p.stderr
    p = subprocess.run([str(exe), str(r.directory), "user"], env={}, capture_output=True)
    assert p.returncode == 2 and b"usage" in p.stderr


def test_a_dropped_stream_is_cancelled(tiny_chat_native):
    """A stream read in part, or not at all, then dropped (no close()) stops its generation when
    collected."""
    import gc
    s = _long_stream(tiny_chat_native)
    next(s)
    w = _worker(s)
    del s
    gc.collect()
    assert not w._thread.is_alive() and w.answer["error"]["code"] == "cancelled"
    s = _long_stream(tiny_chat_native)          # never read
    w = _worker(s)
    del s
    gc.collect()
    assert not w._thread.is_alive() and w.answer["error"]["code"] == "cancelled"


def test_threads_share_one_client(tiny_chat_native, tiny_chat_local):
    """Calls from several threads on one native Client (the library serialises them on its handle)
    give each request's own answer."""
    from concurrent.futures import ThreadPoolExecutor
    kws = [{"model": "tiny-chat", "prompt": p, "max_tokens": 20, "temperature": 0.8, "seed": i}
           for i, p in enumerate(["Hello world", "The cat", "日本語", "abc"] * 2)]

    def stream_text(kw):
        return "".join(c.choices[0].text for c in tiny_chat_native.completions.create(**kw, stream=True) if c.choices)
    with ThreadPoolExecutor(4) as pool:
        plain = list(pool.map(lambda kw: tiny_chat_native.completions.create(**kw).choices[0].text, kws))
        streamed = list(pool.map(stream_text, kws))
    want = [tiny_chat_local.completions.create(**kw).choices[0].text for kw in kws]
    assert plain == want and streamed == want


def test_chat_logprobs_equal_the_in_process_client(tiny_chat_native, tiny_chat_local):
    """Chat logprobs through the ctypes client: the same tokens, bytes and alternatives, the
    logprobs within 1e-4 (libm here, numpy there), whole and streamed."""
    kw = {"model": "tiny-chat", "messages": CONVERSATIONS[1], "max_tokens": 12, "temperature": 1.1, "seed": 4,
          "logprobs": True, "top_logprobs": 3}

    def close(g, w):
        if isinstance(w, float):
            assert g == pytest.approx(w, abs=1e-4)
        elif isinstance(w, dict):
            assert list(g) == list(w)
            for k in w:
                close(g[k], w[k])
        elif isinstance(w, list):
            assert len(g) == len(w)
            for a, b in zip(g, w):
                close(a, b)
        else:
            assert g == w
    close(_strip(tiny_chat_native.chat.completions.create(**kw).model_dump()),
          _strip(tiny_chat_local.chat.completions.create(**kw).model_dump()))
    got = [_strip(c.model_dump()) for c in tiny_chat_native.chat.completions.create(stream=True, **kw)]
    want = [_strip(c.model_dump()) for c in tiny_chat_local.chat.completions.create(stream=True, **kw)]
    close(got, want)
    assert sum(len((c["choices"][0]["logprobs"] or {}).get("content") or []) for c in got if c["choices"]) == \
        len(tiny_chat_native.chat.completions.create(**kw).choices[0].logprobs["content"])


def test_tool_requests_through_the_native_client(tiny_chat_native, tiny_chat_local):
    """Tools through the ctypes client: a bad tool is the in-process client's BadRequestError,
    and so is tool_choice "required" over a prompt that does not fit tiny-chat's context (the
    library refuses "required" by name only once the rest of the request is good: test_native_api),
    "none" answers as the in-process client does."""
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    base = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    for bad in ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                {"tools": [fn], "tool_choice": {"type": "function", "function": {"name": "g"}}},
                # a second grammar beside the calls' (extra_body, as the official client sends it)
                {"tools": [fn], "tool_choice": "required", "extra_body": {"guided_regex": "a+"}},
                {"tools": [fn], "tool_choice": {"type": "function", "function": {"name": "f"}},
                 "extra_body": {"guided_choice": ["a", ""]}}):
        with pytest.raises(BadRequestError) as g:
            tiny_chat_native.chat.completions.create(**base, **bad)
        with pytest.raises(BadRequestError) as w:
            tiny_chat_local.chat.completions.create(**base, **bad)
        assert g.value.body == w.value.body
    with pytest.raises(BadRequestError) as g:
        tiny_chat_native.chat.completions.create(**base, tools=[fn], tool_choice="required")
    with pytest.raises(BadRequestError) as w:
        tiny_chat_local.chat.completions.create(**base, tools=[fn], tool_choice="required")
    assert g.value.body == w.value.body and g.value.body["code"] == "context_length_exceeded"
    _same(tiny_chat_native.chat.completions.create(**base, tools=[fn], tool_choice="none"),
          tiny_chat_local.chat.completions.create(**base, tools=[fn], tool_choice="none"))
