"""Rebuild a model's Hugging Face tokenizer.json / tokenizer_config.json from GGUF metadata.

A GGUF carries the vocabulary, merges, token types and special ids, but not the normalizer or the
pre-tokenizer: `tokenizer.ggml.pre` only names the family. For each family we write what the original
Hugging Face tokenizer.json of that family contains, so the rebuilt tokenizer is the original one.
"""
from __future__ import annotations

from typing import Any, Callable

from ignis.tokenizer.bytelevel import BYTE_ALPHABET
from ignis.tokenizer.errors import GGUFTokenizerError

# llama.cpp's token types (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# The split pattern of Qwen2's original tokenizer.json (Qwen2 / Qwen2.5 / Qwen2.5-Coder).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def _qwen2() -> dict[str, Any]:
    # As in Qwen/Qwen2.5-*'s tokenizer.json: NFC, then the Qwen2 split, then bytes -> alphabet only.
    return {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_PATTERN},
             "behavior": "Isolated", "invert": False},
            _byte_level(False, False, False),
        ]},
        "post_processor": _byte_level(False, False, False),
        "decoder": _byte_level(False, False, False),
        "tokenizer_class": "Qwen2Tokenizer",
    }


def _starcoder() -> dict[str, Any]:
    # As in HuggingFaceTB/SmolLM2-*'s (and bigcode/starcoder's) tokenizer.json: no normalizer,
    # every digit on its own, then the GPT-2 split inside ByteLevel.
    return {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            _byte_level(False, True, True),
        ]},
        "post_processor": _byte_level(False, False, True),
        "decoder": _byte_level(False, True, True),
        "tokenizer_class": "GPT2Tokenizer",
    }


def _gpt2() -> dict[str, Any]:
    # As in openai-community/gpt2's tokenizer.json.
    return {
        "normalizer": None,
        "pre_tokenizer": _byte_level(False, True, True),
        "post_processor": _byte_level(True, False, True),
        "decoder": _byte_level(False, True, True),
        "tokenizer_class": "GPT2Tokenizer",
    }


# tokenizer.ggml.pre -> builder. Only families whose original tokenizer.json is known exactly.
PRE_TOKENIZERS: dict[str, Callable[[], dict[str, Any]]] = {
    "qwen2": _qwen2,
    "smollm": _starcoder,
    "starcoder": _starcoder,
    "gpt-2": _gpt2,
}


# GGUF metadata value types (gguf.GGUFValueType), by what each may hold here.
_GGUF_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_GGUF_BOOL, _GGUF_STRING, _GGUF_ARRAY = 7, 8, 9
_GGUF_TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
                    "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64")
_KINDS = {"str": "a string", "int": "an integer", "bool": "a boolean",
          "str_list": "an array of strings", "int_list": "an array of integers"}


def _field(reader: Any, key: str, kind: str, default: Any = ..., *, path: str | None) -> Any:
    """The value of `key`, checked to be of `kind` (see _KINDS) by its GGUF type before it is
    decoded: a corrupt or hand-edited file can give any key any type."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise GGUFTokenizerError(
                f"GGUF metadata has no {key!r}; the file carries no usable tokenizer", path=path)
        return default
    types = [int(t) for t in getattr(field, "types", ())]
    ok = bool(types) and {
        "str": types == [_GGUF_STRING],
        "int": len(types) == 1 and types[0] in _GGUF_INTS,
        "bool": types == [_GGUF_BOOL],
        "str_list": types == [_GGUF_ARRAY, _GGUF_STRING],
        "int_list": len(types) == 2 and types[0] == _GGUF_ARRAY and types[1] in _GGUF_INTS,
    }[kind]
    if not ok:
        names = [_GGUF_TYPE_NAMES[t] if 0 <= t < len(_GGUF_TYPE_NAMES) else str(t) for t in types]
        raise GGUFTokenizerError(f"GGUF metadata {key!r} must be {_KINDS[kind]}, but its GGUF type "
                                 f"is {' of '.join(names) or 'unknown'}", path=path)
    try:
        return field.contents()
    except Exception as exc:  # gguf raises assorted errors on corrupt fields
        raise GGUFTokenizerError(f"GGUF metadata field {key!r} cannot be read: {exc}", path=path) from exc


def _token_id(reader: Any, key: str, n_tokens: int, *, path: str | None) -> int | None:
    value = _field(reader, key, "int", None, path=path)
    if value is None:
        return None
    if not 0 <= value < n_tokens:
        raise GGUFTokenizerError(
            f"GGUF metadata {key!r} = {value!r} is not a token id below the vocabulary size {n_tokens}",
            path=path)
    return value


def tokenizer_files_from_gguf(reader: Any) -> dict[str, dict]:
    """Build {"tokenizer.json": ..., "tokenizer_config.json": ...} from a gguf.GGUFReader's metadata.

    Raises GGUFTokenizerError when the metadata is missing or malformed, or names a tokenizer model or
    pre-tokenizer family ignis cannot reproduce exactly.
    """
    # GGUFReader keeps its file only as the name of its memory map; errors name it when known.
    path = getattr(reader, "path", None) or getattr(getattr(reader, "data", None), "filename", None)
    path = str(path) if path is not None else None
    model = _field(reader, "tokenizer.ggml.model", "str", path=path)
    if model != "gpt2":
        raise GGUFTokenizerError(
            f"GGUF tokenizer model {model!r} is not supported; ignis rebuilds only byte-level BPE "
            f"('gpt2') tokenizers", path=path)
    pre = _field(reader, "tokenizer.ggml.pre", "str", "default", path=path)
    if pre not in PRE_TOKENIZERS:
        raise GGUFTokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}. Pass the "
            f"model's original tokenizer.json instead", path=path)
    family = PRE_TOKENIZERS[pre]()

    tokens = _field(reader, "tokenizer.ggml.tokens", "str_list", path=path)
    merges = _field(reader, "tokenizer.ggml.merges", "str_list", path=path)
    n = len(tokens)
    types = _field(reader, "tokenizer.ggml.token_type", "int_list", [_NORMAL] * n, path=path)
    if len(types) != n:
        raise GGUFTokenizerError(
            f"GGUF has {n} tokens but {len(types)} token types", path=path)

    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for i, (tok, typ) in enumerate(zip(tokens, types)):
        if typ == _UNUSED:
            # Padding rows llama.cpp adds up to the embedding size ("[PAD151665]"); the original
            # tokenizer has no token at these ids.
            continue
        if typ in (_CONTROL, _USER_DEFINED):
            # Stored as plain text, matched whole before pre-tokenization; control ones are special.
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": typ == _CONTROL})
        elif typ not in (_NORMAL, _UNKNOWN, _BYTE):
            raise GGUFTokenizerError(f"GGUF token {i} ({tok!r}) has unknown token type {typ}", path=path)
        elif not set(tok) <= BYTE_ALPHABET:
            raise GGUFTokenizerError(
                f"GGUF token {i} ({tok!r}) is not spelled in the byte-level alphabet, so it is not a "
                f"byte-level BPE vocabulary", path=path)
        if tok in vocab:
            raise GGUFTokenizerError(f"GGUF token {tok!r} appears twice (ids {vocab[tok]} and {i})",
                                     path=path)
        vocab[tok] = i

    merge_pairs: list[list[str]] = []
    for k, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or parts[0] + parts[1] not in vocab or parts[0] not in vocab \
                or parts[1] not in vocab:
            raise GGUFTokenizerError(
                f"GGUF merge {k} ({merge!r}) is not two known tokens whose concatenation is a token",
                path=path)
        merge_pairs.append(parts)

    bos = _token_id(reader, "tokenizer.ggml.bos_token_id", n, path=path)
    eos = _token_id(reader, "tokenizer.ggml.eos_token_id", n, path=path)
    pad = _token_id(reader, "tokenizer.ggml.padding_token_id", n, path=path)
    unk = _token_id(reader, "tokenizer.ggml.unknown_token_id", n, path=path)
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token", "bool", False, path=path)
    add_eos = _field(reader, "tokenizer.ggml.add_eos_token", "bool", False, path=path)
    for name, tid in (("bos", bos), ("eos", eos), ("pad", pad), ("unk", unk)):
        if tid is not None and types[tid] == _UNUSED:
            raise GGUFTokenizerError(f"GGUF {name} token id {tid} points at an unused padding token",
                                     path=path)

    post_processor = family["post_processor"]
    if add_bos or add_eos:
        # The file asks for BOS/EOS around every encoding: say so in tokenizer.json, as
        # transformers does for such tokenizers, so encode(add_special_tokens=True) adds them.
        single: list[dict[str, Any]] = []
        special_tokens: dict[str, Any] = {}
        for flag, tid in ((add_bos, bos), (add_eos, eos)):
            if flag and tid is None:
                raise GGUFTokenizerError("GGUF asks to add a BOS/EOS token but names none", path=path)
        if add_bos:
            single.append({"SpecialToken": {"id": tokens[bos], "type_id": 0}})
            special_tokens[tokens[bos]] = {"id": tokens[bos], "ids": [bos], "tokens": [tokens[bos]]}
        single.append({"Sequence": {"id": "A", "type_id": 0}})
        if add_eos:
            single.append({"SpecialToken": {"id": tokens[eos], "type_id": 0}})
            special_tokens[tokens[eos]] = {"id": tokens[eos], "ids": [eos], "tokens": [tokens[eos]]}
        pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
        post_processor = {"type": "Sequence", "processors": [
            post_processor,
            {"type": "TemplateProcessing", "single": single, "pair": pair,
             "special_tokens": special_tokens},
        ]}

    tokenizer_json: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": family["normalizer"],
        "pre_tokenizer": family["pre_tokenizer"],
        "post_processor": post_processor,
        "decoder": family["decoder"],
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merge_pairs,
        },
    }

    def name(tid: int | None) -> str | None:
        return tokens[tid] if tid is not None else None

    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                             "single_word", "special")}
            for t in added
        },
        "additional_special_tokens": [t["content"] for t in added if t["special"]],
        "bos_token": name(bos),
        "eos_token": name(eos),
        "pad_token": name(pad),
        "unk_token": name(unk),
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "tokenizer_class": family["tokenizer_class"],
    }
    arch = _field(reader, "general.architecture", "str", None, path=path)
    ctx = _field(reader, f"{arch}.context_length", "int", None, path=path) if arch else None
    if isinstance(ctx, int):
        config["model_max_length"] = ctx
    template = _field(reader, "tokenizer.chat_template", "str", None, path=path)
    if template is not None:
        config["chat_template"] = template
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config}
