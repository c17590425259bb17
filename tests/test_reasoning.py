"""Qwen3 thinking: enable_thinking passed into the chat template, the <think> part of an answer
returned as reasoning_content (whole and streamed), earlier turns' reasoning dropped by the
template. The template is Qwen3's published one (tests/data/templates/qwen3.jinja: the
chat_template of Qwen/Qwen3-0.6B's tokenizer_config.json, the text also quoted in SkyRL's
templates README as "the official Qwen3 jinja template"); rendering is checked against
transformers' apply_chat_template, the splitting by feeding answer text through the splitter, and
the API on a tiny random Qwen3 made by transformers' own Qwen3ForCausalLM."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

import ignis
from ignis.generate.constrain import ConstraintFailed
from ignis.generate.reasoning import ReasoningSplitter, opens_in_prompt

TEMPLATE = (Path(__file__).parent / "data" / "templates" / "qwen3.jinja").read_text()
ANSWER = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello! How can I help?"


def pieces(text: str, seed: int) -> list[str]:
    rng, out, at = random.Random(seed), [], 0
    while at < len(text):
        n = rng.randint(1, 5)
        out.append(text[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("text,open_in_prompt,want", [
    (ANSWER, False, ("The user greets me.\nI greet back.", "Hello! How can I help?")),
    ("Hello there.", False, (None, "Hello there.")),                   # enable_thinking=False
    ("<think>\nstill thinking when max_tokens", False, ("still thinking when max_tokens", None)),
    ("reasoning\n</think>\n\nanswer", True, ("reasoning", "answer")),  # <think> in the prompt
    ("<thin", False, (None, "<thin")),
    ("<think></think>ok", False, (None, "ok")),
])
@pytest.mark.parametrize("seed", range(3))
def test_the_splitter_whole_and_streamed(text, open_in_prompt, want, seed):
    assert ReasoningSplitter(open_in_prompt=open_in_prompt).split(text) == want
    s = ReasoningSplitter(open_in_prompt=open_in_prompt)
    got = {"reasoning": "", "content": ""}
    for p in pieces(text, seed):
        for kind, t in s.feed(p):
            got[kind] += t
    for kind, t in s.finish():
        got[kind] += t
    assert (got["reasoning"] or None, got["content"] or None) == want


def test_opens_in_prompt():
    assert opens_in_prompt("<|im_start|>assistant\n<think>\n")
    assert not opens_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_in_prompt("<|im_start|>assistant\n")


# ---- the template: rendered as transformers renders it -------------------------------------------

CONVERSATION = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nHello!"},
    {"role": "user", "content": "2+2?"},
]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """A tiny random Qwen3 (transformers' Qwen3ForCausalLM, saved by save_pretrained) with the
    tiny tokenizer and Qwen3's chat template."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_compare import spread_weights
    from tiny_models import TOKENIZER_DATA
    cfg = transformers.Qwen3Config(vocab_size=272, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, eos_token_id=258)
    torch.manual_seed(3)
    model = spread_weights(transformers.Qwen3ForCausalLM(cfg).eval(), norm=1.0, embed=0.5)
    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    model.save_pretrained(path)
    shutil.copy(TOKENIZER_DATA / "tiny-tokenizer.json", path / "tokenizer.json")
    tc = json.loads((TOKENIZER_DATA / "tiny-tokenizer_config.json").read_text())
    tc["chat_template"] = TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    return path


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    m = ignis.load(str(qwen3_dir), n_ctx=1024, threads=1)
    yield m
    m.weights.close()


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}, {"enable_thinking": False}])
def test_rendering_equals_transformers(qwen3, kwargs):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3.path / "tokenizer.json"))
    want = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True,
                                  chat_template=TEMPLATE, **kwargs)
    got = qwen3.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, **kwargs)
    assert got == want
    assert "old reasoning" not in got            # earlier turns' reasoning is dropped
    assert got.endswith("<think>\n\n</think>\n\n") == (kwargs.get("enable_thinking") is False)
    assert qwen3.chat_prompt_ids(CONVERSATION, **kwargs) == hf.encode(want)


def test_reasoning_content_through_the_client(qwen3):
    """A random model does not write tags on cue: guided_choice holds it to one answer with a
    think block, and the message (whole, streamed, and over `ignis serve` with the openai
    client) has the block as reasoning_content and the rest as content."""
    pytest.importorskip("llguidance")
    c = ignis.Client([qwen3])
    assert qwen3.thinking
    kw = dict(model=qwen3.name, messages=CONVERSATION, max_tokens=60,
              extra_body={"guided_choice": ["<think>\na\n</think>\n\nb"]})
    r = c.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert (msg.reasoning_content, msg.content) == ("a", "b")
    got = {"reasoning": "", "content": ""}
    for ch in c.chat.completions.create(stream=True, **kw):
        for d in json.loads(ch.model_dump_json())["choices"]:
            got["reasoning"] += d["delta"].get("reasoning_content") or ""
            got["content"] += d["delta"].get("content") or ""
    assert got == {"reasoning": "a", "content": "b"}


def test_reasoning_items_of_the_responses_api(qwen3):
    """The Responses API gives a think block as a reasoning item (reasoning_text content) before
    the message, whole and streamed (response.reasoning_text.delta/done), in the SDK's types; a
    reasoning item sent back as input is dropped, as the template drops earlier reasoning."""
    pytest.importorskip("llguidance")
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter
    c = ignis.Client([qwen3])
    kw = dict(model=qwen3.name, input=CONVERSATION[-1]["content"], max_output_tokens=60,
              extra_body={"guided_choice": ["<think>\na\n</think>\n\nb"]})
    r = c.responses.create(**kw)
    Response.model_validate(r.model_dump())
    assert [o["type"] for o in r.output] == ["reasoning", "message"]
    assert r.output[0]["content"] == [{"type": "reasoning_text", "text": "a"}]
    assert r.output_text == "b" and r.status == "completed"
    events = list(c.responses.create(stream=True, **kw))
    for e in events:
        TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump())
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "a"
    assert [o["content"] for o in events[-1]["response"]["output"]] == \
        [o["content"] for o in r.output]
    again = c.responses.create(model=qwen3.name, max_output_tokens=3, temperature=0,
                               input=[{"role": "user", "content": "hi"}, *r.output,
                                      {"role": "user", "content": "more"}])
    same = c.responses.create(model=qwen3.name, max_output_tokens=3, temperature=0,
                              input=[{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "b"},
                                     {"role": "user", "content": "more"}])
    assert again.usage["input_tokens"] == same.usage["input_tokens"]


def test_reasoning_content_over_ignis_serve(qwen3_dir, tmp_path):
    pytest.importorskip("llguidance")
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import Server
    s = Server(qwen3_dir, tmp_path / "server.log", "--ctx", "1024")
    try:
        api = s.client()
        kw = dict(model=qwen3_dir.name, messages=CONVERSATION, max_tokens=60,
                  extra_body={"guided_choice": ["<think>\na\n</think>\n\nb"]})
        msg = api.chat.completions.create(**kw).choices[0].message
        assert (msg.model_extra["reasoning_content"], msg.content) == ("a", "b")
        got = {"reasoning": "", "content": ""}
        for ch in api.chat.completions.create(stream=True, **kw):
            for d in ch.choices:
                got["reasoning"] += (d.delta.model_extra or {}).get("reasoning_content") or ""
                got["content"] += d.delta.content or ""
        assert got == {"reasoning": "a", "content": "b"}
    finally:
        s.stop()


# ---- tools on a thinking template: reasoning is never constrained --------------------------------

FN = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def _feed(m, con, text):
    import numpy as np
    for t in m.tokenize(text, add_special_tokens=False):
        logits = np.zeros(m.config.vocab_size)
        con.mask(logits)
        assert np.isfinite(logits[t]), f"token {t} of {text!r} masked"
        con.accept(t)


def _armed(m, con) -> bool:
    import numpy as np
    logits = np.zeros(m.config.vocab_size)
    con.mask(logits)
    return not np.isfinite(logits).all()


def test_auto_does_not_arm_inside_a_think_block(qwen3):
    pytest.importorskip("llguidance")
    from ignis.generate.tools import check_tools
    prompt = qwen3.chat_prompt_ids(CONVERSATION, tools=[FN])
    con = qwen3.chat_constraint(check_tools([FN], "auto"), prompt)
    _feed(qwen3, con, "<think>\nI could write <tool_call> here, or not.")
    assert not _armed(qwen3, con)                  # </think> can still come
    _feed(qwen3, con, "\n</think>\n\nSure.\n<tool_call>")
    assert _armed(qwen3, con)                      # a call begun after the block is held


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_required_calls_may_follow_reasoning(qwen3, choice):
    pytest.importorskip("llguidance")
    from ignis.generate.tools import check_tools
    req = check_tools([FN], choice)
    prompt = qwen3.chat_prompt_ids(CONVERSATION, tools=[FN])
    for text in ("<think>x</think>\n" + CALL, "<think>\nsome <tool_call> thought\n</think>\n\n" + CALL,
                 CALL):
        con = qwen3.chat_constraint(req, prompt)
        _feed(qwen3, con, text)
        assert con.accepting, text
    # enable_thinking false: the template closed the block, the answer is only calls
    prompt = qwen3.chat_prompt_ids(CONVERSATION, tools=[FN], enable_thinking=False)
    con = qwen3.chat_constraint(req, prompt, enable_thinking=False)
    with pytest.raises((AssertionError, ConstraintFailed)):
        _feed(qwen3, con, "<think>x</think>\n" + CALL)
    # a second </think> is not reasoning
    con = qwen3.chat_constraint(req, qwen3.chat_prompt_ids(CONVERSATION, tools=[FN]))
    with pytest.raises((AssertionError, ConstraintFailed)):
        _feed(qwen3, con, "<think>x</think></think>" + CALL)


def test_a_think_block_in_an_answer_is_reasoning_content(qwen3):
    """What a Qwen3 answer looks like, fed to the API's reader (a random model does not write
    tags on cue): reasoning apart from content, and calls read from the content only."""
    from ignis.api.client import _Answer
    tools = None
    a = _Answer(qwen3, qwen3.chat_prompt_ids(CONVERSATION), tools)
    msg = a.message(ANSWER)
    assert msg.reasoning_content == "The user greets me.\nI greet back."
    assert msg.content == "Hello! How can I help?"
    from ignis.generate.tools import check_tools
    req = check_tools([{"type": "function", "function": {"name": "f"}}])
    a = _Answer(qwen3, qwen3.chat_prompt_ids(CONVERSATION), req)
    text = ('<think>\nI should call f. <tool_call>{"name": "g", "arguments": {}}</tool_call>\n</think>'
            '\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    msg = a.message(text)
    assert msg.content is None and "<tool_call>" in msg.reasoning_content
    assert [(t.function.name, t.function.arguments) for t in msg.tool_calls] == [("f", '{"x": 1}')]
    assert a.finish_reason("stop") == "tool_calls"


def test_one_hold_back_rule_for_every_stream_reader():
    """Stop strings, </think> and <tool_call> are held back by the same helper: what the stop
    matcher releases of a text ending in part of a marker is what the reasoning and tool readers
    release, for every cut of every marker."""
    from ignis.generate import loop, markers, reasoning, tools
    assert reasoning.partial_suffix is tools.partial_suffix is markers.partial_suffix
    for marker in ("</think>", "<tool_call>", "END"):
        text = "some answer " + marker
        for cut in range(len(text) + 1):
            t = text[:cut]
            held = markers.partial_suffix(t, marker)
            assert loop.StopMatcher([marker]).safe_end(t, 0) == len(t) - held
            assert held == next((n for n in range(len(marker) - 1, 0, -1)
                                 if len(t) >= n and marker.startswith(t[-n:])), 0)
