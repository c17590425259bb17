"""tokenizer_files_from_gguf: tokenizer.json / tokenizer_config.json rebuilt from GGUF metadata.

Checked on small GGUFs written with the `gguf` package (every field, every refusal), on the real
registry GGUFs when present, and against transformers' own GGUF tokenizer conversion (a reference
nobody here wrote) with its documented losses applied.
"""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import gguf
import pytest
import tokenizers

from ignis.tokenizer import GGUFTokenizerError, load_tokenizer, tokenizer_files_from_gguf
from ignis.tokenizer.bytelevel import BYTE_TO_CHAR
from ignis.tokenizer.gguf_vocab import QWEN2_SPLIT_PATTERN

from real_models import require_model_packages
from test_tokenizer_support import (_REGISTRY_NAME, DATA, FAMILIES, committed_files, find_gguf,
                                    gguf_files_at, read_gz_json)

MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "1 2"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokens() -> tuple[list[str], list[int]]:
    tokens = list(BYTE_TO_CHAR)
    for m in MERGES:
        a, b = m.split(" ")
        tokens.append(a + b)
    types = [1] * len(tokens)
    for s in SPECIAL:
        tokens.append(s)
        types.append(3)                # control
    tokens.append("<think>")
    types.append(4)                    # user-defined
    tokens.append(f"[PAD{len(tokens)}]")
    types.append(5)                    # unused padding row
    return tokens, types


def write_tiny_gguf(path: Path, *, pre: str = "qwen2", model: str = "gpt2", merges=None,
                    tokens=None, types=None, add_bos: bool | None = None, bos: int | None = None,
                    template: str | None = "{{ messages[0]['content'] }}") -> Path:
    t, ty = tiny_tokens()
    tokens = t if tokens is None else tokens
    types = ty if types is None else types
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(4096)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES if merges is None else merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>") if bos is None else bos)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def files_of(path: Path) -> dict[str, dict]:
    return tokenizer_files_from_gguf(gguf.GGUFReader(str(path)))


# --- synthetic GGUFs ------------------------------------------------------------------------------

def test_tiny_gguf_rebuilds_a_tokenizer_that_tokenizers_and_ignis_agree_on(tmp_path):
    files = files_of(write_tiny_gguf(tmp_path / "t.gguf"))
    tj, cfg = files["tokenizer.json"], files["tokenizer_config.json"]
    assert tj["normalizer"] == {"type": "NFC"}
    assert tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_SPLIT_PATTERN
    tokens, _ = tiny_tokens()
    assert f"[PAD{len(tokens) - 1}]" not in tj["model"]["vocab"]      # unused rows are dropped
    added = {t["content"]: t for t in tj["added_tokens"]}
    assert [added[s]["special"] for s in SPECIAL] == [True, True, True]
    assert added["<think>"]["special"] is False
    assert cfg["bos_token"] == "<|endoftext|>" and cfg["eos_token"] == "<|im_end|>"
    assert cfg["model_max_length"] == 4096
    assert cfg["chat_template"] == "{{ messages[0]['content'] }}"
    assert cfg["additional_special_tokens"] == SPECIAL

    ref = tokenizers.Tokenizer.from_str(json.dumps(tj))
    tok = load_tokenizer(files)
    for text in ["hello world", "hello<|im_start|>world<think> 12", "ellohe\u0301"]:
        assert tok.encode(text) == ref.encode(text).ids, text
    assert tok.encode("hello world") == [tokens.index("hello"), tokens.index("Ġworld")]


def test_add_bos_token_becomes_a_post_processor_tokenizers_honours(tmp_path):
    files = files_of(write_tiny_gguf(tmp_path / "t.gguf", add_bos=True))
    ref = tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))
    tok = load_tokenizer(files)
    bos = tok.token_to_id("<|endoftext|>")
    assert tok.encode("hello") == ref.encode("hello").ids == [bos, tok.token_to_id("hello")]
    assert tok.encode("hello", add_special_tokens=False) == [tok.token_to_id("hello")]
    assert files["tokenizer_config.json"]["add_bos_token"] is True


@pytest.mark.parametrize("kw, match", [
    ({"pre": "no-such-pre"}, "pre-tokenizer 'no-such-pre' is not supported"),
    ({"model": "t5"}, "tokenizer model 't5' is not supported"),
    ({"model": "llama"}, "tokenizer.ggml.scores"),
    ({"merges": ["h e", "x zz"]}, "merge 1"),
    ({"merges": ["he"]}, "merge 0"),
    ({"bos": 10_000}, "bos_token_id"),
])
def test_bad_metadata_is_a_typed_error(tmp_path, kw, match):
    with pytest.raises(GGUFTokenizerError, match=match):
        files_of(write_tiny_gguf(tmp_path / "t.gguf", **kw))


def test_token_outside_the_byte_alphabet_is_refused(tmp_path):
    tokens, types = tiny_tokens()
    tokens[260] = "a b"   # a normal token with a raw space cannot be byte-level BPE
    with pytest.raises(GGUFTokenizerError, match="byte-level alphabet"):
        files_of(write_tiny_gguf(tmp_path / "t.gguf", tokens=tokens, types=types, merges=["h e"]))


def test_missing_token_list_is_a_typed_error(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFTokenizerError, match="tokenizer.ggml.tokens"):
        files_of(tmp_path / "t.gguf")


def test_gguf_tokenizer_error_is_also_a_gguf_error(tmp_path):
    from ignis.errors import GGUFError
    with pytest.raises(GGUFError):
        files_of(write_tiny_gguf(tmp_path / "t.gguf", pre="no-such-pre"))


# --- the registry tokenizers ----------------------------------------------------------------------

@pytest.fixture
def family_gguf(request: pytest.FixtureRequest, family: str) -> Path:
    """The registry GGUF of `family`. A multi-part model that is installed but not yet assembled
    is pulled (the session's default_model_dir). Skips when the model's packages are missing,
    fails instead under IGNIS_REQUIRE_MODELS=1 (CI)."""
    from ignis.loader import registry
    path = find_gguf(family)
    if path is None:
        entry = registry.get_entry(_REGISTRY_NAME[family])
        require_model_packages(entry)                 # skip / fail when not installed
        if entry.name != registry.DEFAULT_MODEL:
            pytest.fail(f"{entry.name} is installed but its GGUF was not found")
        model_dir = request.getfixturevalue("default_model_dir")
        path = model_dir.parent.parent / "gguf" / f"{entry.name}.gguf"
    return path


@pytest.mark.model
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_committed_tokenizer_files_equal_a_fresh_conversion(family, family_gguf):
    assert gguf_files_at(family_gguf) == committed_files(family)


def test_qwen_files_have_the_original_qwen2_layout():
    files = committed_files("qwen2.5")
    tj, cfg = files["tokenizer.json"], files["tokenizer_config.json"]
    assert tj["normalizer"] == {"type": "NFC"}
    assert tj["pre_tokenizer"]["pretokenizers"][1] == {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    assert len(tj["model"]["vocab"]) == 151665          # 151643 BPE tokens + 22 added
    assert len(tj["model"]["merges"]) == 151387
    added = {t["content"]: t for t in tj["added_tokens"]}
    assert len(added) == 22 and added["<|im_end|>"]["id"] == 151645
    assert added["<tool_call>"]["special"] is False and added["<|fim_pad|>"]["special"] is True
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert cfg["add_bos_token"] is False and cfg["tokenizer_class"] == "Qwen2Tokenizer"
    assert "<|im_start|>" in cfg["chat_template"]


def test_smollm_files_have_the_original_smollm2_layout():
    files = committed_files("smollm2")
    tj, cfg = files["tokenizer.json"], files["tokenizer_config.json"]
    assert tj["normalizer"] is None
    assert tj["pre_tokenizer"]["pretokenizers"] == [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]
    assert len(tj["model"]["vocab"]) == 49152
    assert [t["content"] for t in tj["added_tokens"]][:3] == SPECIAL
    assert cfg["bos_token"] == "<|im_start|>" and cfg["eos_token"] == "<|im_end|>"


def _transformers_tokenizer(path: Path):
    """transformers' GGUF tokenizer conversion. Its metadata reader needs torch, so the metadata is
    read here with `gguf` and renamed with transformers' own GGUF_TOKENIZER_MAPPING."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    r = gguf.GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items()
          if k.startswith("tokenizer.") or k == "general.architecture"}
    td = {name: md[f"tokenizer.{key}"] for key, name in mapping.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
          if f"tokenizer.{key}" in md}
    tok, _ = mapping.convert_gguf_tokenizer(md["general.architecture"], td)
    return tok


# transformers' conversion is lossy in two known ways against the original tokenizer.json:
# Qwen2 loses the NFC normalizer, SmolLM2 loses Digits(individual_digits). Apply the same losses
# to ours and the ids must then be equal on the whole corpus.
def _with_transformers_losses(family: str, tj: dict) -> dict:
    tj = json.loads(json.dumps(tj))
    if family == "qwen2.5":
        tj["normalizer"] = None
    else:
        tj["pre_tokenizer"] = tj["pre_tokenizer"]["pretokenizers"][1]
    return tj


@pytest.mark.model
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_conversion_matches_transformers_gguf_conversion(family, family_gguf):
    theirs = _transformers_tokenizer(family_gguf)
    mine = gguf_files_at(family_gguf)["tokenizer.json"]
    their_vocab = theirs.get_vocab(with_added_tokens=True)
    # Same ids for every token both have; theirs also keeps llama.cpp's [PAD...] rows.
    assert {t: i for t, i in their_vocab.items() if not t.startswith("[PAD")} == mine["model"]["vocab"]
    their_json = json.loads(theirs.to_str())
    assert [tuple(m) for m in their_json["model"]["merges"]] == [tuple(m) for m in mine["model"]["merges"]]
    assert [(t["id"], t["content"], t["special"]) for t in their_json["added_tokens"]] == \
        [(t["id"], t["content"], t["special"]) for t in mine["added_tokens"]]

    corpus = read_gz_json(DATA / "golden.json.gz")["corpus"]
    lossy = tokenizers.Tokenizer.from_str(json.dumps(_with_transformers_losses(family, mine)))
    exact = tokenizers.Tokenizer.from_str(json.dumps(mine))
    their_ids = [e.ids for e in theirs.encode_batch(corpus, add_special_tokens=False)]
    assert [e.ids for e in lossy.encode_batch(corpus, add_special_tokens=False)] == their_ids
    # Outside the losses they agree with the exact files too.
    exact_ids = [e.ids for e in exact.encode_batch(corpus, add_special_tokens=False)]
    for s, a, b in zip(corpus, exact_ids, their_ids):
        if family == "qwen2.5" and unicodedata.normalize("NFC", s) == s:
            assert a == b, s
        if family == "smollm2" and not any(c.isnumeric() for c in s):
            assert a == b, s
