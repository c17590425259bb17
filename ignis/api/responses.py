"""The Responses API (`client.responses.create`, `POST /v1/responses`), as the official openai
SDK's types have it, answered through the chat pipeline: the input items become chat messages,
the function tools, tool_choice and text.format the chat request's, and the chat stream's deltas
become the `response.*` events (each with its sequence_number). A non-streamed response is the
streamed one's final state, so the two cannot disagree.

Responses are kept (store, the default) in a bounded in-memory store, newest MAX_STORED
(least recently used dropped first), so previous_response_id continues a conversation within
this Client or server's memory; instructions are not carried over, as OpenAI's are not.
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator

from .types import AttrDict

if TYPE_CHECKING:
    from .client import Client

MAX_STORED = 256          # responses kept for previous_response_id and retrieve()
ROLES = ("user", "assistant", "system", "developer")
# the fields each input item takes (the SDK's ResponseInputItemParam shapes)
ITEM_FIELDS = {
    "message": ("type", "role", "content", "id", "status", "phase"),
    "function_call": ("type", "call_id", "name", "arguments", "id", "status", "caller", "namespace"),
    "function_call_output": ("type", "call_id", "output", "id", "status", "caller", "name",
                             "namespace"),
    "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status"),
}
ITEM_STATUSES = ("in_progress", "completed", "incomplete")
TEXT_PARTS = ("input_text", "output_text", "refusal")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
TOOL_FIELDS = ("type", "name", "description", "parameters", "strict")
# extra_body keys: the chat endpoint's (sampling, vLLM's guided_* fields, the template's
# variables), and seed (the Responses API has none; ignis takes it)
EXTRA_RESPONSES = ("top_k", "min_p", "repetition_penalty", "guided_choice", "guided_regex",
                   "guided_grammar", "guided_json", "chat_template_kwargs", "seed")


class _Json(AttrDict):
    """A JSON object of the Responses API: attribute access as the SDK's models, model_dump()
    and model_dump_json() as they dump."""

    def model_dump(self, *, exclude_none: bool = False) -> dict[str, Any]:
        d = json.loads(json.dumps(self))
        return _drop_none(d) if exclude_none else d

    def model_dump_json(self, *, indent: int | None = None, exclude_none: bool = False) -> str:
        return json.dumps(self.model_dump(exclude_none=exclude_none), indent=indent,
                          ensure_ascii=False)


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


class Response(_Json):
    """A response object; output_text joins the text of its output messages, as the SDK's does."""

    @property
    def output_text(self) -> str:
        return "".join(part["text"] for item in self["output"] if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")


class ResponseEvent(_Json):
    """One streamed `response.*` event (sent as SSE `event: <type>` with the JSON as data)."""


class ResponseStore:
    """The responses kept for previous_response_id: at most `limit`, least recently used dropped."""

    def __init__(self, limit: int = MAX_STORED):
        self.limit = limit
        self._items: OrderedDict[str, tuple[Response, list[dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: Response, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = (response, messages)
            self._items.move_to_end(response["id"])
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[Response, list[dict[str, Any]]] | None:
        with self._lock:
            got = self._items.get(response_id)
            if got is not None:
                self._items.move_to_end(response_id)
            return got


# ---- the request read as a chat request --------------------------------------------------------------

def _bad(message: str, param: str | None, code: str = "invalid_value") -> Exception:
    from .client import BadRequestError
    return BadRequestError(message, param=param, code=code)


def _fields(value: Any, at: str, allowed: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{at} must be an object ({what}), got {type(value).__name__}", at,
                   "invalid_type")
    for k in value:
        if k not in allowed:
            raise _bad(f"{at} has an unknown field {k!r:.40}; {what} takes {list(allowed)}",
                       f"{at}.{k}" if isinstance(k, str) else at, "unknown_parameter")
    return value


def _str(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{at} must be a string, got {type(value).__name__}", at, "invalid_type")
    return value


def _text(content: Any, at: str, role: str) -> str:
    """A message's content (a string or a list of text parts) as its text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _bad(f"{at} must be a string or a non-empty list of content parts", at,
                   "invalid_type")
    out = []
    for j, part in enumerate(content):
        p = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise _bad(f"{p}.type is {kind!r:.40}: this model reads text only ({list(TEXT_PARTS)})",
                       f"{p}.type", "unsupported_value" if isinstance(kind, str) else "invalid_type")
        key = "refusal" if kind == "refusal" else "text"
        out.append(_str(part.get(key), f"{p}.{key}"))
    return "".join(out)


def input_messages(value: Any) -> list[dict[str, Any]]:
    """The request's `input` (a string, or a list of input items) as chat messages: message
    items by role, function_call items as the assistant's tool_calls (consecutive ones, and the
    text message before them, make one assistant message), function_call_output items as tool
    messages. Reasoning items are dropped (chat templates drop earlier turns' reasoning)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad(f"input must be a string or a list of input items, got {type(value).__name__}",
                   "input", "invalid_type")
    out: list[dict[str, Any]] = []
    joinable = False                # the last message is the assistant's, and calls may join it
    for i, item in enumerate(value):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{at} must be an input item object, got {type(item).__name__}", at,
                       "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in ITEM_FIELDS:
            raise _bad(f"{at}.type is {kind!r:.40}; ignis takes input items of the types "
                       f"{list(ITEM_FIELDS)}", f"{at}.type",
                       "invalid_value" if isinstance(kind, str) or kind is None else "invalid_type")
        _fields(item, at, ITEM_FIELDS[kind], f"a {kind} item")
        if item.get("status") is not None and item["status"] not in ITEM_STATUSES:
            raise _bad(f"{at}.status is {item['status']!r:.40}; expected one of "
                       f"{list(ITEM_STATUSES)}", f"{at}.status", "invalid_value")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise _bad(f"{at}.role is {role!r:.40}; expected one of {list(ROLES)}",
                           f"{at}.role", "invalid_value" if isinstance(role, str) or role is None
                           else "invalid_type")
            if "content" not in item:
                raise _bad(f"{at}.content is missing", f"{at}.content",
                           "missing_required_parameter")
            out.append({"role": role, "content": _text(item["content"], f"{at}.content", role)})
            joinable = role == "assistant"
        elif kind == "function_call":
            call = {"id": _str(item.get("call_id"), f"{at}.call_id"), "type": "function",
                    "function": {"name": _str(item.get("name"), f"{at}.name"),
                                 "arguments": _str(item.get("arguments"), f"{at}.arguments")}}
            if joinable:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                joinable = True
        elif kind == "function_call_output":
            output = item.get("output")
            if "output" not in item:
                raise _bad(f"{at}.output is missing", f"{at}.output", "missing_required_parameter")
            text = output if isinstance(output, str) else _text(output, f"{at}.output", "tool")
            out.append({"role": "tool", "tool_call_id": _str(item.get("call_id"), f"{at}.call_id"),
                        "content": text})
            joinable = False
    for m in out:
        if m["role"] == "assistant" and m.get("content") is None:
            m.pop("content")
    return out


def _check_call_ids(messages: list[dict[str, Any]]) -> None:
    """Every function_call_output answers a function_call made earlier in the conversation (this
    input or the previous response's), as OpenAI requires: a 400 naming the call_id otherwise."""
    made: set[str] = set()
    for m in messages:
        made.update(c["id"] for c in m.get("tool_calls") or ())
        if m["role"] == "tool" and m["tool_call_id"] not in made:
            raise _bad(f"no function call found for the function_call_output with call_id "
                       f"{m['tool_call_id']!r:.80}: it must answer a function_call earlier in "
                       f"the input or in the previous response", "input", "invalid_value")


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools ({"type": "function", "name", "parameters", ...}, flat) as chat
    tools (nested under "function"); any other tool type is a 400 naming it."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad(f"tools must be a list of function tools, got {type(tools).__name__}", "tools",
                   "invalid_type")
    out = []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise _bad(f"{at}.type is {kind!r:.40}: ignis runs function tools only "
                       f"({{'type': 'function', 'name': ..., 'parameters': {{...}}}})", f"{at}.type",
                       "unsupported_value" if isinstance(kind, str) else "invalid_type")
        if "function" in t:
            raise _bad(f"{at} nests its definition under 'function' (the chat completions shape); "
                       f"a Responses function tool is flat: {{'type': 'function', 'name': ..., "
                       f"'parameters': {{...}}}}", f"{at}.function", "unknown_parameter")
        _fields(t, at, TOOL_FIELDS, "a function tool")
        if "name" not in t:
            raise _bad(f"{at}.name is missing", f"{at}.name", "missing_required_parameter")
        out.append({"type": "function", "function": {k: v for k, v in t.items()
                                                     if k != "type" and v is not None}})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """tool_choice: "none" / "auto" / "required" as they are; {"type": "function", "name"} as the
    chat shape. Other forms (hosted tools, allowed_tools) are a 400."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        _fields(choice, "tool_choice", ("type", "name"), "a function tool choice")
        return {"type": "function", "function": {"name": _str(choice.get("name"),
                                                              "tool_choice.name")}}
    raise _bad(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'name': "
               f"...}}, got {choice!r:.60}", "tool_choice",
               "unsupported_value" if isinstance(choice, dict) else "invalid_type")


def chat_response_format(text: Any) -> tuple[Any, dict[str, Any]]:
    """text.format as a chat response_format, and the `text` the response echoes."""
    if text is None:
        return None, {"format": {"type": "text"}}
    _fields(text, "text", ("format", "verbosity"), "the text options")
    fmt = text.get("format")
    if fmt is None:
        return None, {"format": {"type": "text"}}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        _fields(fmt, "text.format", ("type",), f"a {kind} format")
        return {"type": kind}, {"format": dict(fmt)}
    if kind == "json_schema":
        _fields(fmt, "text.format", ("type", "name", "schema", "strict", "description"),
                "a json_schema format")
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}, {"format": dict(fmt)}
    raise _bad(f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r:.40}",
               "text.format.type", "invalid_value" if isinstance(kind, str) else "invalid_type")


_TOOLS_PARAM = re.compile(r"^tools\.\[(\d+)\](?:\.function)?(.*)$")


def _responses_param(param: str | None) -> str | None:
    """A chat request's error `param` as the Responses field it came from."""
    if param is None:
        return None
    if param.startswith("messages"):
        return "input"
    if param in ("max_tokens", "max_completion_tokens"):
        return "max_output_tokens"
    if param.startswith("response_format"):
        return "text.format" + param[len("response_format"):].replace(".json_schema", "")
    if param.startswith("tool_choice"):
        return "tool_choice.name" if param.endswith(".name") else "tool_choice"
    m = _TOOLS_PARAM.match(param)
    if m:
        return f"tools[{m.group(1)}]{m.group(2)}"
    return param


# ---- the chat stream read as response events ---------------------------------------------------------

def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(u: Any) -> dict[str, Any] | None:
    if u is None:
        return None
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


class _Events:
    """Turns one chat stream into the response's events, and keeps the response's final state."""

    def __init__(self, response: Response):
        self.response = response
        self.seq = 0
        self.item: dict[str, Any] | None = None     # the output item being written

    def event(self, kind: str, **fields: Any) -> ResponseEvent:
        e = ResponseEvent(type=kind, sequence_number=self.seq, **fields)
        self.seq += 1
        return e

    def snapshot(self) -> Response:
        return Response(json.loads(json.dumps(self.response)))

    def _open(self, kind: str, **extra: Any) -> Iterator[ResponseEvent]:
        out = self.response["output"]
        if kind == "message":
            item = {"id": _item_id("msg"), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
        elif kind == "reasoning":
            item = {"id": _item_id("rs"), "type": "reasoning", "summary": [],
                    "content": [], "status": "in_progress"}
        else:
            item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress",
                    "arguments": "", **extra}
        self.item = item
        out.append(item)
        yield self.event("response.output_item.added", output_index=len(out) - 1,
                         item=json.loads(json.dumps(item)))
        if kind in ("message", "reasoning"):
            part = ({"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    if kind == "message" else {"type": "reasoning_text", "text": ""})
            item["content"].append(part)
            if kind == "message":
                yield self.event("response.content_part.added", item_id=item["id"],
                                 output_index=len(out) - 1, content_index=0, part=dict(part))

    def close(self, status: str = "completed") -> Iterator[ResponseEvent]:
        item, self.item = self.item, None
        if item is None:
            return
        index = len(self.response["output"]) - 1
        if item["type"] == "message":
            part = item["content"][0]
            yield self.event("response.output_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=part["text"], logprobs=[])
            yield self.event("response.content_part.done", item_id=item["id"], output_index=index,
                             content_index=0, part=dict(part))
        elif item["type"] == "reasoning":
            yield self.event("response.reasoning_text.done", item_id=item["id"],
                             output_index=index, content_index=0, text=item["content"][0]["text"])
        else:
            yield self.event("response.function_call_arguments.done", item_id=item["id"],
                             output_index=index, arguments=item["arguments"])
        item["status"] = status
        yield self.event("response.output_item.done", output_index=index,
                         item=json.loads(json.dumps(item)))

    def text(self, kind: str, piece: str) -> Iterator[ResponseEvent]:
        if self.item is None or self.item["type"] != kind:
            yield from self.close()
            yield from self._open(kind)
        item = self.item
        assert item is not None
        item["content"][0]["text"] += piece
        index = len(self.response["output"]) - 1
        if kind == "message":
            yield self.event("response.output_text.delta", item_id=item["id"], output_index=index,
                             content_index=0, delta=piece, logprobs=[])
        else:
            yield self.event("response.reasoning_text.delta", item_id=item["id"],
                             output_index=index, content_index=0, delta=piece)

    def call(self, tc: Any) -> Iterator[ResponseEvent]:
        args = tc["function"].get("arguments") or ""
        if "id" in tc:                 # a new call: id and name come first, once
            yield from self.close()
            yield from self._open("function_call", call_id=tc["id"], name=tc["function"]["name"])
        item = self.item
        if not args or item is None:
            return
        item["arguments"] += args
        yield self.event("response.function_call_arguments.delta", item_id=item["id"],
                         output_index=len(self.response["output"]) - 1, delta=args)


class _Responses:
    """client.responses: create() and retrieve(), over the client's chat completions."""

    def __init__(self, client: "Client"):
        self._client = client
        self.store = ResponseStore()

    def retrieve(self, response_id: str, **_transport: Any) -> Response:
        got = self.store.get(response_id) if isinstance(response_id, str) else None
        if got is None:
            raise _not_found(response_id, "response_id")
        return Response(json.loads(json.dumps(got[0])))

    def create(self, *, model: str, input: Any = None, instructions: str | None = None,
               tools: list | None = None, tool_choice: Any = None,
               parallel_tool_calls: bool | None = None, text: dict | None = None,
               max_output_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, stream: bool | None = None,
               previous_response_id: str | None = None, store: bool | None = None,
               metadata: dict | None = None, user: str | None = None,
               truncation: str | None = None, include: list | None = None,
               reasoning: dict | None = None, service_tier: str | None = None,
               safety_identifier: str | None = None, prompt_cache_key: str | None = None,
               background: bool | None = None, extra_body: dict | None = None,
               extra_headers: dict | None = None, extra_query: dict | None = None,
               timeout: float | None = None) -> Response | Any:
        """A response to `input` (after the conversation of previous_response_id, under
        `instructions`), streamed as `response.*` events with stream=True. extra_body takes the
        chat endpoint's sampling fields and `seed`."""
        from .client import (BadRequestError, Stream, _check_metadata, _check_request,
                             _check_service_tier, _optional_bool, _string)
        _check_request(locals())          # first: every later check may walk or print any value
        if input is None and previous_response_id is None:
            raise _bad("input is missing: give input (a string or input items)", "input",
                       "missing_required_parameter")
        _optional_bool(stream, "stream")
        _optional_bool(store, "store")
        _optional_bool(background, "background")
        if background:
            raise _bad("background responses are not supported: ignis answers in the request",
                       "background", "unsupported_value")
        for name, v in (("instructions", instructions), ("user", user),
                        ("safety_identifier", safety_identifier),
                        ("prompt_cache_key", prompt_cache_key)):
            if v is not None:
                _string(v, name)
        if truncation not in (None, "disabled", "auto"):
            raise _bad(f"truncation must be 'auto' or 'disabled', got {truncation!r:.40}",
                       "truncation")
        if include is not None and not (isinstance(include, list)
                                        and all(isinstance(x, str) for x in include)):
            raise _bad("include must be a list of strings", "include", "invalid_type")
        if reasoning is not None and not isinstance(reasoning, dict):
            raise _bad("reasoning must be an object", "reasoning", "invalid_type")
        effort = (reasoning or {}).get("effort")
        if effort is not None and effort not in REASONING_EFFORTS:
            raise _bad(f"reasoning.effort is {effort!r:.40}; expected one of "
                       f"{list(REASONING_EFFORTS)}", "reasoning.effort", "invalid_value")
        _check_metadata(metadata)
        _check_service_tier(service_tier)
        if not isinstance(extra_body, (dict, type(None))):
            raise _bad("extra_body must be a dict", "extra_body", "invalid_type")
        extra = dict(extra_body or {})
        unknown = sorted(set(extra) - set(EXTRA_RESPONSES), key=str)
        if unknown:
            raise _bad(f"unknown extra_body field(s) {unknown}; responses take "
                       f"{list(EXTRA_RESPONSES)}", str(unknown[0]), "unknown_parameter")
        seed = extra.pop("seed", None)
        messages: list[dict[str, Any]] = []
        if previous_response_id is not None:
            got = self.store.get(_string(previous_response_id, "previous_response_id"))
            if got is None:
                raise _not_found(previous_response_id, "previous_response_id")
            messages += got[1]
        turn = input_messages(input)
        messages += turn
        _check_call_ids(messages)
        response_format, text_echo = chat_response_format(text)
        chat_tools_ = chat_tools(tools)
        choice = chat_tool_choice(tool_choice)
        system = [{"role": "system", "content": instructions}] if instructions else []
        if not messages:
            raise _bad("the conversation is empty: give input", "input")
        try:
            chat = self._client.chat.completions.create(
                model=model, messages=system + messages, tools=chat_tools_, tool_choice=choice,
                parallel_tool_calls=parallel_tool_calls, response_format=response_format,
                max_completion_tokens=max_output_tokens, temperature=temperature, top_p=top_p,
                seed=seed, stream=True, stream_options={"include_usage": True},
                extra_body=extra or None)
        except BadRequestError as e:
            raise BadRequestError(e.body["message"], param=_responses_param(e.param),
                                  code=e.code) from None
        response = Response(
            id=_item_id("resp"), object="response", created_at=int(time.time()),
            status="in_progress", error=None, incomplete_details=None, instructions=instructions,
            max_output_tokens=max_output_tokens, model=model, output=[],
            parallel_tool_calls=parallel_tool_calls is not False,
            previous_response_id=previous_response_id, reasoning=reasoning, store=store is not False,
            temperature=temperature, top_p=top_p, text=text_echo,
            tool_choice=tool_choice if tool_choice is not None else "auto",
            tools=[{"type": "function", **t["function"]} for t in chat_tools_ or ()],
            truncation=truncation or "disabled", usage=None, user=user, metadata=metadata or {})
        events = self._events(chat, response, turn, messages, store is not False)
        if stream:
            return Stream(events, chat.close)
        try:
            for _ in events:
                pass
        finally:
            chat.close()
        return Response(json.loads(json.dumps(response)))

    def _events(self, chat: Any, response: Response, turn: list[dict[str, Any]],
                messages: list[dict[str, Any]], keep: bool) -> Iterator[ResponseEvent]:
        ev = _Events(response)
        yield ev.event("response.created", response=ev.snapshot())
        yield ev.event("response.in_progress", response=ev.snapshot())
        finish, usage = None, None
        for chunk in chat:
            usage = chunk.usage or usage
            for ch in chunk.choices:
                d = ch.delta
                if d.reasoning_content:
                    yield from ev.text("reasoning", d.reasoning_content)
                if d.content:
                    yield from ev.text("message", d.content)
                for tc in d.tool_calls or ():
                    yield from ev.call(tc)
                finish = ch.finish_reason or finish
        cut = finish == "length"
        if not response["output"]:     # an empty answer is still a message
            yield from ev.text("message", "")
        yield from ev.close("incomplete" if cut else "completed")
        response["status"] = "incomplete" if cut else "completed"
        if cut:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        response["usage"] = _usage(usage)
        if keep:
            self.store.put(Response(json.loads(json.dumps(response))),
                           messages + [_assistant_message(response)])
        yield ev.event("response.incomplete" if cut else "response.completed",
                       response=ev.snapshot())


def _assistant_message(response: Response) -> dict[str, Any]:
    """A response's output as the assistant message a chat conversation continues from."""
    text = "".join(p["text"] for item in response["output"] if item["type"] == "message"
                   for p in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in response["output"] if item["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant"}
    if text or not calls:
        msg["content"] = text
    if calls:
        msg["tool_calls"] = calls
    return msg


def _not_found(response_id: Any, param: str) -> Exception:
    from .client import NotFoundError
    return NotFoundError(f"Previous response with id '{response_id!s:.100}' not found."
                         if param == "previous_response_id" else
                         f"No response with id '{response_id!s:.100}' found.",
                         param=param, code="previous_response_not_found"
                         if param == "previous_response_id" else "response_not_found")
