"""Tool calls: the function-calling syntax a chat template teaches its model, read back from the
model's output (whole or streamed) as OpenAI tool calls, and written as a grammar when a call is
required.

Two formats, chosen from the template's text (tool_format):
- "hermes" (Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one
  block per call, text before them is the message's content;
- "llama3_json" (Llama 3.1 / 3.2): the whole answer is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`, several calls separated by `;`.

ToolCallParser is the one reader: parse() feeds a whole answer through the same state machine a
stream goes through, so a streamed answer's calls, joined, equal the answer's. `live=False` (what
`tool_choice="auto"` uses) holds each call until it is complete and valid, so text that only
looked like a call stays content; `live=True` (a grammar guarantees the calls) sends each call's
name as soon as it is written and its arguments piece by piece.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .constrain import lark_json
from .errors import InvalidParameterError
from .markers import partial_suffix

TOOL_CHOICES = ("none", "auto", "required")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")      # OpenAI's rule for function names
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
MAX_TOOLS = 128                    # OpenAI's limit on tools per request
MAX_SCHEMA_CHARS = 65536           # one function's parameters schema, as JSON text
# `{"name": "<name>", "<key>": ` at a call's start: what lets a stream send the name first
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(arguments|parameters)"\s*:\s*')
_WS = " \t\r\n"


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidParameterError:
    return InvalidParameterError(message, param=param, code=code)


# ---- the request's tools and tool_choice -----------------------------------------------------------

@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tools: the function definitions (OpenAI's shape, as the template
    renders them), the choice ("none", "auto", "required", or "function" with `name`) and whether
    several calls may come in one answer."""
    tools: list[dict[str, Any]]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        """The answer must be tool calls (a grammar forces them)."""
        return self.choice in ("required", "function")

    def functions(self) -> list[dict[str, Any]]:
        """The functions a call may name: all of them, or the one tool_choice names."""
        fns = [t["function"] for t in self.tools]
        return [f for f in fns if f["name"] == self.name] if self.choice == "function" else fns


def check_tools(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None
                ) -> ToolRequest | None:
    """The request's tools checked as the OpenAI API reference gives them: a list of
    {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}, names
    unique; tool_choice "none" / "auto" / "required" / {"type": "function", "function": {"name"}}
    naming one of them. None when the request has no tools (tool_choice then may only be "none"
    or "auto", as OpenAI answers)."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise _bad(f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r:.40}",
                   "parallel_tool_calls", "invalid_type")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise _bad(f"tools must be a list of tool objects ({{'type': 'function', 'function': "
                   f"{{'name': ..., 'parameters': {{...}}}}}}), got {type(tools).__name__}", "tools",
                   "invalid_type")
    if tools is not None and len(tools) > MAX_TOOLS:
        raise _bad(f"tools has {len(tools)} functions; a request takes at most {MAX_TOOLS}",
                   "tools", "array_above_max_length")
    checked, names = [], set()
    for i, tool in enumerate(tools or ()):
        at = f"tools.[{i}]"
        if not isinstance(tool, Mapping):
            raise _bad(f"{at} must be a tool object ({{'type': 'function', 'function': {{...}}}}), "
                       f"got {type(tool).__name__}", at, "invalid_type")
        unknown = [k for k in tool if k not in ("type", "function")]
        if unknown:
            raise _bad(f"{at} has an unknown field {str(unknown[0])!r:.40}; a tool takes 'type' and "
                       f"'function'", f"{at}.{unknown[0]}", "unknown_parameter")
        if tool.get("type") != "function":
            raise _bad(f"{at}.type must be 'function' (the only tool type a chat template renders), "
                       f"got {tool.get('type')!r:.40}", f"{at}.type")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise _bad(f"{at}.function must be an object with name and parameters, got "
                       f"{type(fn).__name__}", f"{at}.function",
                       "missing_required_parameter" if fn is None else "invalid_type")
        unknown = [k for k in fn if k not in FUNCTION_FIELDS]
        if unknown:
            raise _bad(f"{at}.function has an unknown field {str(unknown[0])!r:.40}; it takes "
                       f"{list(FUNCTION_FIELDS)}", f"{at}.function.{unknown[0]}", "unknown_parameter")
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise _bad(f"{at}.function.name must be 1 to 64 letters, digits, '_' or '-', got "
                       f"{name!r:.70}", f"{at}.function.name",
                       "invalid_value" if isinstance(name, str) else "invalid_type")
        if name in names:
            raise _bad(f"{at}.function.name {name!r} is given twice; function names must be unique",
                       f"{at}.function.name")
        names.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _bad(f"{at}.function.description must be a string", f"{at}.function.description",
                       "invalid_type")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _bad(f"{at}.function.strict must be true or false", f"{at}.function.strict",
                       "invalid_type")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, Mapping) or
                                   params.get("type", "object") != "object"):
            raise _bad(f"{at}.function.parameters must be a JSON Schema of an object (such as "
                       f"{{'type': 'object', 'properties': {{...}}}}), got {params!r:.60}",
                       f"{at}.function.parameters", "invalid_type" if not isinstance(params, Mapping)
                       else "invalid_value")
        if params is not None:
            try:
                size = len(json.dumps(params, ensure_ascii=False))
            except (TypeError, ValueError, RecursionError):
                raise _bad(f"{at}.function.parameters must be JSON", f"{at}.function.parameters",
                           "invalid_type") from None
            if size > MAX_SCHEMA_CHARS:
                raise _bad(f"{at}.function.parameters is {size} characters of JSON; a function's "
                           f"schema may have at most {MAX_SCHEMA_CHARS}", f"{at}.function.parameters")
        function = {k: fn[k] for k in FUNCTION_FIELDS if fn.get(k) is not None}
        checked.append({"type": "function", "function": function})
    choice, chosen = _tool_choice(tool_choice, names)
    if not checked:
        if choice in ("required", "function"):
            raise _bad(f"tool_choice {tool_choice!r:.60} needs tools, and the request has none",
                       "tool_choice")
        return None
    return ToolRequest(checked, choice, chosen, parallel_tool_calls is not False)


def _tool_choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise _bad(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', "
                       f"'function': {{'name': ...}}}}, got {value!r:.40}", "tool_choice")
        return value, None
    if not isinstance(value, Mapping):
        raise _bad(f"tool_choice must be 'none', 'auto', 'required' or a tool object, got "
                   f"{type(value).__name__}", "tool_choice", "invalid_type")
    unknown = [k for k in value if k not in ("type", "function")]
    if unknown:
        raise _bad(f"tool_choice has an unknown field {str(unknown[0])!r:.40}; it takes 'type' and "
                   f"'function'", f"tool_choice.{unknown[0]}", "unknown_parameter")
    if value.get("type") != "function":
        raise _bad(f"tool_choice.type must be 'function', got {value.get('type')!r:.40}",
                   "tool_choice.type")
    fn = value.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise _bad("tool_choice.function must be an object with the name of one of the tools",
                   "tool_choice.function", "invalid_type")
    if set(fn) - {"name"}:
        extra = sorted(set(fn) - {"name"}, key=str)[0]
        raise _bad(f"tool_choice.function takes only 'name', got {str(extra)!r:.40}",
                   f"tool_choice.function.{extra}", "unknown_parameter")
    if fn["name"] not in names:
        raise _bad(f"tool_choice names the function {fn['name']!r:.70}, which is not among the "
                   f"tools ({', '.join(sorted(names)) or 'none given'})", "tool_choice.function.name")
    return "function", fn["name"]


# ---- formats ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolFormat:
    """One model family's call syntax. open/close: the markers around each call (hermes); a
    format without them (llama3_json) has calls only as the whole answer, joined by `sep`."""
    name: str
    args_key: str
    open: str = ""
    close: str = ""
    sep: str = ""
    prefix: str = ""          # a marker the answer may begin with (Llama's <|python_tag|>)

    @property
    def trigger(self) -> str:
        """The text that shows the model begins a call (tool_choice "auto"): the open marker,
        or (llama3_json) the <|python_tag|> an answer of calls begins with. A Llama answer
        that begins with a bare `{` is not held to the grammar, only read afterwards (as vLLM
        does): JSON is also a plain answer."""
        return self.open.rstrip("\n") if self.open else self.prefix

    def grammar(self, request: ToolRequest, *, after_trigger: bool = False,
                think: str | None = None) -> str:
        """A Lark grammar (llguidance) of answers that are only tool calls: one, or with
        parallel_tool_calls one or more, each naming one of request.functions() with arguments
        that validate against its parameters schema (any object when it has none).
        after_trigger: the grammar of what follows the trigger (tool_choice "auto", where the
        model began a call itself). think (a thinking template, not after_trigger): the calls
        may follow a <think>...</think> block ("start"), or must follow the end of the one the
        prompt opened ("open"), as vLLM applies structured output once reasoning has ended."""
        lines, alts, firsts = [], [], []
        for i, fn in enumerate(request.functions()):
            head = self.open + '{"name": ' + json.dumps(fn["name"]) + ', "' + self.args_key + '": '
            tail = json.dumps("}" + self.close, ensure_ascii=False)
            lines.append(f"call_{i}: {json.dumps(head, ensure_ascii=False)} args_{i} {tail}")
            rest = head[len(self.trigger):] if head.startswith(self.trigger) else head
            lines.append(f"first_{i}: {json.dumps(rest, ensure_ascii=False)} args_{i} {tail}")
            schema = fn.get("parameters") or {"type": "object"}
            lines.append(f"args_{i}: {lark_json(schema)}")
            alts.append(f"call_{i}")
            firsts.append(f"first_{i}")
        lines.insert(0, "call: " + " | ".join(alts))
        lines.insert(1, "first: " + " | ".join(firsts))
        sep = json.dumps(self.sep, ensure_ascii=False)
        begin = "first" if after_trigger else "call"
        if think and not after_trigger:
            # the block's text is anything without a second </think>: its first one ends it
            body = r"(?s:.*)<\/think>[ \t\r\n]*"
            opener = r"<think>" if think == "start" else ""
            lines.append(f"THINK_BLOCK: /{opener}{body}/ & ~/(?s:.*)<\\/think>(?s:.*)<\\/think>(?s:.*)/")
            begin = ("THINK_BLOCK? " if think == "start" else "THINK_BLOCK ") + begin
        start = f"start: {begin} ({sep} call)*" if request.parallel else f"start: {begin}"
        return "\n".join([start] + lines) + "\n"


HERMES = ToolFormat("hermes", "arguments", open="<tool_call>\n", close="\n</tool_call>", sep="\n")
LLAMA3_JSON = ToolFormat("llama3_json", "parameters", sep="; ", prefix="<|python_tag|>")
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON)}


def tool_format(template: str | None) -> ToolFormat | None:
    """The call syntax a chat template teaches (None: one ignis cannot read). Qwen2.5 and Qwen3
    templates show `<tool_call>` blocks; Llama 3.1 / 3.2 ones ask for {"name", "parameters"}."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if '"parameters"' in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3_JSON
    return None


# ---- reading calls ---------------------------------------------------------------------------------

@dataclass
class Event:
    """One piece of the parsed answer. kind "content": text; "call": a call begins (index, id,
    name); "arguments": the next piece of call `index`'s arguments."""
    kind: str
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str            # the JSON object's text, as the model wrote it

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Call:
    """One call's text as it arrives: the name once `{"name": "...", "arguments": ` is written,
    then the arguments object's text up to its closing brace (a JSON scanner tracks strings and
    depth), then what follows it. result() reads the whole text as JSON."""

    def __init__(self, index: int):
        self.index = index
        self.id = new_call_id()
        self.text = ""
        self.name: str | None = None
        self.args_at = -1          # where the arguments' text starts, once the head is read
        self.args_end = -1         # one past its closing brace
        self.end = -1              # one past the call object's closing brace
        self._scan = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self.sent = 0              # arguments' characters already given out
        self.space = ""            # the whitespace before the call's opening marker

    def feed(self, text: str) -> list[Event]:
        self.text += text
        out = []
        if self.name is None:
            m = _HEAD.match(self.text)
            if m is None or m.end() == len(self.text):     # (more space may follow)
                return out
            try:
                self.name = json.loads(m.group(1))
            except ValueError:
                return out
            self.args_at = self._scan = m.end()
            out.append(Event("call", index=self.index, id=self.id, name=self.name))
        self._advance()
        stop = self.args_end if self.args_end >= 0 else len(self.text)
        if self.args_at >= 0 and self.text[self.args_at:self.args_at + 1] == "{" and stop > self.sent:
            start = max(self.sent, self.args_at)
            if stop > start:
                out.append(Event("arguments", text=self.text[start:stop], index=self.index))
                self.sent = stop
        return out

    def _advance(self) -> None:
        """Scan the new characters: find the end of the arguments object and of the call."""
        t = self.text
        if self.args_at < 0 or self.end >= 0 or t[self.args_at:self.args_at + 1] not in ("{", ""):
            return
        i = self._scan
        while i < len(t):
            c = t[i]
            if self.args_end < 0:
                if self._in_str:
                    if self._esc:
                        self._esc = False
                    elif c == "\\":
                        self._esc = True
                    elif c == '"':
                        self._in_str = False
                elif c == '"':
                    self._in_str = True
                elif c in "{[":
                    self._depth += 1
                elif c in "}]":
                    self._depth -= 1
                    if self._depth == 0:
                        self.args_end = i + 1
            elif c == "}":
                self.end = i + 1
                break
            elif c not in _WS:
                self.end = -2          # something else follows the arguments: not this shape
                break
            i += 1
        self._scan = i

    def result(self, body: str) -> ToolCall | None:
        """The call `body` (its whole JSON text) spells, or None when it is not one: a JSON
        object with a string "name" and an object "arguments" / "parameters" (or a string
        holding one). The arguments' text is the model's own when the call had the usual shape,
        else the object written compactly."""
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        keys = [k for k in ("arguments", "parameters") if k in obj]
        if len(keys) != 1 or set(obj) - {"name", keys[0]}:
            return None
        args = obj[keys[0]]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        if self.args_end >= 0 and self.name == obj["name"] and self.text.strip() == body.strip():
            raw = self.text[self.args_at:self.args_end]
            try:
                if json.loads(raw) == args:
                    return ToolCall(self.id, obj["name"], raw)
            except ValueError:
                pass
        return ToolCall(self.id, obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    """The answer as content and tool calls, fed in pieces (feed) and ended (finish), giving
    Events in order; `calls` and `content` hold the result. Text around the calls is content
    without the whitespace that joins it to them; a call whose text is no call stays content.
    parallel=False keeps the first call only."""

    def __init__(self, fmt: ToolFormat, *, live: bool = False, parallel: bool = True,
                 names: Sequence[str] = ()):
        self.fmt = fmt
        self.live = live
        self.parallel = parallel
        # bare calls (hermes, not live): an answer that is only a call object naming one of
        # `names`, bare or in a ```json fence, is read as calls too. Qwen2.5-Coder answers so
        # instead of writing <tool_call> (vLLM #32926); held only while the answer's beginning
        # may still be one, so other answers stream as they come
        self._names = frozenset(names) if fmt.open and not live else frozenset()
        self._bare = "maybe" if self._names else "no"
        self._bare_text = ""
        self.calls: list[ToolCall] = []
        self._content: list[str] = []
        self._buf = ""            # text not yet given out
        self._held_ws = ""        # whitespace that may turn out to join content to a call
        self._after_call = False
        self._call: _Call | None = None
        self._pending: list[Event] = []     # a held call's events, until it proves valid
        self._started = False     # llama3_json: the first non-space character was seen
        self._whole = False       # llama3_json: the answer is calls
        self._done_calls: list[_Call] = []  # llama3_json, live: the calls read so far
        self._done = False

    @property
    def content(self) -> str | None:
        text = "".join(self._content)
        return text if text else None

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        self.feed(text)
        self.finish()
        return self.content, self.calls

    # -- content, with whitespace next to calls dropped --
    def _text(self, text: str, out: list[Event]) -> None:
        if self._after_call:
            text = text.lstrip(_WS)
            if not text:
                return
            self._after_call = False
        stripped = text.rstrip(_WS)
        if stripped:
            piece = self._held_ws + stripped
            self._held_ws = ""
            self._content.append(piece)
            out.append(Event("content", text=piece))
        self._held_ws += text[len(stripped):]

    def _flush_ws(self, out: list[Event]) -> None:
        if self._held_ws and not self._after_call:
            self._content.append(self._held_ws)
            out.append(Event("content", text=self._held_ws))
        self._held_ws = ""

    def _take(self, call: ToolCall, events: list[Event], out: list[Event]) -> None:
        """A valid call: recorded, and its events given out (in live mode they went already)."""
        if self.calls and not self.parallel:
            return
        index = len(self.calls)
        self.calls.append(call)
        self._held_ws = ""
        self._after_call = True
        if self.live:
            return
        sent = "".join(e.text for e in events if e.kind == "arguments")
        if not events or events[0].kind != "call" or sent != call.arguments:
            events = [Event("call", index=index, id=call.id, name=call.name),
                      Event("arguments", text=call.arguments, index=index)]
        for e in events:
            e.index = index
        out.extend(events)

    def _call_events(self, events: list[Event], out: list[Event]) -> None:
        if self.live and (self.parallel or not self.calls):
            out.extend(events)
        else:
            self._pending.extend(events)

    # -- feeding --
    def feed(self, text: str) -> list[Event]:
        if self._done:
            raise RuntimeError("feed() after finish()")
        out: list[Event] = []
        if self._bare != "no":
            self._bare_text += text
            if self._bare == "maybe":
                self._bare = _bare_start(self._bare_text)
            if self._bare != "no":
                return out
            text, self._bare_text = self._bare_text, ""
        self._buf += text
        if self.fmt.open:
            self._feed_blocks(out)
        else:
            self._feed_whole(out)
        return out

    def _markers(self) -> tuple[str, str]:
        # the newlines inside the markers are the model's whitespace: a call may be written
        # without them
        return self.fmt.open.rstrip("\n"), self.fmt.close.lstrip("\n")

    def _feed_blocks(self, out: list[Event]) -> None:
        op, cl = self._markers()
        while self._buf:
            if self._call is None:
                i = self._buf.find(op)
                if i < 0:
                    keep = partial_suffix(self._buf, op)
                    self._text(self._buf[:len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep:]
                    return
                self._text(self._buf[:i], out)
                self._buf = self._buf[i + len(op):]
                self._call = _Call(len(self.calls))
                # the space before the call goes with it (back to content if it is no call)
                self._call.space, self._held_ws = self._held_ws, ""
                self._pending = []
                continue
            j = self._buf.find(cl)
            upto = j if j >= 0 else len(self._buf) - partial_suffix(self._buf, cl)
            if upto > 0:
                self._call_events(self._call.feed(self._buf[:upto]), out)
                self._buf = self._buf[upto:]
            if j < 0:
                return
            self._buf = self._buf[len(cl):]
            self._close_block(out, closed=True)

    def _close_block(self, out: list[Event], closed: bool) -> None:
        call, self._call = self._call, None
        assert call is not None
        result = call.result(call.text)
        if result is not None:
            self._take(result, self._pending, out)
        elif not (self.live and call.name is not None):   # (what went out cannot be taken back)
            op, cl = self._markers()
            self._text(call.space + op + call.text + (cl if closed else ""), out)
        self._pending = []

    def _feed_whole(self, out: list[Event]) -> None:
        if not self._started:
            t = self._buf.lstrip(_WS)
            if self.fmt.prefix and t.startswith(self.fmt.prefix):
                t = t[len(self.fmt.prefix):].lstrip(_WS)
            elif self.fmt.prefix and t and self.fmt.prefix.startswith(t):
                return              # part of the prefix so far
            if not t:
                return
            self._started = True
            self._whole = t.startswith("{")
            if self._whole:
                self._buf = t
        if not self._whole:
            self._text(self._buf, out)
            self._buf = ""
            return
        if not self.live:
            return                  # read whole at finish()
        while self._buf:
            if self._call is None:
                t = self._buf.lstrip(_WS + ";")
                if not t:
                    return
                self._buf = t
                self._call = _Call(len(self._done_calls))
            c = self._call
            self._call_events(c.feed(self._buf), out)
            self._buf = ""
            if c.end < 0:
                return
            self._buf = c.text[c.end:]
            c.text = c.text[:c.end]
            self._done_calls.append(c)
            self._call = None

    def finish(self) -> list[Event]:
        """The end of the answer: a call still open is read as it is (complete JSON is a
        call; anything else is content)."""
        if self._done:
            return []
        out: list[Event] = []
        if self._bare != "no":
            self._bare = "no"
            calls = self._bare_calls(self._bare_text)
            if calls is None:
                self._buf += self._bare_text
            else:
                for c in calls:
                    self._take(c, [], out)
        if self.fmt.open:
            if self._call is not None:
                if self._buf:
                    self._call_events(self._call.feed(self._buf), out)
                    self._buf = ""
                self._close_block(out, closed=False)
            elif self._buf:
                self._text(self._buf, out)
                self._buf = ""
        elif self._whole:
            self._finish_whole(out)
        elif self._buf:              # only space, or part of the prefix: plain text
            self._text(self._buf, out)
            self._buf = ""
        self._flush_ws(out)
        self._done = True
        return out

    def _finish_whole(self, out: list[Event]) -> None:
        if self.live:
            calls = self._done_calls + ([self._call] if self._call is not None else [])
            if self._call is not None and self._buf:
                self._call.feed(self._buf)
            for c in calls:
                r = c.result(c.text)
                if r is not None:
                    self._take(r, [], out)
            return
        text, objs, pos = self._buf, [], 0
        decoder = json.JSONDecoder()
        while pos < len(text):
            try:
                _, end = decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):
                objs = None
                break
            objs.append(text[pos:end])
            pos = end
            while pos < len(text) and text[pos] in _WS + ";":
                pos += 1
        results = []
        for i, body in enumerate(objs or ()):
            c = _Call(i)
            c.feed(body)
            results.append(c.result(body))
        if not results or any(r is None for r in results):
            self._text(text, out)
            return
        for r in results:
            self._take(r, [], out)

    def _bare_calls(self, text: str) -> list[ToolCall] | None:
        """The calls of an answer that is only a call object (or a list of them) naming
        offered functions, bare or in a ```json fence; None when it is anything else."""
        m = _FENCE.fullmatch(text)
        body = m.group(1) if m else text
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        items = value if isinstance(value, list) and value else [value]
        calls = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or item.get("name") not in self._names:
                return None
            c = _Call(i)
            r = c.result(json.dumps(item, ensure_ascii=False))
            if r is None:
                return None
            calls.append(r)
        return calls


_FENCE = re.compile(r"\s*```(?:json)?[ \t]*\n(.*)\n[ \t]*```\s*", re.S)
_BARE_HEAD = '{"name":"'


def _bare_start(text: str) -> str:
    """"maybe" while `text` may still begin a bare call ({"name": "..." bare or after a
    ```json line), "yes" once it does, "no" once it cannot."""
    t = text.lstrip(_WS)
    if t.startswith("`"):
        nl = t.find("\n")
        if nl < 0:
            return "maybe" if "```json".startswith(t.rstrip(" \t")) or \
                t.rstrip(" \t") in ("```", "```json") else "no"
        if t[:nl].strip() not in ("```", "```json"):
            return "no"
        t = t[nl + 1:]
    squeezed = re.sub(r"\s+", "", t)
    if squeezed.startswith(_BARE_HEAD):
        return "yes"
    return "maybe" if _BARE_HEAD.startswith(squeezed) else "no"




def parse_tool_calls(text: str, fmt: ToolFormat, *, parallel: bool = True,
                     names: Sequence[str] = ()) -> tuple[str | None, list[ToolCall]]:
    """A whole answer read as (content, calls): what the stream of the same text gives.
    names: the offered functions (enables bare calls, see ToolCallParser)."""
    return ToolCallParser(fmt, parallel=parallel, names=names).parse(text)
