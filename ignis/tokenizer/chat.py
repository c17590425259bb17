"""Chat templates: render a model's Jinja chat_template the way transformers.apply_chat_template does.

Same environment (sandboxed, immutable, trim_blocks, lstrip_blocks, loop controls), same helpers
(raise_exception, a tojson that does not HTML-escape, strftime_now), same variables (messages, tools,
documents, add_generation_prompt, the special tokens, extra keyword arguments). Messages are checked
first, and every template failure becomes a ChatTemplateError.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterator

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ignis.tokenizer.errors import ChatTemplateError

ROLES = ("system", "user", "assistant", "tool", "developer")


class _TemplateRaised(Exception):
    """raise_exception() was called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # transformers replaces Jinja's tojson, which HTML-escapes '<', '>' and '&'.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template has a syntax error at line {exc.lineno}: "
                                f"{exc.message}") from None


def _plain(value: Any, where: str) -> Any:
    """Copy of value in plain JSON types, so the template sees no foreign objects or methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise ChatTemplateError(f"{where} holds a {type(value).__name__}; chat template inputs must be "
                            f"JSON-like (str, int, float, bool, None, list, dict)")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated copy of a conversation: a list of {"role": ..., "content": ...} dicts.

    Keys whose value is None are dropped (as transformers does), so templates see them as undefined.
    An assistant message may have tool_calls instead of content.
    """
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, not {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i} is a {type(m).__name__}, not a dict with role and "
                                    f"content")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"message {i} has role {role!r}; expected one of {ROLES}")
        content = m.get("content")
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise ChatTemplateError(f"message {i} ({role}) has no content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatTemplateError(f"message {i} ({role}) content is a {type(content).__name__}; "
                                    f"expected a string (or a list of content parts)")
        out.append({k: _plain(v, f"message {i} field {k!r}") for k, v in m.items() if v is not None})
    return out


# Sentinels for masked special-token text: private-use characters (planes 15 and 16), which no
# template or tokenizer gives a meaning to.
_SENTINELS = (range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


@lru_cache(maxsize=16)
def _alternation(texts: tuple[str, ...]) -> "re.Pattern[str] | None":
    return re.compile("|".join(re.escape(t) for t in texts)) if texts else None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def mask_strings(value: Any, texts: list[str], *, avoid: str = "") -> tuple[Any, dict[str, str]]:
    """value with every occurrence of `texts` (special-token spellings, longest first) in its strings,
    dict keys included, replaced by one private-use character per distinct text, chosen absent from
    value's strings and from `avoid` (the template). Returns (masked value, {character: text});
    value itself when nothing matched. The chat template then renders text in which the only
    special-token spellings are its own markup."""
    pattern = _alternation(tuple(texts))
    if pattern is None or not any(pattern.search(s) for s in _strings(value)):
        return value, {}
    used = set(avoid)
    for s in _strings(value):
        used.update(s)
    free = (chr(c) for r in _SENTINELS for c in r if chr(c) not in used)
    sentinel: dict[str, str] = {}

    def replace(m: "re.Match[str]") -> str:
        t = m.group()
        if t not in sentinel:
            c = next(free, None)
            if c is None:
                raise ChatTemplateError("the conversation uses every private-use character; "
                                        "cannot keep its special-token text apart from the template's")
            sentinel[t] = c
        return sentinel[t]

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return pattern.sub(replace, v)
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        return v

    masked = walk(value)
    return masked, {c: t for t, c in sentinel.items()}


def render_chat_template(template: str | None, messages: list[dict[str, Any]], *,
                         tools: list[dict[str, Any]] | None = None,
                         documents: list[dict[str, Any]] | None = None,
                         add_generation_prompt: bool = False,
                         special_tokens: dict[str, str] | None = None, **kwargs: Any) -> str:
    """The prompt text a chat template renders for a conversation.

    special_tokens (bos_token, eos_token, ...) are visible to the template; kwargs override them.
    """
    if not template:
        raise ChatTemplateError("this tokenizer has no chat_template; pass one explicitly")
    compiled = _compile(template)
    msgs = check_messages(messages)
    if "developer" not in template:
        # OpenAI's developer role is the system role for instructions; a template that does not
        # know it would drop those messages or show the model a role it was never trained on.
        msgs = [{**m, "role": "system"} if m["role"] == "developer" else m for m in msgs]
    if tools is not None:
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
            raise ChatTemplateError("tools must be a list of JSON-schema dicts")
        tools = _plain(tools, "tools")
    if documents is not None:
        if not isinstance(documents, (list, tuple)) or not all(isinstance(d, dict) for d in documents):
            raise ChatTemplateError("documents must be a list of dicts")
        documents = _plain(documents, "documents")
    variables = {**(special_tokens or {}), **_plain(kwargs, "keyword arguments")}
    try:
        return compiled.render(messages=msgs, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"the chat template refused the conversation: {exc}") from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed to render: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ChatTemplateError(f"the chat template failed on this conversation: "
                                f"{type(exc).__name__}: {exc}") from None
