"""ignis.Client against the OpenAI API shape: one user function run unchanged against ignis.Client()
and against the official `openai` client pointed at a stub transport that answers from ignis's own
result JSON; streaming, usage, logprobs, and every invalid-parameter case as a 400."""
from __future__ import annotations

import json

import pytest

import ignis
from ignis.api.client import EXTRA_COMPLETIONS, EXTRA_SAMPLING, BadRequestError, NotFoundError

openai = pytest.importorskip("openai", reason="the same-code test needs the official client "
                                              "(pip install openai; in the test extras)")
# the HTTP library this openai release is built on (httpx; some builds vendor it as httpx2)
httpx = getattr(openai._base_client, "httpx", None) or getattr(openai._base_client, "httpx2")

USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=160, threads=1)
    yield m
    m.weights.close()


@pytest.fixture(scope="module")
def local(model):
    return ignis.Client([model])


def stub_transport(local: "ignis.Client"):
    """An OpenAI-API HTTP endpoint in a function: the request JSON goes to ignis.Client, its
    result's model_dump() comes back (SSE for streams, {"error": ...} with 400 for bad requests)."""
    def handler(request):
        path = request.url.path
        if request.method == "GET" and path.endswith("/models"):
            return httpx.Response(200, json=local.models.list().model_dump())
        body = json.loads(request.content)
        chat = path.endswith("/chat/completions")
        extra = {k: body.pop(k) for k in (EXTRA_SAMPLING if chat else EXTRA_COMPLETIONS) if k in body}
        endpoint = local.chat.completions if chat else local.completions
        try:
            res = endpoint.create(**body, extra_body=extra or None)
        except (BadRequestError, NotFoundError) as e:
            return httpx.Response(e.status_code, json={"error": e.body})
        if body.get("stream"):
            sse = "".join(f"data: {c.model_dump_json()}\n\n" for c in res) + "data: [DONE]\n\n"
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=res.model_dump())
    return httpx.MockTransport(handler)


def user_code(client, model_name: str) -> dict:
    """Written for the official openai client; nothing in it knows about ignis."""
    out = {}
    r = client.chat.completions.create(model=model_name, messages=USER, max_tokens=8, temperature=0.8,
                                       seed=11, logprobs=True, top_logprobs=2,
                                       extra_body={"top_k": 40, "repetition_penalty": 1.1})
    choice = r.choices[0]
    out["chat"] = (r.object, r.model, choice.message.role, choice.message.content,
                   choice.finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens,
                   r.usage.total_tokens, bool(r.id), r.system_fingerprint)
    out["logprobs"] = [(t.token, t.bytes, round(t.logprob, 9), [x.token for x in t.top_logprobs])
                       for t in choice.logprobs.content]
    out["dump"] = sorted(r.model_dump()["choices"][0]["message"])

    text, finish, usage, first_role = [], None, None, None
    stream = client.chat.completions.create(model=model_name, messages=USER, max_tokens=8,
                                            temperature=0.8, seed=11, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"top_k": 40, "repetition_penalty": 1.1})
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        first_role = first_role or delta.role
        if delta.content:
            text.append(delta.content)
        finish = chunk.choices[0].finish_reason or finish
    out["stream"] = ("".join(text), finish, usage, first_role)

    c = client.completions.create(model=model_name, prompt="def reverse(s):", max_tokens=6,
                                  temperature=0, stop=["\n\n"])
    out["completion"] = (c.object, c.choices[0].text, c.choices[0].finish_reason,
                         c.usage.completion_tokens)
    plain = client.completions.create(model=model_name, prompt="<|im_end|>", max_tokens=1,
                                      temperature=0, extra_body={"split_special_tokens": True})
    out["split_special_tokens"] = plain.usage.prompt_tokens
    out["models"] = model_name in [m.id for m in client.models.list()]

    for bad in ({"temperature": 3.0}, {"messages": []}, {"stop": ""},
                {"logprobs": False, "top_logprobs": 2}):
        try:
            client.chat.completions.create(**{"model": model_name, "messages": USER, **bad})
            out.setdefault("errors", []).append(None)
        except Exception as e:            # openai.BadRequestError with the official client
            out.setdefault("errors", []).append((type(e).__name__, e.status_code, e.param, e.code,
                                                 e.body["param"]))
    return out


def test_the_same_code_runs_on_ignis_and_on_the_official_client(local, model):
    official = openai.OpenAI(api_key="unused", base_url="http://ignis.invalid/v1", max_retries=0,
                             http_client=httpx.Client(transport=stub_transport(local)))
    got_local = user_code(local, model.name)
    got_official = user_code(official, model.name)
    assert got_local == got_official
    chat = got_local["chat"]
    assert chat[0] == "chat.completion" and chat[2] == "assistant" and chat[4] in ("stop", "length")
    assert chat[7] == chat[5] + chat[6]
    assert got_local["stream"][0] == chat[3]                       # stream text == non-stream text
    assert got_local["stream"][1] == chat[4] and got_local["stream"][2] == chat[7]
    assert got_local["stream"][3] == "assistant"
    assert len(got_local["logprobs"]) == chat[6] - (chat[4] == "stop")
    assert [e[0] for e in got_local["errors"]] == ["BadRequestError"] * 4
    assert [e[2] for e in got_local["errors"]] == ["temperature", "messages", "stop", "top_logprobs"]
    assert got_local["models"]
    # the special token's text as the ordinary tokens that spell it, through the official client too
    spelled = model.tokenize("<|im_end|>", split_special_tokens=True)
    assert got_local["split_special_tokens"] == len(spelled) > 1


def test_results_have_openai_nesting_and_model_dump(local, model):
    r = local.chat.completions.create(model=model.name, messages=USER, max_tokens=4, temperature=0)
    d = r.model_dump()
    assert set(d) >= {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert d["choices"][0]["message"]["content"] == r.choices[0].message.content
    assert d["usage"]["total_tokens"] == r.usage.total_tokens
    assert json.loads(r.model_dump_json()) == d
    # parsed by the official client's own models: the shape is exactly the API's
    parsed = openai.types.chat.ChatCompletion.model_validate(d)
    assert parsed.choices[0].message.content == r.choices[0].message.content


def test_stream_chunks_parse_as_official_chunks(local, model):
    chunks = list(local.chat.completions.create(model=model.name, messages=USER, max_tokens=5,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
    for c in chunks:
        openai.types.chat.ChatCompletionChunk.model_validate(c.model_dump())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 5
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completions_logprobs_and_token_prompts(local, model):
    ids = model.tokenize("abc")
    a = local.completions.create(model=model.name, prompt="abc", max_tokens=3, temperature=0, logprobs=2)
    b = local.completions.create(model=model.name, prompt=ids, max_tokens=3, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    lp = a.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    openai.types.Completion.model_validate(a.model_dump())


@pytest.mark.parametrize("kw,param", [
    ({"temperature": -1}, "temperature"), ({"temperature": 2.1}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.[0].role"),
    ({"messages": [{"role": "user"}]}, "messages.[0].content"),
    ({"messages": ["hi"]}, "messages.[0]"),
    ({"stop": ""}, "stop"), ({"stop": ["ok", ""]}, "stop"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -3}, "max_completion_tokens"), ({"n": 129}, "n"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"999999": 5}}, "logit_bias"), ({"seed": "x"}, "seed"),
    ({"response_format": {"type": "json"}}, "response_format.type"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"extra_body": {"top_k": -1}}, "top_k"), ({"extra_body": {"typical_p": 0.5}}, "typical_p"),
    ({"extra_body": {"min_p": 2}}, "min_p"), ({"model": ""}, "model"),
])
def test_invalid_requests_are_400s_before_the_engine_runs(local, model, kw, param):
    before = model._session.forwarded
    with pytest.raises(BadRequestError) as e:
        local.chat.completions.create(**{"model": model.name, "messages": USER, **kw})
    err = e.value
    assert err.status_code == 400 and err.param == param and err.body["param"] == param
    assert err.body["type"] == "invalid_request_error" and err.code
    assert "Error code: 400" in err.message
    assert model._session.forwarded == before


def test_a_prompt_longer_than_the_context_is_a_400_with_its_code(local, model):
    with pytest.raises(BadRequestError) as e:
        local.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "a" * 400}])
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    with pytest.raises(BadRequestError) as e:
        local.completions.create(model=model.name, prompt="a" * 400)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"


def test_an_unknown_model_is_a_404(local):
    with pytest.raises(NotFoundError) as e:
        local.chat.completions.create(model="no-such-model", messages=USER)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"


def test_closing_a_stream_early_frees_the_model(local, model):
    stream = local.chat.completions.create(model=model.name, messages=USER, max_tokens=40,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    r = local.chat.completions.create(model=model.name, messages=USER, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3


def test_completion_stream_joins_to_the_completion(local, model):
    kw = dict(model=model.name, prompt="abc", max_tokens=10, temperature=0.7, seed=9)
    whole = local.completions.create(**kw)
    chunks = list(local.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
