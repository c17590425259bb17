"""ignis.Client: the OpenAI Python client's interface, answered by local models in-process.

    client = ignis.Client()                      # instead of openai.OpenAI()
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b-instruct",
                                       messages=[{"role": "user", "content": "hi"}])
    print(r.choices[0].message.content)

Request fields and results follow the OpenAI API; sampling options OpenAI lacks (top_k, min_p,
repetition_penalty) go through `extra_body` as with the official client. Invalid requests raise
BadRequestError (status_code 400, .message, .body, .param, .code) before a token is computed: every
field is checked against the type the OpenAI API reference gives it (a wrong type is
`invalid_type`, a wrong value `invalid_value`, an unknown field `unknown_parameter`, each naming
the field in `param`), text holding a lone UTF-16 surrogate and values nested more than
MAX_NESTING lists/objects deep included. An explicit max_tokens that does not fit after the prompt is
`context_length_exceeded`, as with OpenAI; without one, generation may run to the end of the context.
client.embeddings.create gives Model.embed's vectors (mean-pooled final hidden states, unit length).
response_format (json_object, json_schema) and extra_body guided_choice / guided_regex /
guided_grammar / guided_json constrain the answer (ignis.generate.constrain; the `structured`
extra), and chat.completions.parse(response_format=PydanticModel) reads it into the model.
client.responses.create is the Responses API (ignis.api.responses), over chat.completions.
n (1..128) asks for several choices (Model.start_choices: choice i seeded seed + i; usage counts
the prompt once); a streamed chunk carries one choice's index.
"""
from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .._version import __version__
from ..errors import IgnisError
from ..generate import Chunk, ContextLengthExceeded, InvalidParameterError, TokenLogprob
from ..generate.constrain import (GUIDED, constraint_spec,
                                  pydantic_response_format, response_format_spec)
from ..generate.reasoning import ReasoningSplitter
from ..generate.tools import ToolCallParser, ToolRequest, check_tools
from ..generate.errors import context_length_message
from ..generate.params import check_request_value, field_name
from .responses import _Responses
from .model import POOLINGS, Choices, Model, check_n, check_template_kwargs
from .types import (AttrDict, ChatCompletion, ChatCompletionChunk, ChatCompletionMessage,
                    ChatCompletionTokenLogprob, Choice, ChoiceDelta, ChoiceLogprobs, ChunkChoice,
                    Completion, CompletionChoice, CompletionUsage, CreateEmbeddingResponse,
                    Embedding, EmbeddingUsage, Logprobs, ModelInfo, ModelList,
                    ParsedChatCompletionMessage, PromptTokensDetails, TopLogprob)

# extra_body keys ignis understands beyond the OpenAI request fields: sampling options, and the
# constrained-decoding fields under vLLM's names (guided_choice, guided_regex, guided_grammar,
# guided_json)
EXTRA_SAMPLING = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "speculative") + GUIDED
# completions also take split_special_tokens (Hugging Face's name): the raw prompt's special-token
# text ("<|im_end|>") is then plain text, not control tokens; and response_format, which OpenAI's
# completions lack (vLLM takes it there too)
EXTRA_COMPLETIONS = EXTRA_SAMPLING + ("split_special_tokens", "response_format")
# chat also takes the chat template's own variables (vLLM's name), such as Qwen3's
# {"enable_thinking": false}
EXTRA_CHAT = EXTRA_SAMPLING + ("chat_template_kwargs",)
_ROLES = ("system", "developer", "user", "assistant", "tool")
COMPLETIONS_MAX_TOKENS = 16     # OpenAI's default max_tokens for /v1/completions
# the OpenAI API reference's values and limits
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
# the fields each role's message takes, as the OpenAI API reference gives them (openai's
# ChatCompletion*MessageParam); assistant messages also take reasoning_content (vLLM, DeepSeek)
# and annotations (on every response message, so a reply can be sent back as it came)
MESSAGE_FIELDS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls", "refusal", "audio", "function_call",
                  "reasoning_content", "annotations"),
    "tool": ("role", "content", "tool_call_id"),
}
# what the request's own arguments are not: the official client's transport options
_TRANSPORT = ("extra_headers", "extra_query", "timeout")


class APIError(IgnisError):
    """Base of the errors shaped like the official client's (openai.APIStatusError)."""
    status_code = 500

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        self.param = param
        self.code = code
        self.type = type
        self.body = {"message": message, "type": type, "param": param, "code": code}
        self.message = f"Error code: {self.status_code} - {{'error': {self.body!r}}}"
        self.response = None
        self.request = None
        self.request_id = None
        super().__init__(self.message)


class BadRequestError(APIError, ValueError):
    """The request is invalid (what the OpenAI API answers with HTTP 400)."""
    status_code = 400


class LengthFinishReasonError(IgnisError):
    """chat.completions.parse() reached max_tokens before the answer was complete, so there is
    nothing to parse (the official client raises its LengthFinishReasonError there too).
    `completion` is the ChatCompletion that was cut."""

    def __init__(self, completion: Any):
        self.completion = completion
        super().__init__("Could not parse response content as the length limit was reached; "
                         "raise max_tokens (or max_completion_tokens)")


class NotFoundError(APIError, LookupError):
    """The model does not exist here (HTTP 404 in the OpenAI API)."""
    status_code = 404


def _bad(message: str, param: str | None, code: str | None = "invalid_value") -> BadRequestError:
    return BadRequestError(message, param=param, code=code)


def _translate(e: Exception, prompt_param: str = "messages") -> APIError:
    """A generation error as the API's 400; prompt_param names the request field holding the
    prompt ("messages" for chat, "prompt" for completions)."""
    if isinstance(e, ContextLengthExceeded):
        return _bad(context_length_message(e.n_ctx, e.prompt_tokens, e.max_tokens, prompt_param),
                    prompt_param, "context_length_exceeded")
    if isinstance(e, InvalidParameterError):
        return _bad(str(e), e.param, e.code)
    return _bad(str(e), None, None)


# ---- field checks: types and values as the OpenAI API reference gives them ------------------------

def _check_request(fields: dict[str, Any]) -> None:
    """Every value of a request (create()'s arguments): valid Unicode text, object keys included,
    and lists and objects nested at most MAX_NESTING deep, so no later check, repr or template
    walks deeper. A loop: a value nested past Python's recursion limit is a 400 too. extra_body's
    fields are checked as the body's own, as the official client merges them into it."""
    fields = {k: v for k, v in fields.items() if k not in _TRANSPORT and k != "self"}
    extra = fields.pop("extra_body", None)
    try:
        check_request_value(fields, None)
        if isinstance(extra, Mapping):
            check_request_value(extra, None)
        else:
            check_request_value(extra, "extra_body", level=2)
    except InvalidParameterError as e:
        raise _translate(e) from None


def _field(parent: str | None, key: Any) -> str:
    """The `param` naming an unknown field `key` (under `parent`): the parent alone when the key
    is no text (an in-process dict may have any keys)."""
    if not isinstance(key, str) or not key:
        return parent or "extra_body"
    return field_name(parent, key)


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{param} must be a string, got {type(value).__name__}", param, "invalid_type")
    return value


def _optional_bool(value: Any, param: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise _bad(f"{param} must be true or false, got {value!r:.40}", param, "invalid_type")


def _optional_int(value: Any, param: str, lo: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{param} must be an integer, got {value!r:.40}", param, "invalid_type")
    if value < lo:
        raise _bad(f"{param} must be an integer >= {lo}, got {value}", param)
    return value


def _check_user(user: Any) -> None:
    if user is not None:
        _string(user, "user")


def _check_metadata(metadata: Any) -> None:
    """OpenAI: up to 16 pairs; keys strings of at most 64 characters, values of at most 512."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise _bad(f"metadata must be an object of string keys and string values, got "
                   f"{type(metadata).__name__}", "metadata", "invalid_type")
    if len(metadata) > METADATA_PAIRS:
        raise _bad(f"metadata holds at most {METADATA_PAIRS} key-value pairs, got {len(metadata)}",
                   "metadata")
    for k, v in metadata.items():
        _string(k, "metadata")
        if len(k) > METADATA_KEY_CHARS:
            raise _bad(f"metadata key {k!r:.80} is longer than {METADATA_KEY_CHARS} characters",
                       "metadata")
        if not isinstance(v, str):
            raise _bad(f"metadata[{k!r}] must be a string, got {type(v).__name__}", "metadata",
                       "invalid_type")
        if len(v) > METADATA_VALUE_CHARS:
            raise _bad(f"metadata[{k!r}] is longer than {METADATA_VALUE_CHARS} characters",
                       "metadata")


def _check_service_tier(tier: Any) -> None:
    if tier is None:
        return
    if not isinstance(tier, str):
        raise _bad(f"service_tier must be one of {list(SERVICE_TIERS)}, got {tier!r:.40}",
                   "service_tier", "invalid_type")
    if tier not in SERVICE_TIERS:
        raise _bad(f"service_tier must be one of {list(SERVICE_TIERS)}, got {tier!r:.40}",
                   "service_tier")


def _check_transport(extra_headers: Any, extra_query: Any, timeout: Any) -> None:
    """The official client's per-call transport options: accepted (nothing goes over a network
    here) when they have the types it takes."""
    for name, v in (("extra_headers", extra_headers), ("extra_query", extra_query)):
        if v is not None and not isinstance(v, dict):
            raise _bad(f"{name} must be a dict, got {type(v).__name__}", name, "invalid_type")
    if isinstance(timeout, (bool, str, bytes, list, tuple, dict)) or \
            isinstance(timeout, (int, float)) and not timeout >= 0:
        raise _bad(f"timeout must be a number of seconds (or an httpx.Timeout), got {timeout!r:.40}",
                   "timeout", "invalid_type")


class Client:
    """An in-process stand-in for openai.OpenAI. `models`: loaded Model objects, names or paths
    (loaded on first use), or a {name: Model} dict; a name not bound is loaded on demand with
    `load_options` (e.g. {"weight_format": "q8", "n_ctx": 4096})."""

    def __init__(self, models: Any = None, *, load_options: dict[str, Any] | None = None,
                 api_key: str | None = None, base_url: str | None = None,
                 native: str | Any = None, native_options: dict[str, Any] | None = None,
                 **_ignored: Any):
        # api_key/base_url are accepted (and unused) so openai.OpenAI(...) arguments still work
        self._models: dict[str, Model | None] = {}
        # native="DIR": chat and completions are answered by the library `ignis compile` wrote
        # there (ignis.api.native_client), opened now with native_options (ignis_open's options)
        self._native = None
        if native is not None:
            from .native_client import NativeModel
            self._native = NativeModel(native, native_options)
        self._load_options = dict(load_options or {})
        self._lock = threading.Lock()
        if models is None:
            models = []
        if isinstance(models, (Model, str)):
            models = [models]
        if isinstance(models, dict):
            items = list(models.items())
        else:
            items = [(m.name, m) if isinstance(m, Model) else (str(m), None) for m in models]
        for name, m in items:
            if m is not None and not isinstance(m, Model):
                raise TypeError(f"Client models must be ignis Model objects or names, got "
                                f"{type(m).__name__}")
            self._models[name] = m
        self.chat = _Chat(self)
        self.completions = _Completions(self)
        self.embeddings = _Embeddings(self)
        self.models = _Models(self)
        self.responses = _Responses(self)

    def _model(self, name: Any) -> Model:
        if not isinstance(name, str) or not name:
            raise _bad("model must be a non-empty string naming a model", "model", "invalid_type")
        with self._lock:
            m = self._models.get(name)
            if m is None:
                from .load import load
                from ..errors import ModelNotFoundError
                try:
                    m = load(name, **self._load_options)
                except ModelNotFoundError as e:
                    raise NotFoundError(f"The model {name!r} does not exist: {e}", param="model",
                                        code="model_not_found") from None
                self._models[name] = m
            return m

    @property
    def system_fingerprint(self) -> str:
        return f"fp_ignis_{__version__}"

    def close(self) -> None:
        """Close the compiled library's handle (native="DIR"); loaded models stay loaded."""
        if self._native is not None:
            self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- request checks shared by both endpoints ---------------------------------------------------------

def _check_common(*, n: Any, stream: Any, stream_options: Any, extra_body: Any,
                  extra_keys: Sequence[str], max_tokens: Any, max_completion_tokens: Any = None, user: Any = None,
                  extra_headers: Any = None, extra_query: Any = None,
                  timeout: Any = None) -> tuple[int | None, dict, bool, int]:
    """The checks chat and completions share; returns (the max_tokens the caller gave or None,
    extra_body, include_usage, n)."""
    try:
        n = check_n(n)
    except InvalidParameterError as e:
        raise _translate(e) from None
    _optional_bool(stream, "stream")
    include_usage = False
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise _bad(f"stream_options must be an object, got {type(stream_options).__name__}",
                       "stream_options", "invalid_type")
        if not stream:
            raise _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options")
        unknown = sorted(set(stream_options) - {"include_usage", "include_obfuscation"}, key=str)
        if unknown:
            raise _bad(f"stream_options takes include_usage and include_obfuscation, got "
                       f"{unknown[0]!r:.40}", _field("stream_options", unknown[0]),
                       "unknown_parameter")
        for k in ("include_usage", "include_obfuscation"):
            _optional_bool(stream_options.get(k), f"stream_options.{k}")
        include_usage = stream_options.get("include_usage") is True
    if not isinstance(extra_body, (dict, type(None))):
        raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
    extra = dict(extra_body or {})
    _check_extra_keys(extra, extra_keys)
    _check_user(user)
    _check_transport(extra_headers, extra_query, timeout)
    max_tokens = _optional_int(max_tokens, "max_tokens", 1)
    max_completion_tokens = _optional_int(max_completion_tokens, "max_completion_tokens", 1)
    if max_tokens is not None and max_completion_tokens is not None and max_tokens != max_completion_tokens:
        raise _bad("max_tokens and max_completion_tokens disagree; pass one of them",
                   "max_tokens")
    limit = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return limit, extra, include_usage, n


def _check_extra_keys(extra: Mapping[Any, Any], extra_keys: Sequence[str]) -> None:
    """extra_body holds only the fields this endpoint takes beyond OpenAI's."""
    unknown = sorted(set(extra) - set(extra_keys), key=str)
    if unknown:
        hint = ("; chat message content is always tokenized as plain text"
                if unknown[0] == "split_special_tokens" else "")
        raise _bad(f"unknown extra_body field(s) {unknown}; this endpoint takes {list(extra_keys)}"
                   f"{hint}", _field(None, unknown[0]), "unknown_parameter")


def _messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the chat template takes them (text parts joined, tool-call arguments read
    as JSON), each field checked against the OpenAI API reference: the fields of its role only."""
    if not isinstance(messages, (list, tuple)):
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages",
                   "invalid_type")
    if not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        at = f"messages.[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object with role and content", at, "invalid_type")
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(f"messages[{i}].role is {role!r:.40}; expected one of {list(_ROLES)}",
                       f"{at}.role", "invalid_value" if isinstance(role, str) or role is None
                       else "invalid_type")
        fields = MESSAGE_FIELDS[role]
        unknown = [k for k in m if k not in fields]
        if unknown:
            raise _bad(f"messages[{i}] ({role}) has an unknown field {unknown[0]!r:.40}; a {role} "
                       f"message takes {list(fields)}", _field(at, unknown[0]), "unknown_parameter")
        content = m.get("content")
        if isinstance(content, list):      # content parts: only text can be read by these models
            if not content:
                raise _bad(f"Invalid 'messages[{i}].content': empty array. Expected an array with "
                           f"minimum length 1, but got an empty array instead.", f"{at}.content",
                           "empty_array")
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}; "
                               f"this model reads text only", f"{at}.content")
            content = "".join(part["text"] for part in content)
        calls = m.get("tool_calls") or m.get("function_call")
        if content is None and not (role == "assistant" and calls):
            raise _bad(f"messages[{i}] ({role}) has no content", f"{at}.content")
        if content is not None and not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or a list of text parts",
                       f"{at}.content", "invalid_type")
        for key in ("name", "tool_call_id", "refusal", "reasoning_content"):
            if m.get(key) is not None:
                _string(m[key], f"{at}.{key}")
        if m.get("audio") is not None:
            _object(m["audio"], f"{at}.audio", {"id": str})
        if m.get("function_call") is not None:
            _object(m["function_call"], f"{at}.function_call", {"name": str, "arguments": str})
        msg = {k: v for k, v in m.items() if v is not None and k != "annotations"}
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{at}.tool_calls")
        if content is not None:
            msg["content"] = content
        out.append(msg)
    return out


def _object(value: Any, param: str, fields: dict[str, Any]) -> None:
    """`value` is an object with exactly `fields` (name: the type of its value, or the one value
    allowed), each required, as the OpenAI API reference has them for the parts of a message."""
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object with {list(fields)}, got {type(value).__name__}",
                   param, "invalid_type")
    for k in value:
        if k not in fields:
            raise _bad(f"{param} has an unknown field {k!r:.40}; it takes {list(fields)}",
                       _field(param, k), "unknown_parameter")
    for k, want in fields.items():
        if k not in value:
            raise _bad(f"{param}.{k} is missing: {param} takes {list(fields)}", f"{param}.{k}",
                       "missing_required_parameter")
        v = value[k]
        if isinstance(want, type):
            if not isinstance(v, want) or isinstance(v, bool) and want is not bool:
                raise _bad(f"{param}.{k} must be {_JSON_TYPES.get(want, want.__name__)}, got "
                           f"{type(v).__name__}", f"{param}.{k}", "invalid_type")
        elif v != want:
            raise _bad(f"{param}.{k} must be {want!r}, got {v!r:.40}", f"{param}.{k}",
                       "invalid_value" if isinstance(v, type(want)) else "invalid_type")


_JSON_TYPES = {str: "a string", dict: "an object", list: "an array"}


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    """An assistant message's tool_calls, each {id, type: "function", function: {name,
    arguments}} with string values as the OpenAI API reference has them. The arguments (a JSON
    text, as the model wrote it) are given to the template as the object they spell: chat
    templates print `arguments | tojson` and expect an object, as models were trained on it and as
    vLLM does; arguments that are not a JSON object stay text."""
    if not isinstance(calls, list):
        raise _bad(f"{param} must be a list of tool calls", param, "invalid_type")
    out = []
    for j, call in enumerate(calls):
        at = f"{param}.[{j}]"
        _object(call, at, {"id": str, "type": "function", "function": dict})
        _object(call["function"], f"{at}.function", {"name": str, "arguments": str})
        arguments: Any = call["function"]["arguments"]
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            try:                 # the object may nest, or spell surrogates ("\\ud800"), past the rules
                check_request_value(parsed, f"{at}.function.arguments", level=7)
            except InvalidParameterError as e:
                raise _translate(e) from None
            arguments = parsed
        out.append({**call, "function": {**call["function"], "arguments": arguments}})
    return out


def _token_text(model: Model, token_id: int) -> tuple[str, list[int]]:
    b = model.tokenizer.token_bytes(token_id)
    return b.decode("utf-8", "replace"), list(b)


def _chat_logprobs(model: Model, lps: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    content = []
    for lp in lps:
        tok, b = _token_text(model, lp.token_id)
        tops = []
        for t in lp.top:
            ttok, tb = _token_text(model, t.token_id)
            tops.append(TopLogprob(token=ttok, bytes=tb, logprob=t.logprob))
        content.append(ChatCompletionTokenLogprob(token=tok, bytes=b, logprob=lp.logprob,
                                                  top_logprobs=tops))
    return ChoiceLogprobs(content=content)


def _usage(prompt: int, completion: int, cached: int,
           speculative: tuple[int, int] | None = None) -> CompletionUsage:
    """speculative: (guessed tokens kept, rejected) when speculative decoding was asked for (by
    the request or ignis.load / --speculative; the "auto" default leaves usage as plain decoding
    gives it), reported as OpenAI reports Predicted Outputs
    (completion_tokens_details.accepted/rejected_prediction_tokens)."""
    details = None
    if speculative is not None:
        details = {"accepted_prediction_tokens": speculative[0],
                   "rejected_prediction_tokens": speculative[1]}
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion,
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
                           completion_tokens_details=details)


def _speculation(results: Sequence[Any]) -> tuple[int, int] | None:
    spec = [r.speculative for r in results
            if getattr(r, "speculative", None) is not None and r.speculative.requested]
    if not spec:
        return None
    kept = sum(s.accepted for s in spec)
    return kept, sum(s.drafted for s in spec) - kept


def _choices_usage(results: Sequence[Any]) -> CompletionUsage:
    """The usage of one prompt's choices, as OpenAI counts it: the prompt once, the completion
    tokens of every choice."""
    return _usage(results[0].prompt_tokens, sum(r.completion_tokens for r in results),
                  results[0].cached_tokens, _speculation(results))


def _check_response_format(response_format: Any) -> None:
    """The shape of response_format (text, json_object, json_schema with name and an object
    schema); whether the engine can enforce the schema is found when it is compiled."""
    try:
        response_format_spec(response_format)
    except InvalidParameterError as e:
        raise _translate(e) from None


def _check_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> ToolRequest | None:
    try:
        return check_tools(tools, tool_choice, parallel_tool_calls)
    except InvalidParameterError as e:
        raise _translate(e) from None


def _template_kwargs(value: Any) -> dict[str, Any]:
    """extra_body chat_template_kwargs: an object of the template's variables."""
    try:
        return check_template_kwargs(value)
    except InvalidParameterError as e:
        raise _translate(e) from None


class _Answer:
    """A chat answer's text read as OpenAI's message parts: the reasoning of a thinking model,
    the content, and the tool calls (whole or as a stream's deltas; one reader for both)."""

    def __init__(self, m: Model, prompt: Sequence[int], tools: ToolRequest | None):
        self.reasoning = (ReasoningSplitter(open_in_prompt=m.opens_thinking(prompt))
                          if m.thinking else None)
        self.calls = None
        if tools is not None and tools.choice != "none":
            self.calls = ToolCallParser(m.check_tool_support(), live=tools.constrained,
                                        parallel=tools.parallel,
                                        names=[f["name"] for f in tools.functions()])

    def _content(self, text: str) -> list[ChoiceDelta]:
        if self.calls is None:
            return [ChoiceDelta(content=text)] if text else []
        return self._deltas(self.calls.feed(text))

    @staticmethod
    def _deltas(events: Any) -> list[ChoiceDelta]:
        out: list[ChoiceDelta] = []
        for e in events:
            if e.kind == "content":
                if out and out[-1].content is not None:
                    out[-1].content += e.text
                else:
                    out.append(ChoiceDelta(content=e.text))
            elif e.kind == "call":
                out.append(ChoiceDelta(tool_calls=[AttrDict(
                    index=e.index, id=e.id, type="function",
                    function={"name": e.name, "arguments": ""})]))
            elif out and out[-1].tool_calls and out[-1].tool_calls[0].index == e.index \
                    and "id" not in out[-1].tool_calls[0]:
                out[-1].tool_calls[0].function.arguments += e.text
            else:
                out.append(ChoiceDelta(tool_calls=[AttrDict(index=e.index,
                                                            function={"arguments": e.text})]))
        return out

    def feed(self, text: str) -> list[ChoiceDelta]:
        if self.reasoning is None:
            return self._content(text)
        out = []
        for kind, piece in self.reasoning.feed(text):
            if kind == "reasoning":
                out.append(ChoiceDelta(reasoning_content=piece))
            else:
                out += self._content(piece)
        return out

    def finish(self) -> list[ChoiceDelta]:
        out = []
        if self.reasoning is not None:
            for kind, piece in self.reasoning.finish():
                out += ([ChoiceDelta(reasoning_content=piece)] if kind == "reasoning"
                        else self._content(piece))
        if self.calls is not None:
            out += self._deltas(self.calls.finish())
        return out

    def message(self, text: str) -> ChatCompletionMessage:
        """The whole answer as a message (after feed(text) and finish())."""
        self.feed(text)
        self.finish()
        reasoning = self.reasoning.reasoning if self.reasoning is not None else None
        if self.calls is None:
            content = self.reasoning.content if self.reasoning is not None else text
            return ChatCompletionMessage(content=content or ("" if reasoning is None else None),
                                         reasoning_content=reasoning)
        calls = [AttrDict(c.to_openai()) for c in self.calls.calls] or None
        return ChatCompletionMessage(content=self.calls.content, tool_calls=calls,
                                     reasoning_content=reasoning)

    def finish_reason(self, reason: str, named: bool = False) -> str:
        """OpenAI's finish_reason: "tool_calls" when the answer ended with calls, except for a
        tool_choice naming a function (`named`), which OpenAI ends with "stop"."""
        return "tool_calls" if reason == "stop" and self.calls is not None and self.calls.calls \
            and not named else reason


class Stream:
    """What create(stream=True) returns: iterate it for chunks; close() stops generating."""

    def __init__(self, chunks: Iterator[Any], close: Callable[[], None]):
        self._chunks = chunks
        self._close = close

    def __iter__(self) -> Iterator[Any]:
        return self._chunks

    def __next__(self) -> Any:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        self._close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- chat.completions ---------------------------------------------------------------------------

class _Chat:
    def __init__(self, client: Client):
        self.completions = _ChatCompletions(client)


class _ChatCompletions:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, messages: Any, model: str, stream: bool | None = None,
               stream_options: dict | None = None, max_tokens: int | None = None,
               max_completion_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, stop: str | list[str] | None = None,
               seed: int | None = None, logprobs: bool | None = None,
               top_logprobs: int | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None, logit_bias: dict | None = None,
               n: int | None = None, response_format: dict | None = None,
               tools: list | None = None, tool_choice: Any = None, user: str | None = None,
               store: bool | None = None, metadata: dict | None = None,
               parallel_tool_calls: bool | None = None, service_tier: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> ChatCompletion | Stream:
        """max_tokens / max_completion_tokens: when given, prompt + max_tokens must fit the context
        (else context_length_exceeded, as with OpenAI); when omitted, the answer may run to the end
        of the context."""
        if self._client._native is not None:
            return self._client._native.create("chat", locals())
        _check_request(locals())          # first: every later check may walk or print any value
        limit, extra, include_usage, n = _check_common(
            n=n, stream=stream, stream_options=stream_options, extra_body=extra_body,
            extra_keys=EXTRA_CHAT, max_tokens=max_tokens,
            max_completion_tokens=max_completion_tokens, user=user, extra_headers=extra_headers,
            extra_query=extra_query, timeout=timeout)
        _check_response_format(response_format)
        tool_req = _check_tools(tools, tool_choice, parallel_tool_calls)
        template_kwargs = _template_kwargs(extra.pop("chat_template_kwargs", None))
        _optional_bool(store, "store")
        _check_metadata(metadata)
        _check_service_tier(service_tier)
        msgs = _messages(messages)
        m = self._client._model(model)
        try:
            rendered = None
            if tool_req is not None and tool_req.choice != "none":
                # "none": the tools stay out of the prompt, so the model answers in words
                m.check_tool_support()
                rendered = tool_req.tools
            prompt = m.chat_prompt_ids(msgs, tools=rendered, **template_kwargs)
            other = constraint_spec(response_format=response_format,
                                    **{k: extra.get(k) for k in GUIDED}) is not None
            think = template_kwargs.get("enable_thinking")
            first = m.chat_constraint(tool_req, prompt, other=other, enable_thinking=think)

            def each(i: int) -> Any:       # a constraint holds one answer's state: one per choice
                if first is None or i == 0:
                    return first
                return m.chat_constraint(tool_req, prompt, other=other, enable_thinking=think)
            answers = [_Answer(m, prompt, tool_req) for _ in range(n)]
            choices = m.start_choices(prompt, n, max_tokens=limit, temperature=temperature,
                                      top_p=top_p, stop=stop, seed=seed, logprobs=logprobs,
                                      top_logprobs=top_logprobs, presence_penalty=presence_penalty,
                                      frequency_penalty=frequency_penalty, logit_bias=logit_bias,
                                      response_format=response_format, constraint=each, **extra)
        except (InvalidParameterError, ContextLengthExceeded) as e:
            raise _translate(e) from None
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        fp = self._client.system_fingerprint
        want_lp = bool(logprobs)
        # tool_choice naming a function ends with "stop", as OpenAI's answers do; "auto" and
        # "required" with "tool_calls"
        named = tool_req is not None and tool_req.choice == "function"
        if stream:
            return Stream(self._chunks(m, choices, answers, cid, created, model, fp, want_lp,
                                       include_usage, named), choices.close)
        for _ in choices:
            pass
        out = []
        for i, (r, answer) in enumerate(zip(choices.results, answers)):
            message = answer.message(r.text)          # first: it reads the calls
            out.append(Choice(finish_reason=answer.finish_reason(r.finish_reason, named), index=i,
                              message=message,
                              logprobs=_chat_logprobs(m, r.logprobs) if want_lp else None))
        return ChatCompletion(id=cid, choices=out, created=created, model=model,
                              system_fingerprint=fp, usage=_choices_usage(choices.results))

    def parse(self, *, response_format: Any = None, stream: bool | None = None,
              **kwargs: Any) -> ChatCompletion:
        """create() with response_format a pydantic model class (or a response_format dict), as
        the official client's parse(): the class becomes a strict json_schema response_format,
        and message.parsed is the answer read into it. LengthFinishReasonError when max_tokens
        cut the answer."""
        if stream:
            raise _bad("parse() does not stream; use create(stream=True)", "stream",
                       "unsupported_value")
        schema_type = None
        if isinstance(response_format, type):
            schema_type = response_format
            try:
                response_format = pydantic_response_format(response_format)
            except InvalidParameterError as e:
                raise _translate(e) from None
        r = self.create(response_format=response_format, **kwargs)
        out = []
        for choice in r.choices:
            if choice.finish_reason == "length":
                raise LengthFinishReasonError(r)
            msg = choice.message
            parsed = None
            if schema_type is not None and msg.content is not None:
                parsed = schema_type.model_validate_json(msg.content)
            choice.message = ParsedChatCompletionMessage(**{**vars(msg), "parsed": parsed})
            out.append(choice)
        r.choices = out
        return r

    @staticmethod
    def _chunks(m: Model, choices: Choices, answers: list[_Answer], cid: str, created: int,
                model: str, fp: str, want_lp: bool, include_usage: bool,
                named: bool) -> Iterator[ChatCompletionChunk]:
        def chunk(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=cid, choices=choices, created=created, model=model,
                                       system_fingerprint=fp, usage=usage)
        plain = [a.calls is None and a.reasoning is None for a in answers]
        # a plain answer's content starts as "" (as before); one read for calls or reasoning
        # starts with none, so a message of calls only accumulates content None, as OpenAI's.
        # Every choice opens with its role; then each chunk carries one choice's index.
        for i in range(len(answers)):
            yield chunk([ChunkChoice(delta=ChoiceDelta(role="assistant",
                                                       content="" if plain[i] else None), index=i)])
        c: Chunk | None
        for i, c in choices:
            answer = answers[i]
            if c is None:              # choice i has ended
                r = choices.results[i]
                for d in answer.finish():
                    yield chunk([ChunkChoice(delta=d, index=i)])
                yield chunk([ChunkChoice(delta=ChoiceDelta(), index=i,
                                         finish_reason=answer.finish_reason(r.finish_reason, named))])
                continue
            lp = _chat_logprobs(m, c.logprobs) if want_lp else None
            if plain[i]:
                yield chunk([ChunkChoice(delta=ChoiceDelta(content=c.text), index=i, logprobs=lp)])
                continue
            deltas = answer.feed(c.text)
            if lp is not None and not deltas:
                deltas = [ChoiceDelta(content="")]
            for k, d in enumerate(deltas):
                yield chunk([ChunkChoice(delta=d, index=i, logprobs=lp if k == 0 else None)])
        if include_usage:
            yield chunk([], _choices_usage(choices.results))


# ---- completions --------------------------------------------------------------------------------

class _Completions:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, model: str, prompt: Any, max_tokens: int | None = None,
               temperature: float | None = None, top_p: float | None = None,
               stop: str | list[str] | None = None, seed: int | None = None,
               logprobs: int | None = None, echo: bool | None = None, n: int | None = None,
               best_of: int | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None, logit_bias: dict | None = None,
               stream: bool | None = None, stream_options: dict | None = None,
               suffix: str | None = None, user: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> Completion | Stream:
        """A raw prompt, tokenized with special-token text ("<|im_end|>") read as those tokens;
        extra_body={"split_special_tokens": True} reads it as plain text instead.

        max_tokens defaults to 16, as in the OpenAI completions API. A max_tokens the caller gives
        must fit after the prompt (else context_length_exceeded); the default is shortened to the
        room the context has left."""
        if self._client._native is not None:
            return self._client._native.create("completions", locals())
        _check_request(locals())          # first: every later check may walk or print any value
        limit, extra, include_usage, n = _check_common(
            n=n, stream=stream, stream_options=stream_options, extra_body=extra_body,
            extra_keys=EXTRA_COMPLETIONS, max_tokens=max_tokens, user=user,
            extra_headers=extra_headers, extra_query=extra_query, timeout=timeout)
        split = extra.pop("split_special_tokens", None)
        _optional_bool(split, "split_special_tokens")
        _check_response_format(extra.get("response_format"))
        _optional_bool(echo, "echo")
        if echo:
            raise _bad("echo=true is not supported", "echo", "unsupported_value")
        if suffix is not None and _string(suffix, "suffix"):
            raise _bad("suffix is not supported (no fill-in-the-middle template)", "suffix",
                       "unsupported_parameter")
        if _optional_int(best_of, "best_of", 1) not in (None, 1):
            raise _bad("best_of must be 1", "best_of", "unsupported_value")
        if logprobs is not None:
            if isinstance(logprobs, bool) or not isinstance(logprobs, int):
                raise _bad(f"logprobs must be an integer in [0, 5], got {logprobs!r:.40}", "logprobs",
                           "invalid_type")
            if not 0 <= logprobs <= 5:
                raise _bad(f"logprobs must be an integer in [0, 5], got {logprobs!r}", "logprobs")
        prompts = _texts_or_ids(prompt, "prompt")
        if stream and len(prompts) > 1:
            raise _bad("stream=true takes a single prompt", "prompt", "unsupported_value")
        m = self._client._model(model)
        runs = []       # one Choices per prompt; choice j of prompt p is choices[p * n + j]
        try:
            for p in prompts:
                ids = m.tokenize(p, split_special_tokens=bool(split)) if isinstance(p, str) else p
                # the default is no request for a length: it shrinks to the room left (a prompt
                # that fills the context is still refused, by Generation)
                n_max = limit if limit is not None else \
                    max(1, min(COMPLETIONS_MAX_TOKENS, m.n_ctx - len(ids)))
                runs.append(m.start_choices(ids, n, max_tokens=n_max, temperature=temperature,
                                            top_p=top_p, stop=stop, seed=seed,
                                            logprobs=logprobs is not None,
                                            top_logprobs=logprobs or None,
                                            presence_penalty=presence_penalty,
                                            frequency_penalty=frequency_penalty,
                                            logit_bias=logit_bias, **extra))
        except (InvalidParameterError, ContextLengthExceeded) as e:
            raise _translate(e, "prompt") from None
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        fp = self._client.system_fingerprint
        want_lp = logprobs is not None
        if stream:
            return Stream(self._chunks(m, runs[0], cid, created, model, fp, want_lp, include_usage),
                          runs[0].close)
        choices, n_prompt, n_out, cached, spec = [], 0, 0, 0, None
        for p, run in enumerate(runs):
            for _ in run:
                pass
            for j, r in enumerate(run.results):
                choices.append(CompletionChoice(
                    finish_reason=r.finish_reason, index=p * n + j, text=r.text,
                    logprobs=_text_logprobs(m, r.logprobs) if want_lp else None))
            u = _choices_usage(run.results)
            n_prompt += u.prompt_tokens
            n_out += u.completion_tokens
            cached += u.prompt_tokens_details.cached_tokens
            got = _speculation(run.results)
            if got is not None:
                spec = (got[0] + (spec or (0, 0))[0], got[1] + (spec or (0, 0))[1])
        return Completion(id=cid, choices=choices, created=created, model=model,
                          system_fingerprint=fp, usage=_usage(n_prompt, n_out, cached, spec))

    @staticmethod
    def _chunks(m: Model, run: Choices, cid: str, created: int, model: str, fp: str,
                want_lp: bool, include_usage: bool) -> Iterator[Completion]:
        for i, c in run:
            if c is None:              # choice i has ended
                r = run.results[i]
                yield Completion(id=cid, choices=[CompletionChoice(finish_reason=r.finish_reason,
                                                                   index=i, text="")],
                                 created=created, model=model, system_fingerprint=fp)
                continue
            lp = _text_logprobs(m, c.logprobs) if want_lp else None
            yield Completion(id=cid, choices=[CompletionChoice(finish_reason=None, index=i,  # type: ignore[arg-type]
                                                               text=c.text, logprobs=lp)],
                             created=created, model=model, system_fingerprint=fp)
        if include_usage:
            yield Completion(id=cid, choices=[], created=created, model=model, system_fingerprint=fp,
                             usage=_choices_usage(run.results))


def _text_logprobs(m: Model, lps: Sequence[TokenLogprob] | None) -> Logprobs:
    """The legacy logprobs object; text_offset is where each token's text starts in the
    completion's text (streamed or not: chunks carry the tokens they complete)."""
    out = Logprobs()
    for lp in lps or ():
        tok, _ = _token_text(m, lp.token_id)
        out.tokens.append(tok)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({_token_text(m, t.token_id)[0]: t.logprob for t in lp.top})
        out.text_offset.append(lp.text_offset if lp.text_offset is not None else 0)
    return out


def _is_id(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def _texts_or_ids(value: Any, param: str) -> list[str | list[int]]:
    """The inputs of a completions `prompt` or an embeddings `input`, in the API's four shapes: a
    string, a list of strings, a list of token ids (one input), a list of token-id lists. One
    shape per request (OpenAI's schema has no mixed lists); nothing empty. (Its text was checked
    for lone surrogates with the rest of the request.)"""
    shapes = "a string, a list of strings, a list of token ids or a list of token id lists"
    if isinstance(value, str):
        items: list[Any] = [value]
    elif not isinstance(value, (list, tuple)):
        raise _bad(f"{param} must be {shapes}, got {type(value).__name__}", param, "invalid_type")
    elif not value:
        raise _bad(f"{param} is an empty list; give at least one input", param)
    elif all(_is_id(t) for t in value):
        items = [[int(t) for t in value]]
    elif all(isinstance(t, str) for t in value):
        items = list(value)
    elif all(isinstance(t, (list, tuple, np.ndarray)) for t in value):
        items = []
        for i, ids in enumerate(value):
            if not all(_is_id(t) for t in ids):
                raise _bad(f"{param}[{i}] must be a list of integer token ids", param, "invalid_type")
            items.append([int(t) for t in ids])
    else:
        kinds = sorted({type(t).__name__ for t in value})
        raise _bad(f"{param} must be {shapes}, not a list mixing {', '.join(kinds)}", param,
                   "invalid_type")
    for i, item in enumerate(items):
        if not item:
            raise _bad(f"{param}[{i}] is empty; every input needs at least one token", param)
        if not isinstance(item, str) and any(t < 0 for t in item):
            raise _bad(f"{param}[{i}] has a negative token id", param)
    return items


# ---- embeddings ---------------------------------------------------------------------------------

ENCODING_FORMATS = ("float", "base64")
EXTRA_EMBEDDING = ("pooling",)     # extra_body keys of embeddings.create: Model.embed's options


class _Embeddings:
    def __init__(self, client: Client):
        self._client = client

    def create(self, *, model: str, input: Any, encoding_format: str | None = None,
               dimensions: int | None = None, user: str | None = None,
               extra_body: dict | None = None, extra_headers: dict | None = None,
               extra_query: dict | None = None, timeout: float | None = None) -> CreateEmbeddingResponse:
        """One vector per input: Model.embed's mean-pooled, L2-normalised final hidden states
        (extra_body={"pooling": "last"}: the last token's). encoding_format "float" (default) gives
        lists of floats, "base64" the base64 text of each vector's little-endian float32 bytes
        (what the official client decodes)."""
        if self._client._native is not None:
            return self._client._native.create("embeddings", locals())
        _check_request(locals())          # first: every later check may walk or print any value
        fmt = "float" if encoding_format is None else encoding_format
        if fmt not in ENCODING_FORMATS:
            raise _bad(f"encoding_format must be one of {list(ENCODING_FORMATS)}, got "
                       f"{encoding_format!r:.40}", "encoding_format",
                       "invalid_value" if isinstance(fmt, str) else "invalid_type")
        _optional_int(dimensions, "dimensions", 1)
        _check_user(user)
        _check_transport(extra_headers, extra_query, timeout)
        if not isinstance(extra_body, (dict, type(None))):
            raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
        extra = dict(extra_body or {})
        unknown = sorted(set(extra) - set(EXTRA_EMBEDDING), key=str)
        if unknown:
            raise _bad(f"unknown extra_body field(s) {unknown}; embeddings take "
                       f"{list(EXTRA_EMBEDDING)}", _field(None, unknown[0]), "unknown_parameter")
        pooling = extra.get("pooling", "mean")
        if pooling not in POOLINGS:
            raise _bad(f"pooling must be one of {list(POOLINGS)}, got {pooling!r:.40}", "pooling",
                       "invalid_value" if isinstance(pooling, str) else "invalid_type")
        inputs = _texts_or_ids(input, "input")
        m = self._client._model(model)
        if dimensions is not None and dimensions != m.config.dim:
            raise _bad(f"dimensions={dimensions!r}: ignis returns the model's full hidden size "
                       f"({m.config.dim}) and does not shorten embeddings; omit dimensions",
                       "dimensions", "unsupported_parameter")
        try:
            ids = m.embedding_inputs(inputs)
        except InvalidParameterError as e:
            raise _translate(e) from None
        vecs = m.embed_ids(ids, pooling=pooling)
        data = [Embedding(embedding=_encode_vector(v, fmt), index=i) for i, v in enumerate(vecs)]
        n = sum(len(x) for x in ids)
        return CreateEmbeddingResponse(data=data, model=model,
                                       usage=EmbeddingUsage(prompt_tokens=n, total_tokens=n))


def _encode_vector(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


# ---- models -------------------------------------------------------------------------------------

class _Models:
    def __init__(self, client: Client):
        self._client = client

    def list(self) -> ModelList:
        """Models bound to this client, then the registry's models that are installed."""
        from ..loader.registry import list_models
        created = int(time.time())
        ids = list(self._client._models)
        try:
            ids += [e["name"] for e in list_models() if e["packages_installed"] and e["name"] not in ids]
        except IgnisError:
            pass
        return ModelList(data=[ModelInfo(id=i, created=created) for i in ids])

    def retrieve(self, model: str) -> ModelInfo:
        for info in self.list():
            if info.id == model:
                return info
        raise NotFoundError(f"The model {model!r} does not exist", param="model",
                            code="model_not_found")
