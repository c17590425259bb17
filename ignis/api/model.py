"""The object `ignis.load` returns: a model ready to generate, stream and chat.

    m = ignis.load("qwen2.5-coder-0.5b-instruct", weight_format="q8")
    print(m.chat([{"role": "user", "content": "hi"}], max_tokens=32).text)
    vecs = m.embed(["first text", "second text"])           # [2, dim], unit length

With parallel=N the model serves N generations at once (from N threads): each gets a KV slot of
its own, and their forward steps are batched (ignis.generate.batch), one pass over the weights for
all of them.
"""
from __future__ import annotations

import inspect
import json
import queue
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..generate import (Chunk, Generation, GenerationCancelled, GenerationResult,
                        InvalidParameterError, KVSession, ModelBusyError, SamplingParams,
                        cancel_when, raise_if_cancelled, resolve_params)
from ..generate.loop import current_cancel
from ..generate.batch import BatchScheduler
from ..generate.constrain import (GUIDED, Constrainer, GrammarSpec, StructuredOutputUnavailable,
                                  TokenConstraint, TriggeredConstraint, constraint_spec)
from ..generate.reasoning import is_thinking_template, opens_in_prompt
from ..generate.speculative import (DraftModel, PromptLookup, SpeculativeError, SpeculativeSpec,
                                    SpeculativeStats, check_combinable, parse_speculative)
from ..generate.tools import ToolFormat, ToolRequest, check_tools, tool_format
from ..loader.config import GenerationConfig, ModelConfig
from ..loader.resolve import ModelFiles

_SAMPLING_ARGS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "logit_bias", "seed", "stop", "logprobs",
                  "top_logprobs", "ignore_eos")
POOLINGS = ("mean", "last")
TEMPLATE_KWARGS_MAX_CHARS = 16384   # chat_template_kwargs' JSON text: variables, not documents
TEMPLATE_KWARGS_MAX_DEPTH = 8
EMBED_MAX_INPUTS = 2048          # inputs per embed() call, as the OpenAI API allows
EMBED_MAX_CONTEXTS = 8           # an embed() call holds at most this many contexts' worth of tokens
MAX_CHOICES = 128                # n: the most choices one request asks for (OpenAI's and vLLM's bound)
_MODEL_DEFAULT = object()        # a request that does not say `speculative` takes the model's


def same_vocabulary(a: Any, b: Any) -> str | None:
    """None when tokenizers a and b map every id to the same bytes (a draft model's guesses are
    then the target's tokens), else what differs, for the error."""
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size} tokens against {b.vocab_size}"
    for i in range(a.vocab_size):
        has = a.has_token(i)
        if has != b.has_token(i) or has and a.token_bytes(i) != b.token_bytes(i):
            return f"token id {i} differs"
    if set(a.special_ids) != set(b.special_ids):
        return "their special tokens differ"
    return None


class _Draft:
    """A draft model loaded beside the target: its engine (one KV slot per target slot), the
    lock that serialises its use, and its name."""

    def __init__(self, name: str, files: Any, engine: Any):
        self.name = name
        self.files = files
        self.engine = engine
        self.lock = threading.Lock()


@lru_cache(maxsize=1)
def reserved_template_names() -> frozenset[str]:
    """Names chat_template_kwargs may not use: every parameter of the functions the variables
    are passed through as keywords (Model.chat_prompt_ids -> Tokenizer.encode_chat ->
    apply_chat_template -> render_chat_template; `chat_template` would let a request bring its
    own template, `special_tokens` or `self` collide with the call), and every name the renderer
    sets itself (messages, tools, the special tokens, raise_exception, strftime_now, Jinja's
    globals). Read from the signatures, so a new parameter is refused without a list to update."""
    from ..tokenizer import Tokenizer
    from ..tokenizer.chat import render_chat_template, template_globals
    names = set(template_globals())
    for fn in (Model.chat_prompt_ids, Tokenizer.encode_chat, Tokenizer.apply_chat_template,
               render_chat_template):
        names.update(p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind is not inspect.Parameter.VAR_KEYWORD)
    return frozenset(names)


def check_template_kwargs(value: Any, param: str = "chat_template_kwargs") -> dict[str, Any]:
    """A request's chat template variables (vLLM's chat_template_kwargs, such as Qwen3's
    {"enable_thinking": false}), checked: an object whose keys are variable names none of
    reserved_template_names(), and whose values are JSON (strings, numbers, booleans, null,
    lists and objects) of bounded size. InvalidParameterError naming the key otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParameterError(f"{param} must be an object of chat template variables, got "
                                    f"{type(value).__name__}", param=param, code="invalid_type")
    reserved = reserved_template_names()
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise InvalidParameterError(f"{param} key {k!r:.40} is not a template variable name",
                                        param=param)
        at = f"{param}.{k}"
        if k in reserved:
            raise InvalidParameterError(
                f"{param} may not set {k!r}: ignis sets it itself (the conversation, the tools, "
                f"the template and its helpers come from the request and the model)", param=at)
        _check_json(v, at, 0)
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        raise InvalidParameterError(f"{param}.enable_thinking must be true or false",
                                    param=f"{param}.enable_thinking", code="invalid_type")
    size = len(json.dumps(value, ensure_ascii=False))
    if size > TEMPLATE_KWARGS_MAX_CHARS:
        raise InvalidParameterError(f"{param} is {size} characters of JSON; at most "
                                    f"{TEMPLATE_KWARGS_MAX_CHARS} are taken", param=param)
    return dict(value)


def _check_json(v: Any, at: str, depth: int) -> None:
    if v is None or type(v) in (str, bool, int):
        return
    if type(v) is float:
        if v != v or v in (float("inf"), float("-inf")):
            raise InvalidParameterError(f"{at} must be a finite number", param=at)
        return
    if type(v) in (list, dict):
        if depth >= TEMPLATE_KWARGS_MAX_DEPTH:
            raise InvalidParameterError(f"{at} is nested more than {TEMPLATE_KWARGS_MAX_DEPTH} "
                                        f"lists or objects deep", param=at)
        if type(v) is dict:
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidParameterError(f"{at} has a key {k!r:.40} that is not a string",
                                                param=at, code="invalid_type")
                _check_json(x, f"{at}.{k}", depth + 1)
        else:
            for i, x in enumerate(v):
                _check_json(x, f"{at}[{i}]", depth + 1)
        return
    raise InvalidParameterError(f"{at} holds a {type(v).__name__}; chat template variables are "
                                f"JSON (string, number, boolean, null, list, object)", param=at,
                                code="invalid_type")


def check_n(n: Any) -> int:
    """A request's `n` (choices): an integer in 1..MAX_CHOICES; None means 1."""
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidParameterError(f"n must be an integer, got {n!r:.40}", param="n",
                                    code="invalid_type")
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidParameterError(f"n must be an integer from 1 to {MAX_CHOICES} (choices per "
                                    f"request), got {n}", param="n")
    return int(n)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed choice `index` of an n > 1 request seeded `seed` is sampled with: seed + index
    (mod 2**64). Choice 0 is then the n=1 answer, and choice i the answer of the same request
    with n=1 and seed + i. Without a seed every choice draws its own entropy."""
    return None if seed is None else (seed + index) % (1 << 64)


def stop_token_ids(generation_config: GenerationConfig, tokenizer: Any | None) -> tuple[int, ...]:
    """The token ids generation ends at: generation_config.json's eos_token_id (config.json's when
    it names none), then the tokenizer's eos token when it is not among them. The one definition
    Model.eos_token_ids and `ignis show` read; config.json's own eos_token_id (model.config) can be
    fewer, as in Qwen2.5-Instruct, whose config.json names <|im_end|> and whose
    generation_config.json adds <|endoftext|>."""
    eos = list(generation_config.eos_token_ids)
    own = tokenizer.eos_token_id if tokenizer is not None else None
    if own is not None and own not in eos:
        eos.append(own)
    return tuple(eos)


class Model:
    """A loaded model: its files, tokenizer and one Engine with `parallel` KV slots, each reused
    across calls that share a prefix. Up to `parallel` generations run at once (their steps
    batched); more wait for a free slot. A thread holding every slot with open streams gets
    ModelBusyError instead of waiting for itself."""

    def __init__(self, files: ModelFiles, *, n_ctx: int | None = None, threads: int | None = None,
                 weight_format: str = "auto", kv_dtype: str = "auto", engine: Any = None,
                 tokenizer: Any = None, parallel: int = 1, speculative: Any = "auto",
                 progress: bool = False):
        from ..runtime.engine import Engine
        from ..tokenizer import load_tokenizer
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise InvalidParameterError(f"parallel must be a positive integer (generations served "
                                        f"at once), got {parallel!r}", param="parallel")
        self.files = files
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(files.path)
        self.engine = engine if engine is not None else Engine(
            files, n_ctx=n_ctx, threads=threads, weight_format=weight_format, kv_dtype=kv_dtype,
            n_seq=parallel)
        n_slots = getattr(self.engine, "n_seq", 1)
        self._scheduler: BatchScheduler | None = None
        if n_slots > 1:
            self._scheduler = BatchScheduler(self.engine)
            self._sessions = [KVSession(self._scheduler.slot(i)) for i in range(n_slots)]
        else:
            self._sessions = [KVSession(self.engine)]
        self._free = set(range(n_slots))
        self._owners: dict[int, int] = {}        # slot -> thread holding it
        self._stale: set[int] = set()            # busy slots reset() could not clear yet
        self._uses = [0] * n_slots               # when each slot was last taken (a counter)
        self._slot_cond = threading.Condition()
        vocab = files.config.vocab_size
        # lm_head rows past the tokenizer's vocabulary (Qwen pads to 151936) are never sampled
        mask = getattr(self.tokenizer, "token_mask", None)
        self._valid = np.array(mask(vocab) if mask is not None else
                               [self.tokenizer.has_token(i) for i in range(vocab)], bool)
        self._eos = stop_token_ids(files.generation_config, self.tokenizer)
        # speculative decoding: what requests that do not say otherwise use, the draft model
        # (one KV slot per slot of this model's), and the counts /health reports
        self.speculative: SpeculativeSpec | None = parse_speculative(speculative)
        self._draft: _Draft | None = None
        self.speculative_stats = SpeculativeStats()
        self._stats_lock = threading.Lock()
        if self.speculative is not None and self.speculative.kind == "draft":
            self._draft = self._load_draft(self.speculative.model, threads=threads,
                                           kv_dtype=kv_dtype, progress=progress)
        # the embedding Engine (output="hidden") is made on the first embed() call, reading this
        # one's weights
        self._embed_options = dict(n_ctx=n_ctx, threads=threads, weight_format=weight_format,
                                   kv_dtype=kv_dtype)
        self._embedder: Any = None
        self._embed_lock = threading.Lock()
        self._constrainer: Constrainer | None = None
        self._constrainer_lock = threading.Lock()

    def _load_draft(self, name: str, *, threads: int | None, kv_dtype: str,
                    progress: bool) -> _Draft:
        """Open the draft model `name` with as many KV slots of this model's n_ctx as this model
        has; SpeculativeError when its vocabulary is not this model's."""
        from ..loader.resolve import open_model
        from ..runtime.engine import Engine
        from ..tokenizer import load_tokenizer
        files = open_model(name, progress=progress)
        try:
            tok = load_tokenizer(files.path)
            differs = same_vocabulary(tok, self.tokenizer)
            if differs is not None:
                raise SpeculativeError(
                    f"draft model {name!r} has another vocabulary than {self.name!r} ({differs}); "
                    f"a draft model must share the target's tokenizer (e.g. a smaller model of the "
                    f"same family)", code="vocabulary_mismatch")
            # its own best weight format ("auto": a GGUF's own blocks), whatever the target runs
            engine = Engine(files, n_ctx=self.n_ctx, threads=threads, kv_dtype=kv_dtype,
                            weight_format="auto", n_seq=len(self._sessions))
        except BaseException:
            files.weights.close()
            raise
        for i, session in enumerate(self._sessions):
            session.draft = KVSession(engine.slot(i) if engine.n_seq > 1 else engine)
        return _Draft(name, files, engine)

    def drafter(self, speculative: Any = _MODEL_DEFAULT, *, n: int = 1, greedy: bool = True) -> Any:
        """How one request drafts: None (no speculation) or a callable KVSession -> drafter.
        `speculative` as ignis.load takes it; not given: the model's own. "auto": prompt lookup
        for a greedy request of one choice, none otherwise. SpeculativeError for an unknown
        drafter, a draft model this model was not loaded with, and n > 1."""
        if speculative is _MODEL_DEFAULT:
            spec = self.speculative if n == 1 else None    # choices run without the default
        else:
            spec = parse_speculative(speculative)
            check_combinable(spec, n=n)
        if spec is not None and spec.kind == "auto":
            return (lambda session: PromptLookup(requested=False)) if greedy and n == 1 else None
        if spec is None:
            return None
        if spec.kind == "draft":
            draft = self._draft
            if draft is None or draft.name != spec.model:
                have = f"draft:{draft.name}" if draft is not None else "no draft model"
                raise SpeculativeError(
                    f"speculative={spec.name!r}: {self.name!r} was loaded with {have}; a draft "
                    f"model is loaded with the model (ignis.load(..., speculative={spec.name!r}), "
                    f"--speculative {spec.name}); per request use 'prompt-lookup', 'off' or the "
                    f"loaded draft", code="draft_not_loaded")
            valid = self._valid
            return lambda session: DraftModel(draft.name, session.draft, draft.lock, valid)
        return lambda session: PromptLookup()

    def _record_speculation(self, stats: SpeculativeStats | None) -> None:
        if stats is not None:
            with self._stats_lock:
                self.speculative_stats.add(stats)

    @property
    def kv_dtype(self) -> str:
        """The KV cache's storage the engine runs ("f16" or "f32": what "auto" chose)."""
        opts = getattr(self.engine, "options", None)
        return opts.kv_dtype if opts is not None else "f32"

    @property
    def weight_format(self) -> str:
        """The weight format the engine runs (what "auto" chose: "gguf", "q8", ...)."""
        opts = getattr(self.engine, "options", None)
        return opts.weight_format if opts is not None else "f32"

    # ---- what ignis show / inspect / Engine read from ModelFiles -------------------------------
    @property
    def config(self) -> ModelConfig:
        return self.files.config

    @property
    def generation_config(self) -> GenerationConfig:
        return self.files.generation_config

    @property
    def path(self) -> Path:
        return self.files.path

    @property
    def name(self) -> str:
        return self.files.name

    @property
    def weights(self):
        return self.files.weights

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def parallel(self) -> int:
        """Generations this model serves at once (its KV slots)."""
        return len(self._sessions)

    @property
    def _session(self) -> KVSession:
        return self._sessions[0]

    def __repr__(self) -> str:
        return f"<ignis.Model {self.name!r} n_ctx={self.n_ctx}>"

    # ---- text <-> ids ----------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special_tokens: bool = True,
                 split_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens,
                                     split_special_tokens=split_special_tokens)

    def detokenize(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list | None = None,
                            add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools,
                                                  add_generation_prompt=add_generation_prompt)

    # ---- generation ----------------------------------------------------------------------------
    def sampling_params(self, **kwargs: Any) -> SamplingParams:
        """Validated parameters of one call: kwargs (None = default) over generation_config.json."""
        if kwargs.get("eos_token_ids") is None:
            kwargs["eos_token_ids"] = self._eos
        return resolve_params(self.generation_config, vocab_size=self.config.vocab_size, **kwargs)

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidParameterError("the prompt is empty", param="prompt")
            return self.tokenize(prompt)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(i) for i in prompt]
        raise InvalidParameterError(f"prompt must be a string or a list of token ids, got "
                                    f"{type(prompt).__name__}", param="prompt", code="invalid_type")

    def chat_prompt_ids(self, messages: list[dict[str, Any]], *, tools: list | None = None,
                        **template_kwargs: Any) -> list[int]:
        """Prompt ids of a conversation: the chat template rendered with the generation prompt.
        `tools` (OpenAI tool objects) are rendered by the template itself; template_kwargs are
        the template's own variables (Qwen3's enable_thinking)."""
        from ..tokenizer import ChatTemplateError, TokenizerInputError
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidParameterError("messages must be a non-empty list of {role, content} dicts",
                                        param="messages")
        if not self.tokenizer.chat_template:     # a base model (Gemma 3 270M): raw text only
            raise InvalidParameterError(
                f"model {self.name!r} has no chat template (its tokenizer defines none: a base "
                f"model); send the text as a completion (/v1/completions, Model.generate, "
                f"`ignis run`) instead of chat messages", param="messages", code="no_chat_template")
        try:
            # only the template's markup becomes control tokens: message text is plain text
            return self.tokenizer.encode_chat(list(messages), tools=tools, add_generation_prompt=True,
                                              **template_kwargs)
        except (ChatTemplateError, TokenizerInputError) as e:
            raise InvalidParameterError(str(e), param="messages") from None

    # ---- tool calls and reasoning (what the chat template teaches the model) -------------------
    @property
    def tool_format(self) -> ToolFormat | None:
        """The tool-call syntax this model's chat template teaches (None: no tools, or a syntax
        ignis cannot read)."""
        return tool_format(self.tokenizer.chat_template)

    @property
    def thinking(self) -> bool:
        """The chat template is a thinking one (writes <think> blocks: Qwen3)."""
        return is_thinking_template(self.tokenizer.chat_template)

    def check_tool_support(self) -> ToolFormat:
        """The tool-call format, or InvalidParameterError (param "tools") when the chat template
        does not render tools or teaches a call syntax ignis cannot read."""
        template = self.tokenizer.chat_template
        fmt = tool_format(template)
        if template and fmt is not None and _renders_tools(template):
            return fmt
        if not template or not _renders_tools(template):
            why = "its chat template does not render tool definitions" if template else \
                "it has no chat template"
        else:
            why = "its chat template teaches a tool-call syntax ignis cannot read"
        raise InvalidParameterError(
            f"model {self.name!r} cannot take tools: {why} (ignis reads Qwen2.5/Qwen3 <tool_call> "
            f"blocks and Llama 3.1/3.2 JSON calls); send the request without tools",
            param="tools", code="unsupported_parameter")

    def tool_constraint(self, request: ToolRequest, *, think: str | None = None) -> TokenConstraint:
        """The grammar of the answer's tool calls: with tool_choice "required" or a named
        function the answer is only calls; with "auto" the text is free until the model begins
        a call, which must then be complete and valid. Either way each call's arguments validate
        against its function's parameters schema. think (think_state()): the answer may hold
        reasoning first, which no grammar touches. The grammar is compiled here: one the engine
        refuses raises InvalidParameterError now."""
        fmt = self.check_tool_support()
        if request.constrained:
            return self.constrainer.compile(GrammarSpec("grammar", fmt.grammar(request, think=think),
                                                        "tools"))
        spec = GrammarSpec("grammar", fmt.grammar(request, after_trigger=True), "tools")
        return TriggeredConstraint(self.constrainer, self.constrainer.compile(spec), fmt.trigger,
                                   at_start=not fmt.open, think=think)

    def think_state(self, prompt_ids: Sequence[int], enable_thinking: Any = None) -> str | None:
        """How the answer to prompt_ids may reason: None (not a thinking template, or
        enable_thinking false), "open" (the prompt opened a think block the answer continues),
        "start" (the answer may begin with one)."""
        if not self.thinking or enable_thinking is False:
            return None
        return "open" if self.opens_thinking(prompt_ids) else "start"

    def chat_constraint(self, request: ToolRequest | None, prompt_ids: Sequence[int], *,
                        enable_thinking: Any = None, other: bool = False) -> TokenConstraint | None:
        """The constraint tools put on a chat answer (the one rule Model.chat and the Client
        follow). tool_choice "required" / named: the calls' grammar, compiled (its refusal is
        the request's error), and InvalidParameterError (param "tool_choice") when `other`
        (response_format, a guided_* field or the caller's own constraint) asks for another
        grammar. "auto": a call the model begins is held to the grammar, unless `other` or
        the grammar cannot be had (the structured extra missing, a schema the engine cannot
        enforce): then what the model wrote is only read, as "auto" promises no more.
        None for no tools and "none"."""
        if request is None or request.choice == "none":
            return None
        self.check_tool_support()
        if request.constrained:
            if other:
                choice = request.choice if request.name is None else f"function {request.name!r}"
                raise InvalidParameterError(
                    f"tool_choice {choice} makes the answer tool calls; it cannot also follow "
                    f"response_format, a guided_* field or another constraint", param="tool_choice")
            return self.tool_constraint(request, think=self.think_state(prompt_ids, enable_thinking))
        if other:
            return None
        try:
            return self.tool_constraint(request, think=self.think_state(prompt_ids, None))
        except StructuredOutputUnavailable:
            return None
        except InvalidParameterError as e:
            if e.code in ("unsupported_schema", "invalid_grammar"):
                return None
            raise

    def opens_thinking(self, prompt_ids: Sequence[int]) -> bool:
        """The prompt's generation prompt opens a think block the answer continues."""
        return opens_in_prompt(self.detokenize(list(prompt_ids[-8:])))

    @property
    def constrainer(self) -> Constrainer:
        """The grammar compiler for this model's vocabulary (constrained decoding)."""
        with self._constrainer_lock:      # one per model: its compiled grammars are shared
            if self._constrainer is None:
                self._constrainer = Constrainer(self.tokenizer, self.config.vocab_size, self._eos)
            return self._constrainer

    def constraint(self, spec: GrammarSpec | None = None, **fields: Any) -> TokenConstraint | None:
        """A fresh constraint for one generation: of `spec`, or of the request fields
        response_format / guided_json / guided_choice / guided_regex / guided_grammar (None when
        they ask for none). InvalidParameterError for a malformed or unsupported grammar, and
        when the `structured` extra is missing."""
        if spec is None:
            spec = constraint_spec(**fields)
        return None if spec is None else self.constrainer.compile(spec)

    def start(self, prompt_ids: Sequence[int], *, response_format: Any = None,
              guided_json: Any = None, guided_choice: Any = None, guided_regex: Any = None,
              guided_grammar: Any = None, constraint: TokenConstraint | None = None,
              speculative: Any = _MODEL_DEFAULT, _choices: int = 1,
              **kwargs: Any) -> Iterator[Chunk]:
        """The generation as Chunks (text + logprobs); `.result` on the returned object at the end.
        Everything is validated before the engine is touched. response_format (OpenAI's) or one
        guided_* field (vLLM's) constrains the answer to a grammar; `constraint`: one made
        already (by constraint(), or a caller's own TokenConstraint). speculative:
        "prompt-lookup", "draft:<the loaded draft model>" or "off" for this call (default: what
        the model was loaded with)."""
        params = self.sampling_params(**kwargs)
        drafter = self.drafter(speculative, n=_choices, greedy=params.greedy)
        if constraint is None:
            constraint = self.constraint(response_format=response_format, guided_json=guided_json,
                                         guided_choice=guided_choice, guided_regex=guided_regex,
                                         guided_grammar=guided_grammar)
        gen = Generation(self._session, self.tokenizer, prompt_ids, params,
                         vocab_size=self.config.vocab_size, valid=self._valid,
                         constraint=constraint, drafter=drafter)
        return _Locked(self, gen)

    def start_choices(self, prompt_ids: Sequence[int], n: Any = 1, *, seed: Any = None,
                      constraint: Any = None, **kwargs: Any) -> "Choices":
        """n answers to one prompt (OpenAI's `n`, 1..MAX_CHOICES), each a Generation of its own.
        They run at once on up to `parallel` KV slots, their steps batched: the prompt is run once,
        on one slot, and its keys and values copied into the others (Engine.copy_slot); the rest
        follow in turn on a slot whose cache holds the prompt, so only its last token is run
        again. Choice i is sampled with choice_seed(seed, i), so choice 0 is the answer of the
        same call with n=1.
        `constraint`: a callable i -> TokenConstraint | None (a constraint holds its state, so
        each choice needs its own); without it each choice compiles kwargs' response_format /
        guided_* field itself. Choice 0 is made (and so the request validated) here; the others,
        which differ only in their seed, when they start, so n samplers' state is not held at
        once."""
        n = check_n(n)

        def make(i: int) -> "_Locked":
            c = constraint(i) if constraint is not None else None
            return self.start(prompt_ids, seed=seed if i == 0 else choice_seed(seed, i),
                              constraint=c, _choices=n, **kwargs)
        return Choices(self, n, make)

    def generate(self, prompt: str | Sequence[int], *, n: int = 1, **kwargs: Any):
        """Complete `prompt` (text, or token ids). Keyword arguments: max_tokens, temperature
        (0 = greedy), top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty,
        logit_bias, seed, stop, logprobs, top_logprobs, ignore_eos; response_format
        ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema":
        {...}}}) or guided_choice / guided_regex / guided_grammar / guided_json: the answer is
        constrained to that language and ends (finish_reason "stop") once it is complete.
        n > 1: a list of n GenerationResults, choice i sampled with choice_seed(seed, i)
        (start_choices).

        max_tokens, when given, must fit after the prompt: prompt + max_tokens > n_ctx raises
        ContextLengthExceeded (a ValueError) before anything runs, as the OpenAI API answers
        context_length_exceeded. Without it the answer runs until an end-of-sequence token, a stop
        string, generation_config.json's max_new_tokens or the end of the context."""
        if check_n(n) > 1:
            if kwargs.get("constraint") is not None:    # start_choices' is a callable per choice
                raise InvalidParameterError("a constraint object holds one answer's state; with "
                                            "n > 1 use response_format or a guided_* field",
                                            param="constraint")
            return _results(self.start_choices(self._prompt_ids(prompt), n, **kwargs))
        run = self.start(self._prompt_ids(prompt), **kwargs)
        for _ in run:
            pass
        return run.result

    def stream(self, prompt: str | Sequence[int], **kwargs: Any) -> "TextStream":
        """Like generate(), as an iterator of text pieces (whole characters; never part of a stop
        string). The pieces join to generate()'s text for the same arguments and seed."""
        run = self.start(self._prompt_ids(prompt), **kwargs)
        return _texts(run)

    def chat(self, messages: list[dict[str, Any]], *, stream: bool = False, tools: list | None = None,
             tool_choice: Any = None, parallel_tool_calls: bool | None = None,
             enable_thinking: bool | None = None, chat_template_kwargs: dict | None = None,
             n: int = 1, **kwargs: Any):
        """Answer a conversation (chat template applied). stream=True: an iterator of text pieces.

        tools (OpenAI tool objects) are rendered by the template; tool_choice "required" or
        {"type": "function", "function": {"name": ...}} constrains the answer to calls whose
        arguments validate against the functions' schemas ("none" leaves the tools out of the
        prompt). The text is the model's own; ignis.generate.tools.parse_tool_calls(text,
        model.tool_format) reads its calls. enable_thinking (Qwen3) and chat_template_kwargs are
        the template's variables. n > 1: n answers (start_choices), a list of GenerationResults,
        or with stream=True an iterator of (choice index, text piece) pairs."""
        n = check_n(n)
        template_kwargs = check_template_kwargs(chat_template_kwargs)
        if enable_thinking is not None:
            template_kwargs["enable_thinking"] = enable_thinking
        request = check_tools(tools, tool_choice, parallel_tool_calls)
        rendered = request.tools if request is not None and request.choice != "none" else None
        if rendered is not None:
            self.check_tool_support()
        prompt = self.chat_prompt_ids(messages, tools=rendered, **template_kwargs)
        own = kwargs.pop("constraint", None)
        other = own is not None or constraint_spec(
            response_format=kwargs.get("response_format"),
            **{k: kwargs.get(k) for k in GUIDED}) is not None
        tools_constraint = self.chat_constraint(
            request, prompt, enable_thinking=template_kwargs.get("enable_thinking"), other=other)
        if n > 1:
            if own is not None:
                raise InvalidParameterError("a constraint object holds one answer's state; with "
                                            "n > 1 use response_format or a guided_* field",
                                            param="constraint")

            def each(i: int) -> TokenConstraint | None:   # choice 0 takes the one compiled above
                if tools_constraint is None or i == 0:
                    return tools_constraint
                return self.chat_constraint(request, prompt, other=False,
                                            enable_thinking=template_kwargs.get("enable_thinking"))
            choices = self.start_choices(prompt, n, constraint=each, **kwargs)
            return _indexed_texts(choices) if stream else _results(choices)
        kwargs["constraint"] = tools_constraint if tools_constraint is not None else own
        run = self.start(prompt, **kwargs)
        if stream:
            return _texts(run)
        for _ in run:
            pass
        return run.result

    # ---- embeddings ----------------------------------------------------------------------------
    def embedding_inputs(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                         ) -> list[list[int]]:
        """Token ids of each input, checked: a string, a list of strings, a list of token ids (one
        input) or a list of such lists. Strings are tokenized as tokenize() does. Raises
        InvalidParameterError (param "input") for empty inputs, non-integer or out-of-vocabulary
        ids, and inputs longer than the context."""
        def is_id(t: Any) -> bool:
            return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))

        if isinstance(inputs, str):
            items: list[Any] = [inputs]
        elif isinstance(inputs, (list, tuple)) and inputs and all(is_id(t) for t in inputs):
            items = [list(inputs)]
        elif isinstance(inputs, (list, tuple)) and inputs:
            items = list(inputs)
        else:
            raise InvalidParameterError(
                f"input must be a non-empty string, list of strings, list of token ids or list of "
                f"token id lists, got {inputs!r:.80}", param="input", code="invalid_type")
        if len(items) > EMBED_MAX_INPUTS:
            raise InvalidParameterError(
                f"input has {len(items)} items but one request embeds at most {EMBED_MAX_INPUTS} "
                f"(as the OpenAI API); split them over several requests", param="input")
        vocab, n_ctx = self.config.vocab_size, self.n_ctx
        # bounds the work of one call: tokenizing stops as soon as the inputs exceed it
        max_total = EMBED_MAX_CONTEXTS * n_ctx
        out, total = [], 0
        for i, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise InvalidParameterError(f"input[{i}] is an empty string; every input needs "
                                                f"at least one token", param="input")
                ids = self.tokenize(item)
            elif isinstance(item, (list, tuple, np.ndarray)) and len(item) and all(is_id(t) for t in item):
                ids = [int(t) for t in item]
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise InvalidParameterError(f"input[{i}] has token id {bad[0]}, outside the "
                                                f"vocabulary 0..{vocab - 1}", param="input")
            else:
                raise InvalidParameterError(
                    f"input[{i}] must be a non-empty string or a non-empty list of integer token ids "
                    f"(all inputs of one kind), got {item!r:.80}", param="input", code="invalid_type")
            if len(ids) > n_ctx:
                raise InvalidParameterError(
                    f"input[{i}] has {len(ids)} tokens but the context holds {n_ctx}; shorten it or "
                    f"load the model with a larger n_ctx (ignis.load(..., n_ctx=N))", param="input",
                    code="context_length_exceeded")
            total += len(ids)
            if total > max_total:
                raise InvalidParameterError(
                    f"the inputs up to input[{i}] hold {total} tokens but one request embeds at most "
                    f"{max_total} ({EMBED_MAX_CONTEXTS} times the context of {n_ctx}); split them "
                    f"over several requests", param="input")
            out.append(ids)
        return out

    def embed(self, texts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], *,
              pooling: str = "mean") -> np.ndarray:
        """One unit-length (L2-normalised) float32 vector per input: [n_inputs, dim].

        The vector pools the final hidden states (after the model's last RMSNorm, as transformers'
        `last_hidden_state`) of the input's tokens: pooling="mean" (default) averages every token,
        "last" takes the last token's. Each input runs alone from an empty KV cache (no chat
        template, no added tokens beyond what tokenize() adds). `texts` as in embedding_inputs()."""
        if pooling not in POOLINGS:
            raise InvalidParameterError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                                        f"{pooling!r}", param="pooling")
        return self.embed_ids(self.embedding_inputs(texts), pooling=pooling)

    def embed_ids(self, inputs: Sequence[Sequence[int]], *, pooling: str = "mean") -> np.ndarray:
        """embed() for inputs already checked by embedding_inputs(). Inside cancel_when(event)
        (a server whose client hung up) it stops with GenerationCancelled before the next input
        once the event is set. Calls from several threads take turns input by input, so one long
        call does not hold up the others until it ends."""
        if pooling not in POOLINGS:
            raise InvalidParameterError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                                        f"{pooling!r}", param="pooling")
        out = np.zeros((len(inputs), self.config.dim), np.float32)
        for i, ids in enumerate(inputs):
            raise_if_cancelled()
            with self._embed_lock:
                eng = self._embedding_engine()
                eng.reset()
                h = eng.hidden_states(np.asarray(ids, np.int32)).astype(np.float64)
            v = h.mean(axis=0) if pooling == "mean" else h[-1]
            norm = np.linalg.norm(v)
            out[i] = v / norm if norm > 0 else v
        return out

    def _embedding_engine(self) -> Any:
        if self._embedder is None:
            from ..runtime.engine import Engine
            opts = dict(self._embed_options)
            eng_opts = getattr(self.engine, "options", None)
            if eng_opts is not None:       # an Engine handed in: embed with its settings
                opts.update(n_ctx=eng_opts.n_ctx, threads=eng_opts.threads,
                            weight_format=eng_opts.weight_format, kv_dtype=eng_opts.kv_dtype)
            opts["n_ctx"] = self.n_ctx
            # the generation engine's weights, read in place: no second load or conversion
            share = (self.engine if isinstance(self.engine, Engine) and self.engine.reads(self.files)
                     else None)
            self._embedder = Engine(self.files, output="hidden", share_weights=share, **opts)
        return self._embedder

    def reset(self) -> None:
        """Forget the cached prefixes (the next call recomputes its whole prompt). A slot in use
        is cleared when its generation ends."""
        with self._slot_cond:
            for seq, session in enumerate(self._sessions):
                if seq in self._free:
                    session.reset()
                else:
                    self._stale.add(seq)

    @property
    def cached_tokens(self) -> list[int]:
        """The ids whose keys and values the most recently used KV slot holds."""
        seq = max(range(len(self._sessions)), key=lambda s: self._uses[s])
        return list(self._sessions[seq].cached)

    def close(self) -> None:
        """Stop the batching thread (parallel > 1); the model is not usable for generation after."""
        if self._scheduler is not None:
            self._scheduler.close()

    def _share_prompt(self, prompt: Sequence[int], k: int) -> None:
        """Put all but the last token of `prompt` in up to k free KV slots, run once: on the slot
        holding the longest prefix of it, then copied into the others. The choices that start
        next take these slots (_slot prefers the longest cached prefix) and run only the last
        token. Slots taken meanwhile are left out; with fewer than 2 free there is nothing to
        share. Each slot's prefill then reports as reused what it held before, not the copy."""
        n = len(prompt) - 1
        if self._scheduler is None or k < 2 or n < 1:
            return
        me = threading.get_ident()
        with self._slot_cond:
            held = {s: _common_prefix(self._sessions[s].cached, prompt) for s in self._free}
            seqs = sorted(held, key=lambda s: (held[s], -self._uses[s]), reverse=True)[:k]
            if len(seqs) < 2:
                return
            for s in seqs:
                self._free.discard(s)
                self._owners[s] = me
        try:
            src = self._sessions[seqs[0]]
            src.prefill(prompt[:n])           # runs what the slot does not hold (at least 1)
            for s in seqs[1:]:
                self.engine.copy_slot(s, seqs[0], n)
                self._sessions[s].cached = list(prompt[:n])
            for s in seqs:
                self._sessions[s].held_before = held[s]
        finally:
            with self._slot_cond:
                for s in seqs:
                    if s in self._stale:
                        self._stale.discard(s)
                        self._sessions[s].reset()
                    del self._owners[s]
                    self._free.add(s)
                self._slot_cond.notify_all()

    @contextmanager
    def _slot(self, prompt: Sequence[int]):
        """A free KV slot for a generation of `prompt`, held while the block runs: the one whose
        cache shares the longest prefix with it (the least recently used among equals)."""
        me = threading.get_ident()
        with self._slot_cond:
            cancel = current_cancel()
            while not self._free:
                if me in self._owners.values():
                    raise ModelBusyError(
                        f"this thread has an unfinished stream on {self.name!r} and every one of "
                        f"its {self.parallel} slot(s) is taken; read a stream to the end or close() "
                        f"it before starting another")
                # a cancellable wait (a choice of an n > 1 request whose client left) looks again
                # now and then; the others wait to be woken
                self._slot_cond.wait(0.05 if cancel is not None else None)
                raise_if_cancelled()
            seq = max(self._free, key=lambda s: (_common_prefix(self._sessions[s].cached, prompt),
                                                 -self._uses[s]))
            self._free.discard(seq)
            self._owners[seq] = me
            self._uses[seq] = max(self._uses) + 1
        if self._scheduler is not None:
            self._scheduler.activate(seq)
        try:
            yield self._sessions[seq]
        finally:
            if self._scheduler is not None:
                self._scheduler.deactivate(seq)
            with self._slot_cond:
                if seq in self._stale:
                    self._stale.discard(seq)
                    self._sessions[seq].reset()
                del self._owners[seq]
                self._free.add(seq)
                self._slot_cond.notify()


@lru_cache(maxsize=16)
def _renders_tools(template: str) -> bool:
    """Whether the template shows tool definitions: a probe function's name appears in the
    prompt rendered with it (a template that ignores `tools` would drop them silently)."""
    from ..tokenizer.chat import render_chat_template
    from ..tokenizer.errors import ChatTemplateError
    probe = "ignis_probe_function_7f3a"
    tools = [{"type": "function", "function": {"name": probe, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = render_chat_template(template, [{"role": "user", "content": "hi"}], tools=tools,
                                    add_generation_prompt=True)
    except ChatTemplateError:
        return False
    return probe in text


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class TextStream:
    """What stream() returns: an iterator of text pieces; close() stops generating and frees the
    model at once; `result` (a GenerationResult) is set when the stream is exhausted."""

    def __init__(self, run: "_Locked"):
        self._run = run
        self._it = iter(run)

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        while True:
            chunk = next(self._it)
            if chunk.text:
                return chunk.text

    @property
    def result(self) -> GenerationResult | None:
        return self._run.result

    def close(self) -> None:
        self._run.close()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _texts(run: "_Locked") -> TextStream:
    return TextStream(run)


class _Locked:
    """A Generation iterated while holding one of the model's KV slots (closing it releases the
    slot)."""

    def __init__(self, model: Model, gen: Generation):
        self._model = model
        self._gen = gen
        self._it: Iterator[Chunk] | None = None

    @property
    def result(self) -> GenerationResult | None:
        return self._gen.result

    @property
    def prompt(self) -> list[int]:
        return list(self._gen.prompt)

    @property
    def prompt_tokens(self) -> int:
        return len(self._gen.prompt)

    def __iter__(self) -> Iterator[Chunk]:
        if self._it is None:
            self._it = self._run()
        return self._it

    def _run(self) -> Iterator[Chunk]:
        with self._model._slot(self._gen.prompt) as session:
            self._gen.session = session
            yield from self._gen
        if self._gen.result is not None:
            self._model._record_speculation(self._gen.result.speculative)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()


class Choices:
    """What Model.start_choices returns: iterate it for (choice index, Chunk) pairs in the order
    the choices make them, and (index, None) once that choice has ended; `results[i]` is then
    choice i's GenerationResult. Up to `parallel` choices run at once, each on a thread of its
    own (a batched slot's forward waits for the shared step); inside cancel_when they stop when
    its event is set. close() stops every choice and frees their slots."""

    def __init__(self, model: Model, n: int, make: Any):
        self._model = model
        self._make = make
        self._runs: list[_Locked | None] = [make(0)] + [None] * (n - 1)
        self.results: list[GenerationResult | None] = [None] * n
        self._workers = min(n, model.parallel)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._it: Iterator[tuple[int, Chunk | None]] | None = None

    def __len__(self) -> int:
        return len(self._runs)

    def _run(self, i: int) -> Iterator[tuple[int, Chunk | None]]:
        with self._lock:
            run = self._runs[i]
            if run is None:
                run = self._runs[i] = self._make(i)
        for c in run:
            yield i, c
        self.results[i] = run.result
        with self._lock:
            self._runs[i] = None       # its sampler's state is no longer needed
        yield i, None

    def __iter__(self) -> Iterator[tuple[int, Chunk | None]]:
        if self._it is None:
            self._it = self._in_turn() if self._workers == 1 else self._at_once()
        return self._it

    def _in_turn(self) -> Iterator[tuple[int, Chunk | None]]:
        try:
            for i in range(len(self._runs)):
                yield from self._run(i)
        finally:
            self._close_runs()

    def _at_once(self) -> Iterator[tuple[int, Chunk | None]]:
        parent = current_cancel()
        first = self._runs[0]
        if first is not None:                # the prompt once, copied into the workers' slots
            try:
                self._model._share_prompt(first.prompt, self._workers)
            except BaseException:
                self._close_runs()
                raise
        out: queue.SimpleQueue = queue.SimpleQueue()
        order = iter(range(len(self._runs)))

        def work() -> None:
            with cancel_when(self._stop):
                while not self._stop.is_set():
                    with self._lock:
                        i = next(order, None)
                    if i is None:
                        return
                    try:
                        for item in self._run(i):
                            out.put(item)
                    except BaseException as e:      # noqa: BLE001 - raised on the reader's thread
                        out.put((i, e))
                        return

        threads = [threading.Thread(target=work, name=f"ignis-choice-{k}", daemon=True)
                   for k in range(self._workers)]
        for t in threads:
            t.start()
        left = len(self._runs)
        try:
            while left:
                # the parent's event is looked at on every item, not only when the queue is
                # quiet: choices that keep making tokens would otherwise outlive a gone client
                if parent is not None and parent.is_set():
                    raise GenerationCancelled("the generation was cancelled (its client is gone)")
                try:
                    i, item = out.get(timeout=0.05)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
                left -= item is None
                yield i, item
        finally:
            self._stop.set()
            for t in threads:
                t.join()
            self._close_runs()

    def _close_runs(self) -> None:
        with self._lock:
            runs = [r for r in self._runs if r is not None]
        for run in runs:
            run.close()

    def close(self) -> None:
        self._stop.set()
        if self._it is not None:
            self._it.close()       # type: ignore[attr-defined]
        else:
            self._close_runs()


def _results(choices: Choices) -> list[GenerationResult]:
    for _ in choices:
        pass
    return [r for r in choices.results if r is not None]


def _indexed_texts(choices: Choices) -> Iterator[tuple[int, str]]:
    """Model.chat(stream=True, n > 1): (choice index, text piece) pairs."""
    try:
        for i, c in choices:
            if c is not None and c.text:
                yield i, c.text
    finally:
        choices.close()
