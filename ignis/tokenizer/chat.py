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
from typing import Any, Iterator, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ignis.tokenizer.errors import ChatTemplateError

ROLES = ("system", "user", "assistant", "tool", "developer")
# the tokenizer_config.json special tokens a template sees (apply_chat_template passes them)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
MAX_DEPTH = 64          # nesting of lists and dicts in a conversation (JSON schemas included)


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


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def template_globals() -> frozenset[str]:
    """Names a template sees that the renderer itself sets: the environment's globals (Jinja's
    range, namespace, ... and raise_exception, strftime_now), the conversation's variables and
    the special tokens. A caller's extra variable under one of them would replace the renderer's."""
    return frozenset(_environment().globals) | {"messages", "tools", "documents",
                                                 "add_generation_prompt", *SPECIAL_TOKEN_NAMES}


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = _environment()
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template has a syntax error at line {exc.lineno}: "
                                f"{exc.message}") from None


def _plain(value: Any, where: str, depth: int = 0) -> Any:
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
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        raise ChatTemplateError(f"{where} is nested more than {MAX_DEPTH} lists or objects deep")
    if isinstance(value, dict):
        return {_plain(k, where, depth + 1): _plain(v, where, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where, depth + 1) for v in value]
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


# Masks for added-token text in strings: private-use characters (planes 15 and 16), which no
# template or tokenizer gives a meaning to.
_PRIVATE_USE = (range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


def _strings(value: Any) -> Iterator[str]:
    """Every string in value, dict keys included, depth-first; ChatTemplateError past MAX_DEPTH."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ChatTemplateError(f"the conversation is nested more than {MAX_DEPTH} lists or "
                                        f"objects deep")
            items = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
            stack.extend((x, depth + 1) for x in reversed(items))


class TextMasker:
    """Keeps a tokenizer's added-token text in a conversation's strings from becoming tokens.

    Each whole spelling of an added token in a string becomes one private-use character; a string
    that begins or ends with part of a spelling gets a fence (another private-use character, which
    stands for nothing) on that side, so no token can form where the template joins two strings or
    a string and its own text. After the template renders, the tokenizer matches its added tokens
    (now only the template's markup) and puts the masked text back, as plain text, before BPE."""

    def __init__(self, texts: Sequence[str]):
        from ignis.tokenizer.tokenizer import longest_match_pattern
        texts = sorted({t for t in texts if t}, key=len, reverse=True)
        # the longest spelling at each position, cheap to scan with thousands (Gemma: 6,384)
        self.pattern = longest_match_pattern(texts) if texts else None
        # parts of spellings a string may start or end with (whitespace alone joins nothing useful
        # and is left alone, so trimming templates still trim)
        self.heads = {t[:i] for t in texts for i in range(1, len(t)) if t[:i].strip()}
        self.tails = {t[i:] for t in texts for i in range(1, len(t)) if t[i:].strip()}
        self.longest = max(map(len, texts), default=0)

    def _edges(self, s: str) -> tuple[bool, bool]:
        """Whether s starts with the tail of a spelling, and whether it ends with the head of one."""
        n = min(len(s), self.longest - 1)
        return (any(s[:k] in self.tails for k in range(1, n + 1)),
                any(s[-k:] in self.heads for k in range(1, n + 1)))

    def mask(self, value: Any, *, avoid: str = "") -> tuple[Any, dict[str, str]]:
        """value with its strings masked, and {mask character: the text it stands for} (fences
        stand for ""); value itself and {} when no string needs it. Masks are chosen absent from
        value's strings and from `avoid` (the template)."""
        if self.pattern is None:
            return value, {}
        strings = list(_strings(value))
        if not any(self.pattern.search(s) or any(self._edges(s)) for s in strings):
            return value, {}
        used = set(avoid).union(*strings)
        free = (chr(c) for r in _PRIVATE_USE for c in r if chr(c) not in used)
        masks: dict[str, str] = {}

        def mask_of(text: str) -> str:
            if text not in masks:
                c = next(free, None)
                if c is None:
                    raise ChatTemplateError("the conversation uses every private-use character; "
                                            "cannot keep its token text apart from the template's")
                masks[text] = c
            return masks[text]

        def one(s: str) -> str:
            starts, ends = self._edges(s)
            s = self.pattern.sub(lambda m: mask_of(m.group()), s)
            return (mask_of("") if starts else "") + s + (mask_of("") if ends else "")

        def walk(v: Any) -> Any:        # depth already bounded by _strings
            if isinstance(v, str):
                return one(v)
            if isinstance(v, dict):
                return {walk(k): walk(x) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x) for x in v]
            if isinstance(v, tuple):
                return tuple(walk(x) for x in v)
            return v

        masked = walk(value)
        return masked, {c: t for t, c in masks.items()}


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
