"""Constrained decoding: a grammar (JSON Schema, JSON, regex, a choice of strings, Lark/GBNF) turned
into a token mask at every step, so the output is always a prefix of the grammar's language.

The grammar engine is llguidance (the `structured` extra): it compiles the grammar against this
model's vocabulary (each id's raw bytes, from Tokenizer.token_bytes) and answers, per step, the set
of ids that keep the output valid. The sampler applies that set as one more logit filter; the
generation loop ends the answer as soon as the grammar is complete. A request names its grammar in
one GrammarSpec; tool calls can hand in their own (a Lark grammar embedding `%json` schemas).

    c = Constrainer(tokenizer, vocab_size, eos_ids)        # once per model (vocabulary ~0.3 s)
    spec = constraint_spec(response_format={"type": "json_object"})
    con = c.compile(spec)                                  # per request (cached per grammar)
    con.mask(logits); con.accept(token); con.finished
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from .errors import GenerationError, InvalidParameterError

EXTRA = "structured"                 # pip install "ignis[structured]"
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")
GUIDED = ("guided_json", "guided_choice", "guided_regex", "guided_grammar")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")     # OpenAI's rule for json_schema.name
_CACHE_SIZE = 64                                  # compiled grammars kept per model
# JSON whitespace between tokens: OpenAI's strict outputs are compact JSON with ", " and ": ";
# free whitespace would let a model pad forever (a random or confused model does). lenient stays
# off whatever a schema's own "x-guidance" says: a keyword the engine cannot enforce is an error
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                 "lenient": False}


def lark_json(schema: Mapping[str, Any]) -> str:
    """A Lark rule body matching JSON that validates against `schema`, written as response_format
    writes it (compact separators, no free whitespace): `args: ` + lark_json(schema) inside a
    larger grammar, such as a tool call's `<tool_call>{"name": ..., "arguments": <args>}`."""
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)


class StructuredOutputUnavailable(InvalidParameterError):
    """A request asks for constrained decoding but the grammar engine (the `structured` extra)
    is not installed."""

    def __init__(self, param: str):
        super().__init__(f"{param}: constrained decoding needs the llguidance package, which is not "
                         f"installed; install it with: pip install 'ignis[{EXTRA}]'", param=param,
                         code="missing_extra")


class ConstraintFailed(GenerationError, RuntimeError):
    """The grammar engine refused a token it had allowed, or left no token to choose (a bug in
    the engine or in ignis's vocabulary for it, never the request's fault)."""


@dataclass(frozen=True)
class GrammarSpec:
    """One request's output language. kind: "json_schema" (source: the schema as a dict),
    "json_object" (any JSON object), "regex", "choice" (a list of strings) or "grammar" (Lark or
    GBNF text). param: the request field it came from, which errors name."""
    kind: str
    source: Any
    param: str

    def key(self) -> str:
        """A cache key: the same grammar from any field compiles once."""
        return self.kind + "\0" + json.dumps(self.source, sort_keys=True, ensure_ascii=False)


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidParameterError:
    return InvalidParameterError(message, param=param, code=code)


def pydantic_response_format(cls: type) -> dict[str, Any]:
    """The json_schema response_format for a pydantic model class, made strict (every property
    required, no additional ones) as the official openai client makes it (with its own helper
    when it is installed)."""
    if not hasattr(cls, "model_json_schema"):
        raise _bad(f"response_format must be a dict or a pydantic model class, got the class "
                   f"{cls.__name__}", "response_format", "invalid_type")
    try:
        from openai.lib._pydantic import to_strict_json_schema
        schema = to_strict_json_schema(cls)
    except ImportError:
        schema = _strict(cls.model_json_schema())
    return {"type": "json_schema",
            "json_schema": {"name": cls.__name__[:64], "schema": schema, "strict": True}}


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
            schema["required"] = list(schema["properties"])
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def response_format_spec(rf: Any, param: str = "response_format") -> GrammarSpec | None:
    """The GrammarSpec an OpenAI `response_format` asks for (None: {"type": "text"} or absent),
    its shape checked as the OpenAI API reference gives it. A pydantic model class stands for
    its strict json_schema (pydantic_response_format)."""
    if rf is None:
        return None
    if isinstance(rf, type):
        rf = pydantic_response_format(rf)
    if not isinstance(rf, Mapping):
        raise _bad(f"{param} must be an object such as {{'type': 'json_object'}}, got "
                   f"{type(rf).__name__}", param, "invalid_type")
    kind = rf.get("type")
    if kind not in RESPONSE_FORMATS:
        raise _bad(f"{param}.type must be one of {list(RESPONSE_FORMATS)}, got {kind!r:.40}",
                   f"{param}.type", "invalid_value" if isinstance(kind, str) or kind is None
                   else "invalid_type")
    allowed = ("type", "json_schema") if kind == "json_schema" else ("type",)
    unknown = [k for k in rf if k not in allowed]
    if unknown:
        raise _bad(f"{param} of type {kind!r} takes only {list(allowed)}, got {str(unknown[0])!r:.40}",
                   f"{param}.{unknown[0]}", "unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", {"type": "object"}, param)
    js = rf.get("json_schema")
    at = f"{param}.json_schema"
    if js is None:
        raise _bad(f"{at} is missing: type 'json_schema' needs {{'name': ..., 'schema': {{...}}}}",
                   at, "missing_required_parameter")
    if not isinstance(js, Mapping):
        raise _bad(f"{at} must be an object with name and schema, got {type(js).__name__}", at,
                   "invalid_type")
    unknown = [k for k in js if k not in JSON_SCHEMA_FIELDS]
    if unknown:
        raise _bad(f"{at} takes {list(JSON_SCHEMA_FIELDS)}, got {str(unknown[0])!r:.40}",
                   f"{at}.{unknown[0]}", "unknown_parameter")
    name = js.get("name")
    if name is None:
        raise _bad(f"{at}.name is missing", f"{at}.name", "missing_required_parameter")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{at}.name must be 1 to 64 letters, digits, '_' or '-', got {name!r:.70}",
                   f"{at}.name", "invalid_value" if isinstance(name, str) else "invalid_type")
    for k in ("strict",):
        if js.get(k) is not None and not isinstance(js[k], bool):
            raise _bad(f"{at}.{k} must be true or false, got {js[k]!r:.40}", f"{at}.{k}",
                       "invalid_type")
    if js.get("description") is not None and not isinstance(js["description"], str):
        raise _bad(f"{at}.description must be a string", f"{at}.description", "invalid_type")
    if "schema" not in js:
        raise _bad(f"{at}.schema is missing: give the JSON Schema the answer must follow",
                   f"{at}.schema", "missing_required_parameter")
    return GrammarSpec("json_schema", _schema(js["schema"], f"{at}.schema"), f"{at}.schema")


def _schema(schema: Any, param: str) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise _bad(f"{param} must be a JSON Schema object (such as {{'type': 'object', "
                   f"'properties': {{...}}}}), got {type(schema).__name__}", param, "invalid_type")
    return dict(schema)


def constraint_spec(*, response_format: Any = None, guided_json: Any = None,
                    guided_choice: Any = None, guided_regex: Any = None,
                    guided_grammar: Any = None) -> GrammarSpec | None:
    """The one grammar a request asks for: `response_format` (OpenAI) or one of vLLM's guided_*
    fields (guided_json: a schema; guided_choice: a list of strings, the answer is one of them;
    guided_regex: a regular expression the whole answer matches; guided_grammar: Lark or GBNF).
    Asking for two is an error: which one should win is not for ignis to guess."""
    specs = []
    rf = response_format_spec(response_format)
    if rf is not None:
        specs.append(rf)
    if guided_json is not None:
        if isinstance(guided_json, str):
            try:
                guided_json = json.loads(guided_json)
            except ValueError as e:
                raise _bad(f"guided_json is not valid JSON ({e})", "guided_json") from None
        specs.append(GrammarSpec("json_schema", _schema(guided_json, "guided_json"), "guided_json"))
    if guided_choice is not None:
        if not isinstance(guided_choice, (list, tuple)):
            raise _bad(f"guided_choice must be a list of strings, got {type(guided_choice).__name__}",
                       "guided_choice", "invalid_type")
        if not guided_choice:
            raise _bad("guided_choice is empty: give at least one string the answer may be",
                       "guided_choice")
        for c in guided_choice:
            if not isinstance(c, str):
                raise _bad(f"guided_choice must hold strings only, got {c!r:.40}", "guided_choice",
                           "invalid_type")
            if not c:
                raise _bad("guided_choice holds an empty string, which is no answer",
                           "guided_choice")
        specs.append(GrammarSpec("choice", list(dict.fromkeys(guided_choice)), "guided_choice"))
    for name, kind, value in (("guided_regex", "regex", guided_regex),
                              ("guided_grammar", "grammar", guided_grammar)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise _bad(f"{name} must be a string, got {type(value).__name__}", name, "invalid_type")
        if not value.strip():
            raise _bad(f"{name} is empty", name)
        specs.append(GrammarSpec(kind, value, name))
    if len(specs) > 1:
        raise _bad(f"{specs[0].param.split('.')[0]} and {specs[1].param.split('.')[0]} both "
                   f"constrain the answer; give one of them", specs[1].param.split(".")[0])
    return specs[0] if specs else None


class TokenConstraint(Protocol):
    """What the sampler and the generation loop need from a constraint (one per request)."""

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of every id that may not come next to -inf, in place."""

    def accept(self, token_id: int) -> None:
        """The id chosen; the next mask() follows it."""

    @property
    def finished(self) -> bool:
        """The grammar is complete and nothing may follow: the answer ends here."""


def _require_llguidance(param: str) -> Any:
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401  (the bitmask helpers)
    except ImportError:
        raise StructuredOutputUnavailable(param) from None
    return llguidance


def available() -> bool:
    """Whether the grammar engine is installed."""
    try:
        _require_llguidance("")
    except StructuredOutputUnavailable:
        return False
    return True


class _Vocabulary:
    """ignis's tokenizer as llguidance's TokenizerWrapper reads one: every id's bytes (ids with
    no token get none and are never allowed), the special ids (which never spell text), and a
    tokenization of the short strings the engine forces (a fixed key, a closing bracket)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]):
        valid = tokenizer.token_mask(vocab_size)
        self.tokens = [tokenizer.token_bytes(i) if valid[i] else b"" for i in range(vocab_size)]
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if i < vocab_size)
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer
        special = set(self.special_token_ids)
        self._ids: dict[bytes, int] = {}
        for i, b in enumerate(self.tokens):
            if b and i not in special:
                self._ids.setdefault(b, i)
        self._longest = max((len(b) for b in self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        """Ids whose bytes join to exactly `text`: the tokenizer's own encoding when it spells
        the text (a SentencePiece normalizer prepends "▁" to a fragment, which would add a
        space), else the longest vocabulary match at each position."""
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        try:
            ids = self._tokenizer.encode(data.decode("utf-8"), add_special_tokens=False,
                                         split_special_tokens=True)
        except UnicodeDecodeError:
            ids = None
        if ids is not None and b"".join(self.tokens[i] for i in ids) == data:
            return ids
        out, at = [], 0
        while at < len(data):
            for n in range(min(self._longest, len(data) - at), 0, -1):
                i = self._ids.get(data[at:at + n])
                if i is not None:
                    out.append(i)
                    at += n
                    break
            else:                  # a byte no token spells: the engine never forces it
                at += 1
        return out


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[([^\]]*)\]')


class Constrainer:
    """One model's grammar compiler: its vocabulary in llguidance's form (built on first use,
    ~0.3 s for 151k ids) and a cache of compiled grammars, so a schema sent again costs a copy."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self._lock = threading.Lock()
        self._llg_tokenizer: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def _engine_tokenizer(self, llg: Any) -> Any:
        with self._lock:
            if self._llg_tokenizer is None:
                vocab = _Vocabulary(self.tokenizer, self.vocab_size, self.eos_ids or (0,))
                self._vocab = vocab
                wrapper = llg.TokenizerWrapper(vocab)
                try:
                    self._llg_tokenizer = llg.LLTokenizer(wrapper, n_vocab=self.vocab_size,
                                                          eos_token=list(self.eos_ids) or None)
                except TypeError:      # llguidance < 1.7 takes one end id; allowed() sets the rest
                    self._llg_tokenizer = llg.LLTokenizer(wrapper, n_vocab=self.vocab_size,
                                                          eos_token=vocab.eos_token_id)
            return self._llg_tokenizer

    def vocabulary(self) -> "_Vocabulary":
        """The vocabulary as the engine reads it (also: a text's ids, for feeding a matcher)."""
        llg = _require_llguidance("tools")
        self._engine_tokenizer(llg)
        return self._vocab

    def warm(self) -> bool:
        """Build the vocabulary's index now, when llguidance is installed (False when not), so
        that the first constrained request does not wait for it."""
        try:
            llg = _require_llguidance("")
        except StructuredOutputUnavailable:
            return False
        self._engine_tokenizer(llg)
        return True

    def grammar(self, spec: GrammarSpec) -> str:
        """The llguidance grammar text of `spec` (InvalidParameterError naming its field when the
        source cannot be read)."""
        llg = _require_llguidance(spec.param)
        try:
            if spec.kind in ("json_schema", "json_object"):
                return llg.LLMatcher.grammar_from_json_schema(spec.source, overrides=_JSON_OPTIONS)
            if spec.kind == "regex":
                return llg.LLMatcher.grammar_from_regex(spec.source)
            if spec.kind == "choice":
                return llg.grammar_from("choice", spec.source)
            if spec.kind == "grammar":
                return llg.grammar_from("grammar", spec.source)
        except (ValueError, TypeError) as e:
            raise _bad(f"{spec.param}: {e}", spec.param) from None
        raise ValueError(f"unknown grammar kind {spec.kind!r}")

    def compile(self, spec: GrammarSpec) -> "GrammarConstraint":
        """A fresh constraint for one request. Features the engine cannot enforce are an
        InvalidParameterError (code unsupported_schema / invalid_grammar) naming them: an answer
        is never left silently unconstrained."""
        llg = _require_llguidance(spec.param)
        tok = self._engine_tokenizer(llg)
        key = spec.key()
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
        if template is None:
            # the matcher compiles the grammar once; what it cannot enforce is its error
            template = llg.LLMatcher(tok, self.grammar(spec), log_level=0)
            if template.is_error():
                raise self._refusal(spec, template.get_error())
            with self._lock:
                self._cache[key] = template
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        with self._lock:
            matcher = template.deep_copy()
        return GrammarConstraint(matcher, self.vocab_size, self.eos_ids, llg)

    @staticmethod
    def _refusal(spec: GrammarSpec, message: str) -> InvalidParameterError:
        message = " ".join(message.split())[:400] or "invalid grammar"
        if spec.kind in ("json_schema", "json_object"):
            found = _UNIMPLEMENTED.search(message)
            if found:
                words = ", ".join(found.group(1).split(","))
                return _bad(f"{spec.param} uses JSON Schema keyword(s) {words} that constrained "
                            f"decoding cannot enforce; remove them or express the rule otherwise "
                            f"(engine: {message})", spec.param, "unsupported_schema")
            return _bad(f"{spec.param} is not a JSON Schema constrained decoding can enforce: "
                        f"{message}", spec.param, "unsupported_schema")
        what = {"regex": "regular expression", "choice": "list of choices",
                "grammar": "grammar (Lark or GBNF)"}[spec.kind]
        return _bad(f"{spec.param} is not a valid {what}: {message}", spec.param,
                    "invalid_grammar")


class GrammarConstraint:
    """One request's grammar state (an llguidance matcher): the mask of the next step, advanced
    by each accepted id. The model's end ids are allowed exactly when the grammar is complete."""

    def __init__(self, matcher: Any, vocab_size: int, eos_ids: Sequence[int], llg: Any):
        self._m = matcher
        self._n = vocab_size
        self._eos = np.asarray(sorted(set(eos_ids)), np.int64)
        self._bits = np.zeros((1, (vocab_size + 31) // 32), np.int32)
        self._words = self._bits.view(np.uint32)[0]
        self._eos_word = (self._eos >> 5).astype(np.intp)
        self._eos_bit = (np.uint32(1) << (self._eos & 31).astype(np.uint32)).astype(np.uint32)
        self._eos_set = frozenset(int(i) for i in self._eos)
        self._ended = False
        self._fill = llg.numpy.fill_next_token_bitmask
        self.tokens = 0

    def _next_bits(self) -> np.ndarray:
        """The next step's bitmask (bit i of word i // 32: id i allowed), end ids set exactly
        when the grammar is complete."""
        self._fill(self._m, self._bits)
        if self._m.is_error():
            raise ConstraintFailed(f"the grammar engine failed: {self._m.get_error()}")
        if self._eos.size:
            if self._m.is_accepting():
                np.bitwise_or.at(self._words, self._eos_word, self._eos_bit)
            else:
                np.bitwise_and.at(self._words, self._eos_word, ~self._eos_bit)
        return self._words

    def allowed(self) -> np.ndarray:
        """Bool per id: may it come next?"""
        words = self._next_bits()
        return np.unpackbits(words.view(np.uint8), bitorder="little")[:self._n].view(bool)

    def mask(self, logits: np.ndarray) -> None:
        """-inf on the ids the grammar does not allow next, in one pass over its bitmask."""
        from .. import _core
        if logits.dtype == np.float64 and logits.ndim == 1 and logits.flags.c_contiguous:
            kept = _core.mask_logits(logits, self._next_bits(), self._n)    # the sampler's case
        else:
            ok = self.allowed()
            logits[~ok] = -np.inf
            kept = np.count_nonzero(ok)
        if kept == 0:
            raise ConstraintFailed("the grammar leaves no token to choose")

    def accept(self, token_id: int) -> None:
        if self._ended:
            raise ConstraintFailed(f"token {token_id} after the end of a constrained answer")
        if int(token_id) in self._eos_set:
            # allowed only when the grammar is complete (allowed()); the matcher need not see it
            # (older llguidance knows a single end id)
            self._ended = True
            self.tokens += 1
            return
        if not self._m.consume_token(int(token_id)):
            raise ConstraintFailed(f"the grammar engine refused token {token_id} it had allowed: "
                                   f"{self._m.get_error()}")
        self.tokens += 1

    @property
    def finished(self) -> bool:
        return self._ended or self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar (it may still go on)."""
        return self._m.is_accepting()


class TriggeredConstraint:
    """A grammar that begins where the output first spells `trigger` (at its very start only,
    when at_start): the text before is free, what follows must be a sentence of the grammar
    (tool_choice "auto": the model may answer in words, but a call it begins is a valid call).
    The trigger's token may carry text past it; that text is fed to the grammar, and should the
    grammar refuse it, the rest of the answer stays free (the reader then judges it).

    `inner` is compiled before generation starts (a grammar the engine refuses is the request's
    400, never an error inside the decode loop). think: the model writes <think> blocks, whose
    text is reasoning: a trigger inside one does not count ("open": the answer begins inside
    one, its prompt having opened it). The output is scanned once: each token's bytes with the
    few before them that may hold the start of a marker."""

    def __init__(self, constrainer: Constrainer, inner: "GrammarConstraint", trigger: str, *,
                 at_start: bool = False, think: str | None = None):
        from .reasoning import CLOSE, OPEN
        self._constrainer = constrainer
        self._pending: GrammarConstraint | None = inner
        self._trigger = trigger.encode("utf-8")
        self._at_start = at_start
        self._open = OPEN.encode() if think else None
        self._close = CLOSE.encode()
        self._thinking = think == "open"
        self._keep = max(len(self._trigger), len(self._close), len(OPEN)) - 1
        self._tail = b""           # the end of the output that may begin a marker
        self._lead = b""           # at_start: the output so far, while it may begin the trigger
        self._inner: GrammarConstraint | None = None
        self._off = False          # the trigger can no longer come, or the grammar gave up
        self.tokens = 0

    def mask(self, logits: np.ndarray) -> None:
        if self._inner is not None:
            self._inner.mask(logits)

    def accept(self, token_id: int) -> None:
        self.tokens += 1
        if self._inner is not None:
            self._inner.accept(token_id)
            return
        if self._off:
            return
        rest = self._scan(self._constrainer.tokenizer.token_bytes(token_id))
        if rest is None:
            return
        inner, self._pending = self._pending, None
        assert inner is not None
        try:
            for t in self._constrainer.vocabulary()(rest) if rest else ():
                inner.accept(t)
        except ConstraintFailed:
            self._off = True
            return
        self._inner = inner

    def _scan(self, new: bytes) -> bytes | None:
        """The new bytes read: what follows the trigger once it is written (None until then)."""
        if self._at_start:
            self._lead += new
            text = self._lead.lstrip(b" \t\r\n")
            if text.startswith(self._trigger):
                return text[len(self._trigger):]
            if not self._trigger.startswith(text):
                self._off = True
            return None
        buf, pos = self._tail + new, 0
        while True:
            if self._thinking:
                i = buf.find(self._close, pos)
                if i < 0:
                    break
                pos, self._thinking = i + len(self._close), False
                continue
            i = buf.find(self._trigger, pos)
            j = buf.find(self._open, pos) if self._open else -1
            if j >= 0 and (i < 0 or j < i):
                pos, self._thinking = j + len(self._open), True
                continue
            if i >= 0:
                return buf[i + len(self._trigger):]
            break
        self._tail = buf[max(pos, len(buf) - self._keep):]
        return None

    @property
    def finished(self) -> bool:
        return self._inner is not None and self._inner.finished
