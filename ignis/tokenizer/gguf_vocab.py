"""Rebuild a model's Hugging Face tokenizer.json / tokenizer_config.json from GGUF metadata.

A GGUF carries the vocabulary, merges, token types and special ids, but not the normalizer or the
pre-tokenizer: `tokenizer.ggml.pre` only names the family. For each byte-level family (`tokenizer.ggml.
model = "gpt2"`) we write what the original Hugging Face tokenizer.json of that family contains, so
the rebuilt tokenizer is the original one.

A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, TinyLlama, Gemma)
carries scores and token types but no merges. It is rebuilt as transformers builds it from the same
file (its GGUF tokenizer conversion, GemmaTokenizer / LlamaTokenizer): merges derived from the
vocabulary, every split of a token into two tokens ranked by the token's score (Gemma: by the
token's position in the file, which its scores do not follow), Gemma's whitespace tokens respelled
with "▁", BPE with byte fallback.
"""
from __future__ import annotations

from typing import Any, Callable

from ignis.tokenizer.bytelevel import BYTE_ALPHABET
from ignis.tokenizer.spm_bpe import SPACE
from ignis.tokenizer.errors import GGUFTokenizerError

# llama.cpp's token types (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# The split pattern of Qwen2's original tokenizer.json (Qwen2 / Qwen2.5 / Qwen2.5-Coder / Qwen3).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The split pattern of Llama 3's original tokenizer.json (GGUF pre "llama-bpe"): Qwen2's, but
# numbers go in runs of up to three digits.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
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


def _llama3() -> dict[str, Any]:
    # As in meta-llama/Llama-3.*'s tokenizer.json: no normalizer, the Llama 3 split, then bytes ->
    # alphabet only.
    return {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT_PATTERN},
             "behavior": "Isolated", "invert": False},
            _byte_level(False, True, False),
        ]},
        "post_processor": _byte_level(True, False, True),
        "decoder": _byte_level(True, True, True),
        "tokenizer_class": "PreTrainedTokenizerFast",
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
    "qwen2": _qwen2,            # also Qwen3's files: same tokenizer, same pre name
    "llama-bpe": _llama3,
    "smollm": _starcoder,
    "starcoder": _starcoder,
    "gpt-2": _gpt2,
}


# GGUF metadata value types (gguf.GGUFValueType), by what each may hold here.
_GGUF_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_GGUF_BOOL, _GGUF_STRING, _GGUF_ARRAY = 7, 8, 9
_GGUF_TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
                    "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64")
_GGUF_FLOATS = frozenset({6, 12})
_KINDS = {"str": "a string", "int": "an integer", "bool": "a boolean",
          "str_list": "an array of strings", "int_list": "an array of integers",
          "float_list": "an array of numbers"}


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
        "float_list": len(types) == 2 and types[0] == _GGUF_ARRAY
        and types[1] in _GGUF_INTS | _GGUF_FLOATS,
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
    if model not in ("gpt2", "llama"):
        raise GGUFTokenizerError(
            f"GGUF tokenizer model {model!r} is not supported; ignis rebuilds byte-level BPE "
            f"('gpt2') and SentencePiece BPE ('llama') tokenizers", path=path)
    arch = _field(reader, "general.architecture", "str", None, path=path)
    tokens = _field(reader, "tokenizer.ggml.tokens", "str_list", path=path)
    n = len(tokens)
    types = _field(reader, "tokenizer.ggml.token_type", "int_list", [_NORMAL] * n, path=path)
    if len(types) != n:
        raise GGUFTokenizerError(
            f"GGUF has {n} tokens but {len(types)} token types", path=path)
    if model == "gpt2":
        family, vocab, added, merge_pairs = _byte_level_vocab(reader, tokens, types, path)
    else:
        family, vocab, added, merge_pairs = _sentencepiece_vocab(reader, arch, tokens, types, path)

    bos = _token_id(reader, "tokenizer.ggml.bos_token_id", n, path=path)
    eos = _token_id(reader, "tokenizer.ggml.eos_token_id", n, path=path)
    pad = _token_id(reader, "tokenizer.ggml.padding_token_id", n, path=path)
    unk = _token_id(reader, "tokenizer.ggml.unknown_token_id", n, path=path)
    # transformers: a SentencePiece vocabulary without the flag adds BOS, as llama.cpp does.
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token", "bool", model == "llama", path=path)
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
        if post_processor is None:
            # transformers' own template (TokenizersBackend.update_post_processor)
            pair = single + [{"SpecialToken": {**item["SpecialToken"], "type_id": 1}}
                             if "SpecialToken" in item else {"Sequence": {"id": "B", "type_id": 1}}
                             for item in single]
            post_processor = {"type": "TemplateProcessing", "single": single, "pair": pair,
                              "special_tokens": special_tokens}
        else:
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
            **family.get("model", {}),
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
    ctx = _field(reader, f"{arch}.context_length", "int", None, path=path) if arch else None
    if isinstance(ctx, int):
        config["model_max_length"] = ctx
    template = _field(reader, "tokenizer.chat_template", "str", None, path=path)
    if template is not None:
        config["chat_template"] = template
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config}


def _byte_level_vocab(reader: Any, tokens: list[str], types: list[int], path: str | None
                      ) -> tuple[dict[str, Any], dict[str, int], list[dict[str, Any]], list[list[str]]]:
    """Family, vocabulary, added tokens and merges of a byte-level BPE ("gpt2") GGUF."""
    pre = _field(reader, "tokenizer.ggml.pre", "str", "default", path=path)
    if pre not in PRE_TOKENIZERS:
        raise GGUFTokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}. Pass the "
            f"model's original tokenizer.json instead", path=path)
    family = PRE_TOKENIZERS[pre]()
    merges = _field(reader, "tokenizer.ggml.merges", "str_list", path=path)

    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for i, (tok, typ) in enumerate(zip(tokens, types)):
        if typ == _UNUSED:
            # Padding rows llama.cpp adds up to the embedding size ("[PAD151665]"); the original
            # tokenizer has no token at these ids.
            continue
        if typ in (_CONTROL, _USER_DEFINED):
            # Stored as plain text, matched whole before pre-tokenization; control ones are special.
            added.append(_added(i, tok, typ == _CONTROL))
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
    return family, vocab, added, merge_pairs


def _added(i: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special}


# general.architecture values whose SentencePiece vocabulary transformers builds as GemmaTokenizer.
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")


def _sentencepiece_vocab(reader: Any, arch: str | None, tokens: list[str], types: list[int],
                         path: str | None
                         ) -> tuple[dict[str, Any], dict[str, int], list[dict[str, Any]], list[list[str]]]:
    """Family, vocabulary, added tokens and merges of a SentencePiece ("llama") GGUF, as
    transformers' GGUF conversion makes them (see the module docstring)."""
    gemma = arch in _GEMMA_ARCHS
    for i, typ in enumerate(types):
        if typ not in (_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE):
            raise GGUFTokenizerError(f"GGUF token {i} ({tokens[i]!r}) has unknown token type {typ}",
                                     path=path)
    if gemma:
        # Gemma files store a token of spaces as spaces; the tokenizer spells it with "▁".
        spelled = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    else:
        spelled = list(tokens)
    vocab = {t: i for i, t in enumerate(spelled)}         # a repeated spelling keeps its last id
    if gemma:
        # Gemma's scores do not follow its merge order; the position in the file does.
        scores: dict[str, float] = {t: -i for i, t in enumerate(spelled)}
    else:
        values = _field(reader, "tokenizer.ggml.scores", "float_list", path=path)
        if len(values) != len(tokens):
            raise GGUFTokenizerError(f"GGUF has {len(tokens)} tokens but {len(values)} scores",
                                     path=path)
        scores = dict(zip(spelled, map(float, values)))
    merge_pairs = derive_merges(vocab, scores)

    added: list[dict[str, Any]] = []
    for i, (tok, typ) in enumerate(zip(tokens, types)):
        # Control tokens are special; user-defined ones (Gemma's "\n\n", "<table>") are matched
        # whole but not special -- those the respelling renamed are plain vocabulary entries.
        if typ == _CONTROL or (typ == _USER_DEFINED and tok in vocab):
            if vocab.get(tok) != i:
                raise GGUFTokenizerError(f"GGUF {('control', 'user-defined')[typ == _USER_DEFINED]} "
                                         f"token {i} ({tok!r}) is spelled like token {vocab.get(tok)}",
                                         path=path)
            added.append(_added(i, tok, typ == _CONTROL))
    decoder: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]
    if gemma:
        family: dict[str, Any] = {
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
            "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                              "behavior": "MergedWithPrevious", "invert": False},
            "tokenizer_class": "GemmaTokenizer",
            "model": {"unk_token": "<unk>" if "<unk>" in vocab else None},
        }
    else:
        # transformers' LlamaTokenizer: the space prefix on the input's first piece, stripped
        # again when decoding (it ignores the file's add_space_prefix).
        family = {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first",
                              "split": False},
            "tokenizer_class": "LlamaTokenizer",
            "model": {"unk_token": None},
        }
        decoder.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    family["decoder"] = {"type": "Sequence", "decoders": decoder}
    family["post_processor"] = None
    family["model"].update(fuse_unk=True, byte_fallback=True)
    return family, vocab, added, merge_pairs


def derive_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[list[str]]:
    """The merges a vocabulary without any implies, best first, as transformers derives them
    (tokenization_utils_base.generate_merges): each token in `scores` order yields every split into
    two vocabulary tokens (left then right id ascending), all ranked by the token's score, high
    first, then the longer left piece, then the longer right piece (ties keep their order)."""
    rows: list[tuple[str, str, float]] = []
    for token, score in scores.items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        if len(local) > 1:
            local.sort(key=lambda r: (vocab[r[0]], vocab[r[1]]))
        rows.extend(local)
    rows.sort(key=lambda r: (r[2], len(r[0]), len(r[1])), reverse=True)
    return [[a, b] for a, b, _ in rows]
