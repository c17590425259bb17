"""Sampling parameters: one validated dataclass per request, defaults from generation_config.json.

Every check happens here, before a token reaches the engine; ranges follow the OpenAI API where it
defines one (temperature 0..2, penalties -2..2, logit_bias -100..100, top_logprobs 0..20, 4 stops).
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
# a lone surrogate can be sent (JSON "\\ud800") but is no character: it has no UTF-8 bytes to match
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_TOP_LOGPROBS = 20


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
        return self.temperature == 0.0 or self.top_k == 1


def _number(name: str, v: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidParameterError(f"{name} must be a number, got {v!r}", param=name,
                                    code="invalid_type" if not isinstance(v, (int, float)) else "invalid_value")
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise InvalidParameterError(f"{name} must be in {left}{lo:g}, {hi:g}], got {v!r}", param=name)
    return float(v)


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
        bad = _SURROGATE.search(s)
        if bad:
            raise InvalidParameterError(
                f"stop string {s!r:.60} holds a lone UTF-16 surrogate ({bad.group()!r} at "
                f"{bad.start()}), which is not Unicode text", param="stop")
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
