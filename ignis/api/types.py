"""Response objects of ignis.Client, with the OpenAI API's names and nesting.

Plain dataclasses: attribute access as in the official client, `model_dump()` / `model_dump_json()`
give the JSON the OpenAI HTTP API would send (None fields included, as pydantic's model_dump does).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Optional


def _fields(items: list[tuple[str, Any]]) -> dict[str, Any]:
    # parse()'s `parsed` holds a pydantic model: dumped as its JSON data, as the official client does
    return {k: v.model_dump() if k == "parsed" and hasattr(v, "model_dump") else v for k, v in items}


class AttrDict(dict):
    """A JSON object that also reads as attributes (call.function.name), as the official client's
    models do; it is a dict, so it dumps, compares and serializes as the JSON it is."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for k, v in self.items():
            if isinstance(v, dict) and not isinstance(v, AttrDict):
                self[k] = AttrDict(v)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        # an attribute write is a key write: `call.function.arguments += piece` must reach the
        # JSON the object dumps (an instance attribute would shadow the key and never be sent)
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None


class _Dumpable:
    def model_dump(self, *, exclude_none: bool = False) -> dict[str, Any]:
        d = dataclasses.asdict(self, dict_factory=_fields)  # type: ignore[call-overload]
        return _drop_none(d) if exclude_none else d

    def model_dump_json(self, *, indent: int | None = None, exclude_none: bool = False) -> str:
        return json.dumps(self.model_dump(exclude_none=exclude_none), indent=indent,
                          ensure_ascii=False)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


# ---- usage and logprobs ---------------------------------------------------------------------------

@dataclass
class PromptTokensDetails(_Dumpable):
    cached_tokens: int = 0
    audio_tokens: Optional[int] = None


@dataclass
class CompletionUsage(_Dumpable):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None
    completion_tokens_details: Optional[dict] = None


@dataclass
class TopLogprob(_Dumpable):
    token: str
    bytes: Optional[list[int]]
    logprob: float


@dataclass
class ChatCompletionTokenLogprob(_Dumpable):
    token: str
    bytes: Optional[list[int]]
    logprob: float
    top_logprobs: list[TopLogprob]


@dataclass
class ChoiceLogprobs(_Dumpable):
    content: Optional[list[ChatCompletionTokenLogprob]]
    refusal: Optional[list[ChatCompletionTokenLogprob]] = None


# ---- chat completions -------------------------------------------------------------------------------

@dataclass
class ChatCompletionMessage(_Dumpable):
    content: Optional[str]
    role: Literal["assistant"] = "assistant"
    refusal: Optional[str] = None
    annotations: Optional[list] = None
    audio: Optional[dict] = None
    function_call: Optional[dict] = None
    tool_calls: Optional[list] = None       # AttrDicts: {id, type, function: {name, arguments}}
    # a thinking model's <think> part (vLLM's and DeepSeek's field; None for other models)
    reasoning_content: Optional[str] = None


@dataclass
class ParsedChatCompletionMessage(ChatCompletionMessage):
    """The message of chat.completions.parse(): `parsed` is the content read into the
    response_format's pydantic model (None when response_format was a dict)."""
    parsed: Optional[Any] = None


@dataclass
class Choice(_Dumpable):
    finish_reason: str
    index: int
    message: ChatCompletionMessage
    logprobs: Optional[ChoiceLogprobs] = None


@dataclass
class ChatCompletion(_Dumpable):
    id: str
    choices: list[Choice]
    created: int
    model: str
    object: Literal["chat.completion"] = "chat.completion"
    service_tier: Optional[str] = None
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


@dataclass
class ChoiceDelta(_Dumpable):
    content: Optional[str] = None
    function_call: Optional[dict] = None
    refusal: Optional[str] = None
    role: Optional[str] = None
    # AttrDicts: {index, id, type, function: {name, arguments: ""}} when a call begins, then
    # {index, function: {arguments: piece}}, as OpenAI streams them
    tool_calls: Optional[list] = None
    reasoning_content: Optional[str] = None


@dataclass
class ChunkChoice(_Dumpable):
    delta: ChoiceDelta
    index: int
    finish_reason: Optional[str] = None
    logprobs: Optional[ChoiceLogprobs] = None


@dataclass
class ChatCompletionChunk(_Dumpable):
    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    service_tier: Optional[str] = None
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


# ---- text completions -------------------------------------------------------------------------------

@dataclass
class Logprobs(_Dumpable):
    text_offset: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)


@dataclass
class CompletionChoice(_Dumpable):
    finish_reason: str
    index: int
    text: str
    logprobs: Optional[Logprobs] = None


@dataclass
class Completion(_Dumpable):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: Optional[str] = None
    usage: Optional[CompletionUsage] = None


# ---- models -------------------------------------------------------------------------------------------

@dataclass
class ModelInfo(_Dumpable):
    """One entry of client.models.list() (the official client calls this type `Model`)."""
    id: str
    created: int
    owned_by: str = "ignis"
    object: Literal["model"] = "model"


@dataclass
class ModelList(_Dumpable):
    data: list[ModelInfo]
    object: Literal["list"] = "list"

    def __iter__(self) -> Iterator[ModelInfo]:       # the official SyncPage iterates its items
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


# ---- embeddings ---------------------------------------------------------------------------------------

@dataclass
class Embedding(_Dumpable):
    """One input's vector: a list of floats, or (encoding_format="base64") the base64 text of its
    little-endian float32 bytes."""
    embedding: list[float] | str
    index: int
    object: Literal["embedding"] = "embedding"


@dataclass
class EmbeddingUsage(_Dumpable):
    """The official client calls this type `Usage` (openai.types.create_embedding_response)."""
    prompt_tokens: int
    total_tokens: int


@dataclass
class CreateEmbeddingResponse(_Dumpable):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"
