"""ignis.tokenizer against Hugging Face tokenizers: the golden corpus for every registry tokenizer
(with and without special tokens), added-token flags, decode, streaming, and bad input."""
from __future__ import annotations

import json
import random

import pytest
import regex
import tokenizers

from ignis.tokenizer import (StreamDecoder, TokenIdError, Tokenizer, TokenizerFormatError,
                             TokenizerInputError, UnsupportedTokenizerError, load_tokenizer)
from ignis.tokenizer.bpe import bpe_word_ref
from ignis.tokenizer.bytelevel import BYTE_TO_CHAR, alphabet_to_bytes

from test_tokenizer_support import DATA, FAMILIES, ours, read_gz_json, ref_encode, reference

GOLDEN = read_gz_json(DATA / "golden.json.gz")
CORPUS: list[str] = GOLDEN["corpus"]


def test_corpus_is_big_and_varied():
    assert len(CORPUS) >= 2000
    text = "".join(CORPUS)
    for probe in ["我们", "日本語", "한국어", "مرحبا", "नमस्ते", "Привет", "👨‍👩‍👧‍👦", "👍🏽", "e\u0301",
                  "\u3000", "\u00a0", "\r\n", "<|im_start|>", "'LL", "'ll", "def ", "fn main", "SELECT"]:
        assert probe in text, probe
    assert all(any(chr(c) in s for s in CORPUS) for c in range(0x20))
    assert max(map(len, CORPUS)) >= 10000


# --- golden corpus --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_golden_corpus_ids_equal_tokenizers(family):
    tok = ours(family)
    ids = GOLDEN["ids"][family]
    bad = []
    for i, s in enumerate(CORPUS):
        want = ids["special"][i]
        if tok.encode(s) != want:
            bad.append(("special", s))
        want_split = ids["split_special"].get(str(i), want)
        if tok.encode(s, split_special_tokens=True) != want_split:
            bad.append(("split_special", s))
        want_plain = ids["no_add_special"].get(str(i), want)
        if tok.encode(s, add_special_tokens=False) != want_plain:
            bad.append(("no_add_special", s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]!r}"


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_ids_are_still_what_tokenizers_says(family):
    # Guards the committed golden file itself: it must agree with the installed reference.
    ref = reference(family)
    sample = random.Random(7).sample(range(len(CORPUS)), 150)
    for i in sample:
        assert ref_encode(ref, CORPUS[i]) == GOLDEN["ids"][family]["special"][i], CORPUS[i]


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_encode_equals_single_encode(family):
    tok = ours(family)
    texts = CORPUS[:300]
    assert tok.encode_batch(texts) == [GOLDEN["ids"][family]["special"][i] for i in range(300)]


@pytest.mark.parametrize("family", FAMILIES)
def test_pure_python_twin_gives_the_same_ids(family):
    fast, ref_twin = ours(family), ours(family, "ref")
    for s in CORPUS[::7]:
        if len(s) < 3000:
            assert ref_twin.encode(s) == fast.encode(s), s


@pytest.mark.parametrize("family", FAMILIES)
def test_merge_loop_long_words_match_reference_merge(family):
    # Words longer than 48 bytes take the heap path of BPEMerger; compare with the quadratic twin.
    tok = ours(family)
    rng = random.Random(3)
    pieces = [t for t in list(tok.model.vocab)[:5000] if all(c.isalpha() for c in t)]
    for _ in range(40):
        spelled = "".join(rng.choice(pieces) for _ in range(rng.randrange(10, 60)))
        word = alphabet_to_bytes(spelled).decode("utf-8", "replace")
        assert tok.model._merger.encode_word(word) == tok.model.encode_word_ref(word)


@pytest.mark.parametrize("family", FAMILIES)
def test_merger_from_int32_columns_is_the_merger_from_tuples(family):
    # A cached tokenizer hands its merge columns to C as int32 buffers; a fresh one as tuples.
    from array import array
    from ignis._core import BPEMerger
    tok = ours(family)
    t = tok.model.merge_table
    cols = tuple(array("i", c) for c in (t.left, t.right, t.new))
    a = BPEMerger(tok.model.byte_ids, list(zip(t.left, t.right, t.new)))
    b = BPEMerger(tok.model.byte_ids, columns=cols)
    assert a.n_merges == b.n_merges == len(t)
    rng = random.Random(5)
    for s in rng.sample(CORPUS, 200):
        for w in s.split()[:20]:
            assert a.encode_word(w) == b.encode_word(w), w
    # a later duplicate pair overrides the earlier one in both forms
    dup = [(t.left[0], t.right[0], t.new[0]), (t.left[0], t.right[0], t.new[1])]
    x = BPEMerger(tok.model.byte_ids, dup)
    y = BPEMerger(tok.model.byte_ids, columns=tuple(array("i", c) for c in zip(*dup)))
    word = alphabet_to_bytes(tok.model.id_to_token[t.left[0]] + tok.model.id_to_token[t.right[0]])
    assert x.encode_word(word.decode("utf-8", "replace")) == y.encode_word(word.decode("utf-8", "replace"))


def test_merger_refuses_bad_columns():
    from array import array
    from ignis._core import BPEMerger
    ids = list(range(256))
    with pytest.raises(ValueError, match="differ in length"):
        BPEMerger(ids, columns=(array("i", [1, 2]), array("i", [3]), array("i", [4, 5])))
    with pytest.raises(ValueError, match="not both"):
        BPEMerger(ids, [(1, 2, 3)], columns=(array("i", [1]), array("i", [2]), array("i", [3])))
    with pytest.raises(ValueError, match="not both"):
        BPEMerger(ids)
    with pytest.raises(ValueError):        # 64-bit items are not int32 columns
        BPEMerger(ids, columns=(array("q", [1]), array("q", [2]), array("q", [3])))


# --- round trip, decode ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_decode_of_encode_is_the_normalized_text(family):
    tok, ref = ours(family), reference(family)
    missing = {bytes([b]) for b in range(256) if tok.model.byte_ids[b] < 0}
    for i, s in enumerate(CORPUS):
        ids = GOLDEN["ids"][family]["special"][i]
        text = tok.decode(ids)
        assert text == ref.decode(ids, skip_special_tokens=False), s
        if not any(m in s.encode("utf-8", "surrogatepass") for m in missing):
            # (bytes without a token are dropped by tokenizers, so they cannot round-trip)
            assert text == tok.normalize(s), s


@pytest.mark.parametrize("family", FAMILIES)
def test_skip_special_tokens_matches_tokenizers(family):
    tok, ref = ours(family), reference(family)
    for i, s in enumerate(CORPUS):
        if "<" in s:
            ids = GOLDEN["ids"][family]["special"][i]
            assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoding_invalid_utf8_replaces_like_tokenizers(family):
    tok, ref = ours(family), reference(family)
    byte_id = {b: tok.model.byte_ids[b] for b in range(256) if tok.model.byte_ids[b] >= 0}
    rng = random.Random(5)
    seqs = [[0x80], [0xE4, 0xBD], [0xF0, 0x9F, 0x98], [0xC3, 0x28], [0xED, 0xA0, 0x80],
            [0xF4, 0x90, 0x80, 0x80], [0xE0, 0x80, 0xAF]]
    seqs += [[rng.choice(list(byte_id)) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    for seq in seqs:
        ids = [byte_id[b] for b in seq if b in byte_id]
        assert tok.decode(ids) == ref.decode(ids), seq


def test_decode_unknown_id_is_a_typed_error():
    tok = ours("qwen2.5")
    for bad in (-1, 151665, 10**9):   # 151665.. are llama.cpp padding rows, not tokens
        with pytest.raises(TokenIdError):
            tok.decode([1, bad])
    with pytest.raises(TokenIdError):
        tok.decode(["a"])


# --- special tokens ---------------------------------------------------------------------------------

def test_special_token_text_can_be_treated_as_plain_text():
    tok = ours("qwen2.5")
    im_start = tok.token_to_id("<|im_start|>")
    assert tok.encode("<|im_start|>user") == [im_start, tok.token_to_id("user")]
    plain = tok.encode("<|im_start|>user", split_special_tokens=True)
    assert im_start not in plain and tok.decode(plain) == "<|im_start|>user"
    # <tool_call> is an added but not special token: matched whole either way, as in tokenizers.
    assert tok.encode("<tool_call>", split_special_tokens=True) == [tok.token_to_id("<tool_call>")]


def _tiny_json(added: list[dict], **extra) -> dict:
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for k, t in enumerate(added):
        t.setdefault("id", len(vocab) + k)
        for flag in ("single_word", "lstrip", "rstrip", "normalized", "special"):
            t.setdefault(flag, False)
    tj = {"version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": True},
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                    "merges": [list(m) for m in merges]}}
    tj.update(extra)
    return tj


FLAG_TEXTS = ["hello <X> world", "hello<X>world", "  <X>  ", "a<X>", "<X>b", "<X><X> <X>", "x <X>\n\ty",
              "é<X>é", "1<X>2", " <X>", "<X> ", "<x>", "hello <Y> world <Y>x", "w<Y>", "<Y>", "\u00a0<X>\u3000",
              "cafe\u0301<Z>", "café<Z>", "<Z>"]


@pytest.mark.parametrize("flags", [
    {}, {"lstrip": True}, {"rstrip": True}, {"lstrip": True, "rstrip": True}, {"single_word": True},
    {"single_word": True, "lstrip": True}, {"normalized": True}, {"special": True},
    {"special": True, "lstrip": True, "rstrip": True},
])
def test_added_token_flags_match_tokenizers(flags):
    added = [{"content": "<X>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": False, **flags},
             {"content": "<Y>", "special": True, "normalized": False, "rstrip": True},
             {"content": "é<Z>", "special": False, "normalized": True}]
    tj = _tiny_json(added)
    ref = tokenizers.Tokenizer.from_str(json.dumps(tj))
    tok = Tokenizer(tj)
    for text in FLAG_TEXTS:
        for split in (False, True):
            assert tok.encode(text, split_special_tokens=split) == \
                ref_encode(ref, text, split_special_tokens=split), (text, split)


def test_template_post_processor_adds_bos_and_eos_like_tokenizers():
    added = [{"content": "<s>", "special": True, "normalized": False},
             {"content": "</s>", "special": True, "normalized": False}]
    tj = _tiny_json(added)
    ids = {a["content"]: a["id"] for a in added}
    tj["post_processor"] = {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                            "pair": [], "special_tokens": {
                                "<s>": {"id": "<s>", "ids": [ids["<s>"]], "tokens": ["<s>"]},
                                "</s>": {"id": "</s>", "ids": [ids["</s>"]], "tokens": ["</s>"]}}}
    ref = tokenizers.Tokenizer.from_str(json.dumps(tj))
    tok = Tokenizer(tj)
    for text in ["hello", "", "<s>hello"]:
        for add in (True, False):
            assert tok.encode(text, add_special_tokens=add) == \
                ref_encode(ref, text, add_special_tokens=add), (text, add)


@pytest.mark.parametrize("pre", [
    {"type": "Split", "pattern": {"String": "l"}, "behavior": b, "invert": inv}
    for b in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")
    for inv in (False, True)
] + [{"type": "Digits", "individual_digits": False}, {"type": "Digits", "individual_digits": True}])
def test_pre_tokenizer_variants_match_tokenizers(pre):
    tj = _tiny_json([], pre_tokenizer={"type": "Sequence", "pretokenizers": [
        pre, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
              "use_regex": False}]})
    ref = tokenizers.Tokenizer.from_str(json.dumps(tj))
    tok = Tokenizer(tj)
    for text in ["hello world", "llama all", "l", "ll l", "a123b45", "hel lo\nl", ""]:
        assert tok.encode(text) == ref_encode(ref, text), (pre, text)


# --- streaming ----------------------------------------------------------------------------------------

_GRAPHEME = regex.compile(r"\X")


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_pieces_are_whole_graphemes_and_concatenate_to_decode(family):
    tok = ours(family)
    for i, s in enumerate(CORPUS):
        if len(s) > 2000:
            continue
        ids = GOLDEN["ids"][family]["special"][i]
        full = tok.decode(ids)
        bounds = {m.end() for m in _GRAPHEME.finditer(full)} | {0}
        dec = tok.stream_decoder()
        pieces = [dec.push(t) for t in ids] + [dec.finish()]
        assert "".join(pieces) == full, s
        at = 0
        for p in pieces:
            at += len(p)
            assert at in bounds, (s, pieces)
        if "\ufffd" not in full:
            assert all("\ufffd" not in p for p in pieces)


def test_stream_holds_zwj_sequences_and_multibyte_characters_whole():
    tok = ours("qwen2.5")
    text = "ok 👨‍👩‍👧‍👦 and 你好 👍🏽!"
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    pieces = [p for p in (dec.push(t) for t in ids) if p] + [dec.finish()]
    assert "".join(pieces) == text
    assert any("👨‍👩‍👧‍👦" in p for p in pieces) and any("👍🏽" in p for p in pieces)


def test_stream_skip_special_tokens_and_invalid_bytes():
    tok = ours("qwen2.5")
    ids = tok.encode("<|im_start|>hi<|im_end|>") + [tok.model.byte_ids[0xE4], tok.model.byte_ids[0xBD]]
    dec = tok.stream_decoder(skip_special_tokens=True)
    out = "".join(dec.push(t) for t in ids) + dec.finish()
    assert out == tok.decode(ids, skip_special_tokens=True) == "hi\ufffd"
    with pytest.raises(TokenIdError):
        StreamDecoder(tok).push(10**9)


# --- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_empty_string(family):
    assert ours(family).encode("") == ref_encode(reference(family), "") == []
    assert ours(family).decode([]) == ""


@pytest.mark.parametrize("family", FAMILIES)
def test_lone_surrogate_is_a_typed_error(family):
    for s in ["\ud800", "abc\udfff def", "<|im_start|>\ud83d"]:
        with pytest.raises(TokenizerInputError, match="surrogate"):
            ours(family).encode(s)
    with pytest.raises(TokenizerInputError):
        ours(family).encode(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("char", ["a", " ", "7", "😀"])
def test_one_megabyte_of_one_character(family, char):
    text = char * (1_000_000 // len(char.encode()))
    assert ours(family).encode(text) == ref_encode(reference(family), text)


def _valid_json() -> dict:
    return _tiny_json([])


@pytest.mark.parametrize("mutate, error, match", [
    (lambda j: j.pop("model"), TokenizerFormatError, "no 'model'"),
    (lambda j: j["model"].update(type="WordPiece"), UnsupportedTokenizerError, "WordPiece"),
    (lambda j: j["model"]["merges"].append(["h", "zz"]), TokenizerFormatError, "'zz'"),
    (lambda j: j["model"]["merges"].append("h"), TokenizerFormatError, "not a pair"),
    (lambda j: j["model"].pop("vocab"), TokenizerFormatError, "vocab"),
    (lambda j: j.update(normalizer={"type": "Precompiled"}), UnsupportedTokenizerError, "Precompiled"),
    (lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), UnsupportedTokenizerError, "ByteLevel"),
    (lambda j: j.update(decoder={"type": "WordPiece"}), UnsupportedTokenizerError, "decoder"),
    (lambda j: j["model"].update(dropout=0.1), UnsupportedTokenizerError, "dropout"),
    (lambda j: j.update(added_tokens=[{"id": 0, "content": "he"}]), TokenizerFormatError, "vocabulary says"),
    (lambda j: j.update(added_tokens=[{"content": "<s>"}]), TokenizerFormatError, "malformed added token"),
    (lambda j: j.update(added_tokens=[{"id": float("inf"), "content": "<s>"}]), TokenizerFormatError,
     "malformed added token"),
    (lambda j: j.update(added_tokens=[{"id": 2**40, "content": "<s>"}]), TokenizerFormatError,
     "not in 0.."),
    (lambda j: j["model"]["vocab"].update({"zz": 2**62}), TokenizerFormatError, "'zz'"),
    (lambda j: j["model"]["vocab"].update({"zz": 10**23}), TokenizerFormatError, "'zz'"),
])
def test_malformed_tokenizer_json_is_a_typed_error(mutate, error, match):
    j = _valid_json()
    mutate(j)
    with pytest.raises(error, match=match):
        Tokenizer(j)


def test_loading_a_model_dir(tmp_path):
    with pytest.raises(TokenizerFormatError, match="tokenizer.json not found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerFormatError, match="not valid JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(_valid_json()))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "o"}))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hello") == [tok.token_to_id("hello")]
    assert tok.eos_token_id == tok.token_to_id("o")


def test_bpe_word_ref_merges_lowest_rank_leftmost_first():
    ranks = {(1, 1): (0, 2), (2, 1): (1, 3)}
    assert bpe_word_ref([1, 1, 1], ranks) == [3]
    assert bpe_word_ref([1, 1, 1, 1], ranks) == [2, 2]


# --- the tiny test models' tokenizer ----------------------------------------------------------------

def test_tiny_model_tokenizer_fits_the_tiny_models_and_matches_tokenizers(tmp_path):
    import shutil
    import tiny_models
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DATA / f"tiny-{name}", tmp_path / name)
    tok = load_tokenizer(tmp_path)
    assert tok.vocab_size == tiny_models.VOCAB_SIZE
    assert tok.token_to_id("<|endoftext|>") == tiny_models.ENDOFTEXT_ID
    assert tok.token_to_id("<|im_start|>") == tiny_models.IM_START_ID
    assert tok.eos_token_id == tiny_models.IM_END_ID
    ref = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for s in CORPUS[::5]:
        ids = tok.encode(s)
        assert ids == ref.encode(s).ids, s
        assert max(ids, default=0) < tiny_models.VOCAB_SIZE
    prompt = tok.apply_chat_template([{"role": "user", "content": "the cat"}], add_generation_prompt=True)
    assert tok.encode(prompt)[0] == tiny_models.IM_START_ID


@pytest.mark.parametrize("ignore_merges", [False, True])
def test_ignore_merges_matches_tokenizers(ignore_merges):
    tj = _tiny_json([])
    vocab = tj["model"]["vocab"]
    vocab["xyz"] = len(vocab)           # reachable whole only: no merge builds it
    vocab["Ġxyz"] = len(vocab)
    tj["model"]["ignore_merges"] = ignore_merges
    ref = tokenizers.Tokenizer.from_str(json.dumps(tj))
    tok = Tokenizer(tj)
    for text in ["xyz", "hello xyz", "xyzxyz", "he xyz!"]:
        assert tok.encode(text) == ref_encode(ref, text), text
    assert (tok.encode("xyz") == [vocab["xyz"]]) is ignore_merges


@pytest.mark.parametrize("family", FAMILIES)
def test_characters_newer_than_the_references_unicode_split_like_tokenizers(family):
    # Letters and numbers the `regex` package knows but tokenizers' older tables do not (or the
    # other way round) take the exact, spelled-out classes.
    from ignis.tokenizer.pipeline import _divergent_pattern
    divergent = _divergent_pattern()
    chars = [chr(c) for c in range(0x300, 0x32000) if divergent.match(chr(c))]
    assert chars, "expected the installed regex package to know a newer Unicode than tokenizers"
    sample = random.Random(11).sample(chars, min(60, len(chars)))
    tok, ref = ours(family), reference(family)
    for c in sample:
        for text in [c, f"ab{c}cd", f" {c}{c} x", f"1{c}2", f"'s{c}", f"{c}\n{c}", f"é{c}\u0301"]:
            assert tok.encode(text) == ref_encode(ref, text), (hex(ord(c)), text)
