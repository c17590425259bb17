"""Sampling parameters: one validated dataclass per request, defaults from generation_config.json.

Every check happens here, before a token reaches the engine; ranges follow the OpenAI API where it
defines one (temperature 0..2, penalties -2..2, logit_bias -100..100, top_logprobs 0..20, 4 stops).
Also the checks every request value shares, whoever reads it (ignis.Client, `ignis serve`): text is
valid Unicode, and lists and objects nest at most MAX_NESTING deep.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from ..loader.config import GenerationConfig
from .errors import InvalidParameterError

MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20
# lists and objects inside one another in one request, the body itself being level 1: OpenAI's
# schemas need a handful; a cap keeps every later walk (a repr, a template, json.dumps) shallow
MAX_NESTING = 64
# a lone surrogate can be sent (JSON "\\ud800") but is no character: it has no UTF-8 bytes to match
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = {int, float, bool, type(None)}


# ---- request values: checks shared by every reader of a request -----------------------------------

def lone_surrogate(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate in `text`, or None. JSON can spell one ("\\ud800",
    the Node SDK sends them), but it is no character and has no UTF-8 bytes to tokenize."""
    if text.isascii():
        return None
    bad = _SURROGATE.search(text)
    return bad.start() if bad else None


def field_name(parent: str | None, key: str) -> str:
    """The `param` naming field `key` under `parent` ("" or None: the top level), lone surrogates
    shown as escapes ("\\ud800") so that an error naming it can still be sent as UTF-8."""
    if lone_surrogate(key) is not None:
        key = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{parent}.{key}" if parent else key


def check_text(text: str, param: str, *, what: str | None = None) -> None:
    """InvalidParameterError (invalid_value, naming `param`) if `text` holds a lone surrogate;
    `what` says what the text is when it is not the value of `param` (a field's name)."""
    at = lone_surrogate(text)
    if at is not None:
        raise InvalidParameterError(
            f"{what or param} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff, at "
            f"character {at}), which is not valid Unicode text; send characters outside the Basic "
            f"Multilingual Plane whole (or as a surrogate pair in JSON)", param=param)


def check_request_value(value: Any, param: str | None, *, level: int = 1, texts: bool = True) -> None:
    """Refuse, naming the place, a request value whose lists and objects nest more than
    MAX_NESTING deep, or (with `texts`) with a lone surrogate in a string or an object key.
    `level`: the nesting level of `value` itself (the request body is 1, its fields' values 2).
    A loop, not a recursion, so any depth is refused rather than overflowing the stack; the first
    fault in document order is reported, as an InvalidParameterError (invalid_value)."""
    # (parent's index, own label): a field name, or a list index; paths are spelled only on a fault
    labels: list[tuple[int, str | int]] = [(-1, param or "")]

    def path(node: int) -> str:
        parts = []
        while node >= 0:
            node, label = labels[node]
            if isinstance(label, int):
                parts.append(f"[{label}]")
            elif label or node >= 0:      # a field named "" is spelled so (the root has no name)
                parts.append(label or '""')
        return ".".join(reversed(parts))

    todo: list[tuple[Any, int, int]] = [(value, 0, level)]  # value, its label, its level
    while todo:
        v, node, depth = todo.pop()
        if isinstance(v, str):
            if texts:
                check_text(v, path(node))
            continue
        keyed = isinstance(v, Mapping)
        if not keyed and not isinstance(v, (list, tuple)):
            continue
        if depth > MAX_NESTING:
            where = path(node)
            shown = where if len(where) <= 60 else where[:60] + "..."
            raise InvalidParameterError(
                f"{shown or 'the request body'} is nested too deeply: lists and objects may sit at "
                f"most {MAX_NESTING} levels deep in a request (the body is level 1)", param=where)
        children = []
        for k, x in (v.items() if keyed else enumerate(v)):
            if keyed:
                if not isinstance(k, str):
                    k = str(k)
                elif texts and lone_surrogate(k) is not None:
                    name = field_name(path(node), k)
                    check_text(k, name, what=f"the field name '{name}'")
            if type(x) in _SCALARS or isinstance(x, str) and not (texts and lone_surrogate(x) is not None):
                continue           # numbers and clean text need no label
            if isinstance(x, (str, list, tuple, Mapping)):
                labels.append((node, k))
                children.append((x, len(labels) - 1, depth + 1))
        todo.extend(reversed(children))


MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """What one generation request asks for. temperature == 0 means greedy (argmax)."""
    max_tokens: int | None = None          # None: until an EOS, a stop string, or the context end
    # the caller chose max_tokens (not generation_config.json): a prompt + max_tokens past the
    # context is then an error (OpenAI's rule), never a silently shorter answer
    max_tokens_given: bool = False
    temperature: float = 1.0
    top_k: int = 0                         # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0        # HF/CTRL rule over prompt + output; 1.0: off
    presence_penalty: float = 0.0          # OpenAI rule over the output only
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    eos_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        # below MIN_TEMPERATURE dividing the logits by it overflows: that is argmax (vLLM's rule)
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


def _number(name: str, v: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    left = "(" if lo_open else "["
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidParameterError(f"{name} must be a number, got {v!r:.40}", param=name,
                                    code="invalid_type")
    try:
        f = float(v)
    except OverflowError:           # an integer past the float range
        f = math.inf
    if not math.isfinite(f) or f < lo or f > hi or (lo_open and f == lo):
        raise InvalidParameterError(f"{name} must be a number in {left}{lo:g}, {hi:g}], got "
                                    f"{v!r:.40}", param=name)
    return f


def _int(name: str, v: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool):
        raise InvalidParameterError(f"{name} must be an integer, got {v!r}", param=name,
                                    code="invalid_type")
    try:
        i = operator.index(v)
    except TypeError:
        raise InvalidParameterError(f"{name} must be an integer, got {v!r}", param=name,
                                    code="invalid_type") from None
    if i < lo or (hi is not None and i > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidParameterError(f"{name} must be an integer {rng}, got {i}", param=name)
    return i


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)):
        raise InvalidParameterError(f"stop must be a string or a list of strings, got "
                                    f"{type(stop).__name__}", param="stop", code="invalid_type")
    if len(items) > MAX_STOPS:
        raise InvalidParameterError(f"stop takes at most {MAX_STOPS} strings, got {len(items)}",
                                    param="stop")
    for s in items:
        if not isinstance(s, str):
            raise InvalidParameterError(f"stop strings must be strings, got {s!r}", param="stop",
                                        code="invalid_type")
        check_text(s, "stop", what=f"stop string {s!r:.60}")
        if not s:
            raise InvalidParameterError("stop strings must not be empty (an empty string would "
                                        "match before the first token)", param="stop")
    return tuple(dict.fromkeys(items))


def _logit_bias(bias: Any, vocab_size: int) -> dict[int, float]:
    if bias is None:
        return {}
    if not isinstance(bias, Mapping):
        raise InvalidParameterError(f"logit_bias must map token ids to numbers, got "
                                    f"{type(bias).__name__}", param="logit_bias", code="invalid_type")
    out = {}
    for k, v in bias.items():
        # JSON object keys are strings: accept "123" as the official API does
        try:
            tid = int(k) if isinstance(k, str) else operator.index(k)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"logit_bias key {k!r} is not a token id", param="logit_bias",
                                        code="invalid_type") from None
        if isinstance(k, bool) or not 0 <= tid < vocab_size:
            raise InvalidParameterError(f"logit_bias key {k!r} is not a token id of this model "
                                        f"(0..{vocab_size - 1})", param="logit_bias")
        out[tid] = _number("logit_bias", v, -100.0, 100.0)
    return out


def resolve_params(defaults: GenerationConfig, *, vocab_size: int, **overrides: Any) -> SamplingParams:
    """Validated SamplingParams: `overrides` (None = not given) over the model's generation defaults.

    A model whose generation_config.json says do_sample=false is greedy unless the call passes a
    temperature; one that samples takes its temperature/top_k/top_p/min_p/repetition_penalty.
    A max_tokens given here is the caller's (max_tokens_given): Generation refuses a prompt that
    leaves less room than that; generation_config's max_new_tokens only caps the answer.
    """
    known = {f for f in SamplingParams.__dataclass_fields__} - {"max_tokens_given"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidParameterError(f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}",
                                    param=unknown[0], code="unknown_parameter")
    g = {k: v for k, v in overrides.items() if v is not None}
    sampling = defaults.do_sample
    p = SamplingParams(
        max_tokens=defaults.max_new_tokens,
        temperature=defaults.temperature if sampling else 0.0,
        top_k=defaults.top_k if sampling else 0,
        top_p=defaults.top_p if sampling else 1.0,
        min_p=defaults.min_p if sampling else 0.0,
        repetition_penalty=defaults.repetition_penalty,
        eos_token_ids=tuple(defaults.eos_token_ids))
    if "max_tokens" in g:
        g["max_tokens"] = _int("max_tokens", g["max_tokens"], 1)
        g["max_tokens_given"] = True
    if "temperature" in g:
        g["temperature"] = _number("temperature", g["temperature"], 0.0, 2.0)
    if "top_k" in g:
        g["top_k"] = _int("top_k", g["top_k"], 0)
    if "top_p" in g:
        g["top_p"] = _number("top_p", g["top_p"], 0.0, 1.0, lo_open=True)
    if "min_p" in g:
        g["min_p"] = _number("min_p", g["min_p"], 0.0, 1.0)
    if "repetition_penalty" in g:
        g["repetition_penalty"] = _number("repetition_penalty", g["repetition_penalty"], 0.0, 10.0,
                                          lo_open=True)
    for name in ("presence_penalty", "frequency_penalty"):
        if name in g:
            g[name] = _number(name, g[name], -2.0, 2.0)
    if "logit_bias" in g:
        g["logit_bias"] = _logit_bias(g["logit_bias"], vocab_size)
    if "seed" in g:
        g["seed"] = _int("seed", g["seed"], -(2 ** 63), 2 ** 64 - 1)
    if "stop" in g:
        g["stop"] = _stops(g["stop"])
    for name in ("logprobs", "ignore_eos"):
        if name in g and not isinstance(g[name], bool):
            raise InvalidParameterError(f"{name} must be true or false, got {g[name]!r}", param=name,
                                        code="invalid_type")
    if "top_logprobs" in g:
        g["top_logprobs"] = _int("top_logprobs", g["top_logprobs"], 0, MAX_TOP_LOGPROBS)
        if g["top_logprobs"] > 0 and not g.get("logprobs", False):
            raise InvalidParameterError("top_logprobs needs logprobs=true", param="top_logprobs")
    if "eos_token_ids" in g:
        ids: Sequence[Any] = g["eos_token_ids"]
        g["eos_token_ids"] = tuple(_int("eos_token_ids", i, 0, vocab_size - 1) for i in ids)
    return replace(p, **g)
