"""SentencePiece-style BPE (characters, byte fallback, "▁") and the Llama 3 split, from tokenizer.json
files made with Hugging Face tokenizers' own API (BpeTrainer on the golden corpus' text) and from
small GGUFs that transformers' GGUF conversion reads too: ids, decodes and streamed text against
tokenizers on the SentencePiece golden corpus (tests/data/tokenizer/corpus_spm.py) and random text.

Layouts: Llama 2's tokenizer.json (normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
decoder Replace/ByteFallback/Fuse/Strip); transformers' LlamaTokenizer (Metaspace, prepend_scheme
"first"); Gemma's (Replace normalizer, Split(" ") pre-tokenizer, no Strip); vocabularies lacking some
or all byte tokens (unknown characters, fuse_unk) and merging a byte token (the pure-Python path).
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import gguf
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings, strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ignis.tokenizer import UnsupportedTokenizerError, load_tokenizer, tokenizer_files_from_gguf
from ignis.tokenizer.decoders import byte_fallback_value
from ignis.tokenizer.gguf_vocab import LLAMA3_SPLIT_PATTERN, PRE_TOKENIZERS, derive_merges
from ignis.tokenizer.spm_bpe import BYTE_TOKENS, bpe_merge_heap

from test_tokenizer_support import DATA

sys.path.insert(0, str(DATA))
from corpus_spm import build_spm_corpus  # noqa: E402  (tests/data/tokenizer/corpus_spm.py)

CORPUS = build_spm_corpus()
SP = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]


# --- tokenizer.json files made with tokenizers' trainer ----------------------------------------

@lru_cache(maxsize=None)
def trained(split_words: bool) -> dict:
    """vocab + merges of a BPE trained on the corpus' text: on "▁"-prefixed words as SentencePiece
    trains (split_words), or on whole lines, so that tokens span several words."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", SP)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(SP, "first", split=split_words)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=SPECIALS, show_progress=False,
                                  limit_alphabet=400)
    tok.train_from_iterator(CORPUS[::2], trainer)
    return json.loads(tok.to_str())["model"]


def spm_json(layout: str, *, bytes_kept: str = "all", split_words: bool = True,
             byte_merge: bool = False) -> dict:
    """A SentencePiece-style tokenizer.json in `layout`: "llama2", "metaspace" or "gemma".
    bytes_kept: which <0xNN> tokens the vocabulary has ("all", "some", "none")."""
    model = trained(split_words)
    vocab = dict(model["vocab"])
    merges = [list(m) for m in model["merges"]]
    kept = {"all": range(256), "some": range(0, 256, 3), "none": range(0)}[bytes_kept]
    for b in kept:
        vocab.setdefault(BYTE_TOKENS[b], len(vocab))
    if byte_merge:          # a merge of a byte token: the compiled path must step aside
        vocab["<0x41>a"] = len(vocab)
        merges.insert(0, ["<0x41>", "a"])
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges],
                                          unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    dec = [decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse()]
    if layout == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
        dec.append(decoders.Strip(" ", 1, 0))
    elif layout == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(SP, "first", split=False)
        dec.append(decoders.Strip(" ", 1, 0))
    else:
        tok.normalizer = normalizers.Replace(" ", SP)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence(dec)
    tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                            for t in SPECIALS])
    tok.add_tokens([tokenizers.AddedToken("<x>", normalized=False),
                    tokenizers.AddedToken("[INST]", normalized=False)])
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    return json.loads(tok.to_str())


VARIANTS = {
    "llama2": {"layout": "llama2"},
    "metaspace": {"layout": "metaspace"},
    "gemma": {"layout": "gemma"},
    "cross-word-tokens": {"layout": "metaspace", "split_words": False},
    "some-bytes": {"layout": "llama2", "bytes_kept": "some"},
    "no-bytes": {"layout": "gemma", "bytes_kept": "none"},
    "byte-merge": {"layout": "llama2", "byte_merge": True},
}


@lru_cache(maxsize=None)
def pair(name: str):
    tj = spm_json(**VARIANTS[name])
    return load_tokenizer({"tokenizer.json": tj}), tokenizers.Tokenizer.from_str(json.dumps(tj))


def ref_ids(ref, text: str, *, add_special_tokens: bool = True, split_special: bool = False):
    ref.encode_special_tokens = split_special
    try:
        return ref.encode(text, add_special_tokens=add_special_tokens).ids
    finally:
        ref.encode_special_tokens = False


def test_corpus_is_big_and_has_what_sentencepiece_risks():
    assert len(CORPUS) >= 2000
    text = "".join(CORPUS)
    for probe in ["<start_of_turn>", "[INST]", "\U00020000", "\x00", SP, "<0x41>", "👨‍👩‍👧‍👦", "\t\t",
                  "Привет", "日本語", "한국어", "مرحبا", "नमस्ते", "שלום", "สวัสดี", "Γειά", "def "]:
        assert probe in text, probe


@pytest.mark.parametrize("name", VARIANTS)
def test_corpus_ids_equal_tokenizers(name):
    tok, ref = pair(name)
    if name in ("some-bytes", "no-bytes", "byte-merge"):
        assert tok.model._merger is None          # the pure-Python path, which these need
    else:
        assert tok.model._merger is not None
    bad = []
    for s in CORPUS:
        if tok.encode(s) != ref_ids(ref, s):
            bad.append(("special", s))
        if tok.encode(s, add_special_tokens=False) != ref_ids(ref, s, add_special_tokens=False):
            bad.append(("no_add_special", s))
        if tok.encode(s, split_special_tokens=True) != ref_ids(ref, s, split_special=True):
            bad.append(("split_special", s))
    assert not bad, f"{len(bad)} of {3 * len(CORPUS)} differ, first: {bad[:3]!r}"


@pytest.mark.parametrize("name", VARIANTS)
def test_corpus_decode_and_stream_equal_tokenizers(name):
    tok, ref = pair(name)
    for s in CORPUS:
        ids = ref_ids(ref, s)
        for skip in (False, True):
            want = ref.decode(ids, skip_special_tokens=skip)
            assert tok.decode(ids, skip_special_tokens=skip) == want, s
            dec = tok.stream_decoder(skip_special_tokens=skip)
            assert "".join(dec.push(i) for i in ids) + dec.finish() == want, s


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_continuation_streams_the_text_past_its_prompts(name):
    """Ids after a prompt decode to decode(prompt + ids) past decode(prompt), as Hugging Face's
    text-generation pipeline and vLLM compute a completion: a Strip decoder's removal of the leading
    space applies to the whole text's start, not to the completion's."""
    tok, ref = pair(name)
    n = 0
    for s in CORPUS[::7]:
        ids = ref_ids(ref, s)
        whole = ref.decode(ids, skip_special_tokens=True)
        for k in range(1, len(ids)):
            head = ref.decode(ids[:k], skip_special_tokens=True)
            if not head or not whole.startswith(head):
                continue            # the prompt ends inside a character, or decodes to nothing
            dec = tok.stream_decoder(skip_special_tokens=True, continuation=True)
            assert dec.push_many(ids[k:]) + dec.finish() == whole[len(head):], (s, k)
            n += 1
    assert n > 100


@pytest.mark.parametrize("name", ["llama2", "cross-word-tokens"])
def test_pure_python_twin_gives_the_same_ids(name):
    tok, _ = pair(name)
    twin = load_tokenizer({"tokenizer.json": spm_json(**VARIANTS[name])}, backend="ref")
    for s in CORPUS[::3]:
        if len(s) < 3000:
            assert twin.encode(s) == tok.encode(s), s


def test_words_are_cut_only_where_no_token_crosses():
    tok, _ = pair("cross-word-tokens")
    crossing = [t for t in tok.model.vocab if SP in t[1:].lstrip(SP)]
    assert crossing, "training on whole lines should make tokens that span words"
    split = tok.model._split
    for t in crossing:
        assert split(t) == [t], t


def test_heap_merge_equals_the_scan():
    tok, _ = pair("llama2")
    ranks = tok.model.ranks
    from ignis.tokenizer.bpe import bpe_word_ref
    for s in CORPUS[::5]:
        ids = tok.model.initial_symbols(SP + s.replace(" ", SP))
        if 1 < len(ids) < 400:
            assert bpe_merge_heap(ids, ranks) == bpe_word_ref(ids, ranks), s


def test_byte_fallback_and_unknown_characters():
    tok, ref = pair("no-bytes")
    unk = tok.token_to_id("<unk>")
    # no byte tokens: every unknown character is <unk>, consecutive ones fused into one
    text = "\U000f0001\U000f0002x\U000f0003"
    assert not set(text) - {"x"} & set(tok.model.vocab)
    assert tok.encode(text, add_special_tokens=False) == \
        ref_ids(ref, text, add_special_tokens=False) == [unk, tok.token_to_id("x"), unk]
    tok, ref = pair("llama2")
    ids = tok.encode("\U00020000", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids] == [SP, "<0xF0>", "<0xA0>", "<0x80>", "<0x80>"]
    assert tok.decode(ids) == "\U00020000" == ref.decode(ids)     # Strip takes the prefix space


@pytest.mark.parametrize("token, value", [("<0x41>", 0x41), ("<0xff>", 0xFF), ("<0x+F>", 0xF),
                                          ("<0xZZ>", None), ("<0x4>", None), ("<0x411>", None),
                                          ("<0x-1>", None), ("<0xé>", None)])
def test_byte_token_spelling_is_read_as_tokenizers_does(token, value):
    assert byte_fallback_value(token) == value


def test_invalid_byte_runs_become_one_replacement_per_byte():
    tok, ref = pair("gemma")
    b = {n: tok.token_to_id(BYTE_TOKENS[n]) for n in (0xE4, 0xBD, 0xA0, 0x41, 0xFF)}
    word = tok.token_to_id(tok.model.id_to_token[max(tok.model.vocab.values()) - 300])
    for ids in ([b[0xE4], b[0xBD]], [b[0xE4], b[0xBD], b[0xA0]], [b[0xE4], word, b[0xBD], b[0xA0]],
                [b[0xFF], b[0x41]], [b[0xE4], b[0xBD], b[0xA0], b[0xE4]], [word, b[0xE4]]):
        want = ref.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids) == want, ids
        dec = tok.stream_decoder()
        pieces = [dec.push(i) for i in ids]
        assert "".join(pieces) + dec.finish() == want
    assert tok.decode([b[0xE4], b[0xBD]]) == "\ufffd\ufffd"     # not Python's single U+FFFD


def test_stream_holds_a_byte_run_until_it_ends():
    tok, _ = pair("gemma")
    dec = tok.stream_decoder()
    ids = tok.encode("a\U000f0001b", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids][1:5] == ["<0xF3>", "<0xB0>", "<0x80>", "<0x81>"]
    out = []
    for k, i in enumerate(ids):
        out.append(dec.push(i))
        if 1 <= k <= 4:
            assert not dec.whole           # the run may still turn out invalid: nothing yet
    assert out[1:5] == ["", "", "", ""]
    assert "".join(out) + dec.finish() == "a\U000f0001b"


def test_leading_space_of_the_first_piece_only():
    tok, ref = pair("metaspace")
    for s in ["hello", " hello", "<s>hello", "hello<x>hello", "<x> hello", "  a", ""]:
        assert tok.encode(s) == ref_ids(ref, s), s
        assert tok.decode(tok.encode(s)) == ref.decode(ref_ids(ref, s), skip_special_tokens=False)


def test_unsupported_decoders_are_refused():
    tj = spm_json("gemma")
    tj["decoder"] = {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "ByteFallback"}]}
    with pytest.raises(UnsupportedTokenizerError, match="decoder chain"):
        load_tokenizer({"tokenizer.json": tj})
    tj["decoder"] = None
    with pytest.raises(UnsupportedTokenizerError, match="decoder"):
        load_tokenizer({"tokenizer.json": tj})


TEXT = st.lists(st.one_of(st.characters(exclude_categories=("Cs",)),
                          st.sampled_from(list(" \t\n\u2581\u00a0aé你😀\u200d<>\x00") +
                                          ["<s>", "</s>", "<x>", "[INST]", "<0x41>", " the", "  "])),
                max_size=30).map("".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT, name=st.sampled_from(sorted(VARIANTS)))
def test_random_text_equals_tokenizers(text, name):
    tok, ref = pair(name)
    ids = tok.encode(text)
    assert ids == ref_ids(ref, text)
    assert tok.encode(text, split_special_tokens=True) == ref_ids(ref, text, split_special=True)
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)


# --- GGUF SentencePiece vocabularies, against transformers' conversion --------------------------

def write_spm_gguf(path: Path, arch: str, tokens: list[str], types: list[int],
                   scores: list[float], *, bos: int, eos: int, unk: int) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_gguf(path: Path, arch: str) -> Path:
    """The llama2 variant's vocabulary as a GGUF: scores fall with the id, specials are control
    tokens, byte tokens BYTE, "<x>" user-defined; for Gemma its own special tokens (transformers
    adds them when missing) and a token of spaces stored as spaces."""
    vocab = spm_json("llama2")["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    specials = SPECIALS
    if arch == "gemma3":
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        tokens = specials + [t for t in tokens if t not in SPECIALS]
    types = [3 if t in specials else 6 if t in BYTE_TOKENS else 1 for t in tokens]
    tokens.append("<x>")
    types.append(4)
    if arch == "gemma3":
        tokens += ["  ", "\n\n"]
        types += [4, 4]
    ids = {t: tokens.index(t) for t in ("<s>", "</s>", "<unk>", "<bos>", "<eos>") if t in tokens}
    return write_spm_gguf(path, arch, tokens, types, [-float(i) for i in range(len(tokens))],
                          bos=ids.get("<bos>", ids.get("<s>")), eos=ids.get("<eos>", ids.get("</s>")),
                          unk=ids["<unk>"])


def transformers_gguf_tokenizer(path: Path):
    """transformers' GGUF tokenizer conversion (its metadata read with `gguf`, renamed with its own
    GGUF_TOKENIZER_MAPPING)."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    r = gguf.GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items()
          if k.startswith("tokenizer.") or k == "general.architecture"}
    td = {name: md[f"tokenizer.{key}"] for key, name in mapping.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
          if f"tokenizer.{key}" in md}
    tok, _ = mapping.convert_gguf_tokenizer(md["general.architecture"], td)
    return tok


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gguf_sentencepiece_vocabulary_equals_transformers_conversion(tmp_path, arch):
    path = spm_gguf(tmp_path / "spm.gguf", arch)
    files = tokenizer_files_from_gguf(gguf.GGUFReader(str(path)))
    mine = files["tokenizer.json"]
    theirs = transformers_gguf_tokenizer(path)
    want = json.loads(theirs.to_str())
    for key in ("normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert mine[key] == want[key], key
    assert mine["model"]["vocab"] == want["model"]["vocab"]
    assert [tuple(m) for m in mine["model"]["merges"]] == [tuple(m) for m in want["model"]["merges"]]
    tok = load_tokenizer(files)
    bos = tok.bos_token_id
    assert tok.id_to_token(bos) == ("<bos>" if arch == "gemma3" else "<s>")
    for s in CORPUS:
        ids = theirs.encode(s, add_special_tokens=False).ids
        assert tok.encode(s) == [bos, *ids], s            # add_bos_token: llama.cpp's default
        assert tok.decode(ids) == theirs.decode(ids, skip_special_tokens=False), s
    if arch == "gemma3":
        assert tok.id_to_token(tok.token_to_id(SP * 2)) == SP * 2     # respelled, not an added token
        assert "  " not in {t["content"] for t in mine["added_tokens"]}


def test_derived_merges_rank_by_score_then_longer_left_piece():
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    merges = derive_merges(vocab, {"ab": -1.0, "bc": -3.0, "abc": -2.0, "a": 0.0})
    assert merges == [["a", "b"], ["ab", "c"], ["a", "bc"], ["b", "c"]]


# --- the Llama 3 split (GGUF pre "llama-bpe") --------------------------------------------------

@lru_cache(maxsize=None)
def llama3_pair():
    """A byte-level BPE trained with tokenizers' trainer, pre-tokenized by Llama 3's exact split."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT_PATTERN), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|begin_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS[::2], trainer)
    tj = json.loads(tok.to_str())
    return load_tokenizer({"tokenizer.json": tj}), tokenizers.Tokenizer.from_str(json.dumps(tj))


def test_llama3_split_corpus_ids_equal_tokenizers():
    tok, ref = llama3_pair()
    bad = [s for s in CORPUS if tok.encode(s) != ref_ids(ref, s)]
    assert not bad, f"{len(bad)} differ, first: {bad[:3]!r}"
    digits = tok.pre_tokenizer("1234567 and 12")
    assert digits[:3] == ["123", "456", "7"] and digits[-1] == "12"
    assert tok.pre_tokenizer("I'LL DON'T")[:2] == ["I", "'LL"]        # case-insensitive contractions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(st.one_of(st.characters(exclude_categories=("Cs",)),
                              st.sampled_from(list("0123456789'sStTlLdDmMvVrReE \n\r\t٣०①½"))),
                    max_size=40))
def test_llama3_split_random_text_equals_tokenizers(text):
    tok, ref = llama3_pair()
    assert tok.encode(text) == ref_ids(ref, text)


def test_llama_bpe_gguf_matches_transformers_split(tmp_path):
    from test_tokenizer_gguf import write_tiny_gguf
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    assert mapping.GGUF_PRE_TOKENIZER_SPLITS["llama-bpe"] == LLAMA3_SPLIT_PATTERN
    files = tokenizer_files_from_gguf(gguf.GGUFReader(str(write_tiny_gguf(tmp_path / "t.gguf",
                                                                          pre="llama-bpe"))))
    steps = files["tokenizer.json"]["pre_tokenizer"]["pretokenizers"]
    assert steps[0]["pattern"]["Regex"] == LLAMA3_SPLIT_PATTERN and steps[1]["type"] == "ByteLevel"
    assert PRE_TOKENIZERS["llama-bpe"]()["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_qwen3_uses_the_qwen2_pre_tokenizer(tmp_path):
    # A Qwen3 GGUF names its pre-tokenizer "qwen2": the tokenizer is Qwen2's, whatever the arch.
    from test_tokenizer_gguf import write_tiny_gguf
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    w = write_tiny_gguf(tmp_path / "qwen2.gguf", pre="qwen2")
    a = tokenizer_files_from_gguf(gguf.GGUFReader(str(w)))["tokenizer.json"]
    b = _tiny_with_arch(tmp_path / "q3.gguf", "qwen3")
    assert a == b
    assert a["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == \
        mapping.GGUF_PRE_TOKENIZER_SPLITS["qwen2"]


def _tiny_with_arch(path: Path, arch: str) -> dict:
    from test_tokenizer_gguf import MERGES, tiny_tokens
    tokens, types = tiny_tokens()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(4096)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokenizer_files_from_gguf(gguf.GGUFReader(str(path)))["tokenizer.json"]


@pytest.mark.parametrize("name", ["llama2", "metaspace", "byte-merge"])
def test_compiled_cache_serves_the_same_tokenizer(tmp_path, monkeypatch, name):
    import warnings
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(spm_json(**VARIANTS[name])), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = load_tokenizer(d)                  # parses the JSON, writes the cache
        cached = load_tokenizer(d)                 # served by the cache
    assert list((tmp_path / "home" / "tokenizers").iterdir())
    assert type(cached.model) is type(first.model) and cached.decoder == first.decoder
    assert cached._bytes == first._bytes and cached._byte_token_ids == first._byte_token_ids
    _, ref = pair(name)
    for s in CORPUS[::4]:
        ids = ref_ids(ref, s)
        assert cached.encode(s) == ids, s
        assert cached.decode(ids) == ref.decode(ids, skip_special_tokens=False), s


def test_bad_sentencepiece_gguf_metadata_is_a_typed_error(tmp_path):
    from ignis.tokenizer import GGUFTokenizerError
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab"]
    with pytest.raises(GGUFTokenizerError, match="6 tokens but 5 scores"):
        tokenizer_files_from_gguf(gguf.GGUFReader(str(write_spm_gguf(
            tmp_path / "a.gguf", "llama", tokens, [3, 3, 3, 1, 1, 1], [0.0] * 5, bos=1, eos=2, unk=0))))
    with pytest.raises(GGUFTokenizerError, match="unknown token type 9"):
        tokenizer_files_from_gguf(gguf.GGUFReader(str(write_spm_gguf(
            tmp_path / "b.gguf", "llama", tokens, [3, 3, 3, 1, 9, 1], [0.0] * 6, bos=1, eos=2, unk=0))))
    # a control token spelled like a later token (which takes the spelling's id) is refused
    with pytest.raises(GGUFTokenizerError, match="spelled like token 6"):
        tokenizer_files_from_gguf(gguf.GGUFReader(str(write_spm_gguf(
            tmp_path / "c.gguf", "llama", tokens + ["<s>"], [3, 3, 3, 1, 1, 1, 1], [0.0] * 7,
            bos=1, eos=2, unk=0))))


# --- end to end: generation streams SentencePiece text -----------------------------------------

def tiny_spm_files() -> dict[str, dict]:
    """A Llama-2-layout tokenizer that fits the tiny random models' 272 ids: <unk> <s> </s>, the 256
    byte tokens at 3..258 (as in Llama 2), then characters and merges. Random weights emit byte
    tokens often: invalid byte runs, characters split over tokens, the stripped prefix space."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{t: 3 + b for b, t in enumerate(BYTE_TOKENS)}}
    for t in [SP, "a", "b", "é", "你", SP + "a", "ab", SP + "b", SP + SP, "ba", SP + "ab",
              "aa", SP + "你"]:
        vocab[t] = len(vocab)
    merges = [[SP, "a"], ["a", "b"], [SP, "b"], [SP, SP], ["b", "a"], [SP + "a", "b"], ["a", "a"],
              [SP, "你"]]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges],
                                          unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                            for t in SPECIALS])
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    assert len(vocab) == 272
    return {"tokenizer.json": json.loads(tok.to_str()),
            "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                      "tokenizer_class": "LlamaTokenizer"}}


def test_generation_streams_sentencepiece_text_as_decode_gives_it(tiny_llama_dir, tmp_path):
    import shutil

    import ignis
    d = tmp_path / "tiny-llama-spm"
    shutil.copytree(tiny_llama_dir, d)
    files = tiny_spm_files()
    for name, content in files.items():
        (d / name).write_text(json.dumps(content), encoding="utf-8")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2)
    (d / "config.json").write_text(json.dumps(cfg))
    ref = tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))
    m = ignis.load(str(d), n_ctx=96, threads=1, progress=False)
    assert m.tokenizer.encode("a b你") == ref.encode("a b你").ids
    prompt = m.tokenize("ab ba")
    spaces = 0
    for seed in range(4):
        kw = dict(max_tokens=40, temperature=1.0, seed=seed, ignore_eos=True)
        result = m.generate("ab ba", **kw)
        # the completion is the text past the prompt's (the text-generation pipeline's rule)
        head = ref.decode(prompt, skip_special_tokens=True)
        whole = ref.decode(prompt + list(result.token_ids), skip_special_tokens=True)
        assert whole.startswith(head) and result.text == whole[len(head):]
        assert "".join(m.stream("ab ba", **kw)) == result.text
    # completions that open with "▁": the space decoding the completion alone would strip is kept
    for seed in range(200):
        r = m.generate("ab ba", max_tokens=2, temperature=1.0, seed=seed, ignore_eos=True)
        if ref.id_to_token(r.token_ids[0]).startswith(SP):
            spaces += 1
            assert r.text.startswith(" ") and "".join(m.stream("ab ba", max_tokens=2, temperature=1.0,
                                                                seed=seed, ignore_eos=True)) == r.text
    assert spaces            # seeded: the tiny model opens with one in 200 draws
