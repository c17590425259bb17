"""Chat templates: ignis's rendering equals transformers.apply_chat_template on the registry models'
real templates (Qwen2.5, SmolLM2), and bad conversations or templates are typed errors."""
from __future__ import annotations

import pytest

from ignis.tokenizer import ChatTemplateError, render_chat_template

from test_tokenizer_support import FAMILIES, ours, reference, tokenizer_files

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city <b>now</b> & later.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {"name": "now", "description": "Current time.",
                                              "parameters": {"type": "object", "properties": {}}}}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Say hi."}],
    "multi_turn": [{"role": "system", "content": "Be kind."},
                   {"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3? 你好 👍🏽\n\ttabs  and <|im_end|> text"}],
    "no_system_multi_turn": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                             {"role": "user", "content": "c"}],
    "tool_calls": [{"role": "user", "content": "Weather in Paris and the time?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris"}}},
                       {"type": "function", "function": {"name": "now", "arguments": {}}}]},
                   {"role": "tool", "content": "{\"temp\": 21}"},
                   {"role": "tool", "content": "12:00"},
                   {"role": "assistant", "content": "21 degrees at noon."}],
    "empty_content": [{"role": "user", "content": ""}],
}


@pytest.fixture(scope="module", params=FAMILIES)
def family_pair(request):
    transformers = pytest.importorskip("transformers")
    family = request.param
    cfg = tokenizer_files(family)["tokenizer_config.json"]
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=reference(family), chat_template=cfg["chat_template"],
        **{k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)})
    return family, ours(family), theirs


def _render_both(tok, theirs, messages, **kw):
    def run(f):
        try:
            return f()
        except Exception as exc:  # compare failures too: both must refuse
            return ("error", exc)
    mine = run(lambda: tok.apply_chat_template(messages, **kw))
    ref = run(lambda: theirs.apply_chat_template(messages, tokenize=False, **kw))
    return mine, ref


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL, TIME_TOOL]])
def test_rendering_equals_transformers(family_pair, name, add_generation_prompt, tools):
    family, tok, theirs = family_pair
    mine, ref = _render_both(tok, theirs, CONVERSATIONS[name], tools=tools,
                             add_generation_prompt=add_generation_prompt)
    if isinstance(ref, tuple):
        assert isinstance(mine, tuple) and isinstance(mine[1], ChatTemplateError), (mine, ref)
    else:
        assert mine == ref


def test_extra_kwargs_reach_the_template(family_pair):
    family, tok, theirs = family_pair
    template = "{{ bos_token }}|{{ eos_token }}|{{ greeting }}|{{ messages | length }}|" \
               "{{ tools | tojson }}{% if add_generation_prompt %}GEN{% endif %}"
    kw = dict(chat_template=template, greeting="héllo <b>", tools=[TIME_TOOL], add_generation_prompt=True)
    mine, ref = _render_both(tok, theirs, CONVERSATIONS["user_only"], **kw)
    assert mine == ref and "héllo <b>" in mine


def test_qwen_prompt_renders_as_expected_without_transformers():
    # Fixed expectation for the default model, so the template path is checked even where
    # transformers is not installed.
    tok = ours("qwen2.5")
    text = tok.apply_chat_template(CONVERSATIONS["system_user"], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids[0] == tok.token_to_id("<|im_start|>") and tok.token_to_id("<|im_end|>") in ids


@pytest.mark.parametrize("messages, match", [
    ("hello", "list of dicts"),
    ([{"role": "user"}], "no content"),
    ([{"role": "wizard", "content": "x"}], "role 'wizard'"),
    ([{"content": "x"}], "role None"),
    (["just a string"], "not a dict"),
    ([{"role": "user", "content": 5}], "content is a int"),
    ([{"role": "user", "content": "x", "meta": object()}], "JSON-like"),
])
def test_malformed_messages_are_typed_errors(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        ours("smollm2").apply_chat_template(messages)


@pytest.mark.parametrize("template, match", [
    ("{% if %}", "syntax error"),
    ("{{ raise_exception('no system role here') }}", "no system role here"),
    ("{{ ''.__class__.__mro__ }}", "failed to render"),
    ("{{ messages[5]['content'] }}", "failed"),
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "failed"),
])
def test_template_failures_are_typed_errors(template, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_chat_template(template, [{"role": "user", "content": "hi"}])


def test_missing_template_is_a_typed_error():
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        render_chat_template(None, [{"role": "user", "content": "hi"}])


def test_template_cannot_mutate_the_callers_messages():
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% set _ = messages.append(1) %}", messages)
    assert messages == [{"role": "user", "content": "hi"}]
