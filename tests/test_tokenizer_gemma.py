"""Gemma 3's SentencePiece BPE, from the real Gemma 3 270M GGUF, against what transformers builds
from the same file (AutoTokenizer.from_pretrained(dir, gguf_file=...), run by Hugging Face tokenizers):
the rebuilt tokenizer.json equals transformers' field by field, and ids, decodes and streamed text
equal the golden corpus (tests/data/tokenizer/golden-gemma3.json.gz, written by
tests/reference/make_tokenizer_golden.py gemma) and random text.

Needs the GGUF (tests/gemma_gguf.py): skipped without its packages, failed under IGNIS_REQUIRE_MODELS=1.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings, strategies as st

from ignis.tokenizer import load_tokenizer, tokenizer_files_from_gguf

from gemma_gguf import GEMMA3_270M
from test_tokenizer_support import DATA, read_gz_json

pytestmark = [pytest.mark.model, pytest.mark.slow]

GOLDEN = read_gz_json(DATA / "golden-gemma3.json.gz")
CORPUS: list[str] = GOLDEN["corpus"]


@pytest.fixture(scope="module")
def gemma_path(gemma3_gguf: Path) -> Path:
    return gemma3_gguf


@pytest.fixture(scope="module")
def reader(gemma_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(gemma_path))         # ~10 s: 262k tokens of metadata


@pytest.fixture(scope="module")
def files(reader) -> dict[str, dict]:
    return tokenizer_files_from_gguf(reader)


@pytest.fixture(scope="module")
def tok(files):
    return load_tokenizer(files)


@pytest.fixture(scope="module")
def ref(files) -> tokenizers.Tokenizer:
    """tokenizers running our tokenizer.json, which test_rebuilt_files_equal_transformers_own
    proves equal to transformers' (building that one takes ~15 s)."""
    return tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))


def test_golden_file_is_of_this_gguf():
    assert GOLDEN["gguf_sha256"] == GEMMA3_270M.sha256
    assert len(CORPUS) >= 2000


def test_rebuilt_files_equal_transformers_own(gemma_path, reader, files):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(gemma_path.parent),
                                                        gguf_file=gemma_path.name)
    want = json.loads(theirs.backend_tokenizer.to_str())
    mine = files["tokenizer.json"]
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"):
        assert mine[key] == want[key], key
    assert mine["model"]["vocab"] == want["model"]["vocab"]
    assert [tuple(m) for m in mine["model"]["merges"]] == [tuple(m) for m in want["model"]["merges"]]
    assert {k: v for k, v in mine["model"].items() if k not in ("vocab", "merges")} == \
        {k: v for k, v in want["model"].items() if k not in ("vocab", "merges")}
    # The vocabulary is the GGUF's, id for id (whitespace tokens spelled with "▁").
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(want["model"]["vocab"]) == len(tokens) == 262144
    for i, t in enumerate(tokens):
        assert want["model"]["vocab"]["\u2581" * len(t) if " " in t and not t.strip() else t] == i
    cfg = files["tokenizer_config.json"]
    assert (cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"]) == \
        (theirs.bos_token, theirs.eos_token, theirs.add_bos_token)


def test_golden_corpus_ids_equal_transformers(tok):
    ids = GOLDEN["ids"]
    bad = []
    for i, s in enumerate(CORPUS):
        want = ids["special"][i]
        if tok.encode(s) != want:
            bad.append(("special", s))
        if tok.encode(s, split_special_tokens=True) != ids["split_special"].get(str(i), want):
            bad.append(("split_special", s))
        if tok.encode(s, add_special_tokens=False) != ids["no_add_special"].get(str(i), want):
            bad.append(("no_add_special", s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]!r}"


def test_golden_decode_and_stream_equal_transformers(tok):
    for i, s in enumerate(CORPUS):
        ids = GOLDEN["ids"]["special"][i]
        assert tok.decode(ids) == GOLDEN["decoded"][i], s
        dec = tok.stream_decoder()
        assert dec.push_many(ids) + dec.finish() == GOLDEN["decoded"][i], s


def test_pure_python_twin_gives_the_same_ids(files):
    twin = load_tokenizer(files, backend="ref")
    assert twin.model._merger is None
    for i in range(0, len(CORPUS), 5):
        if len(CORPUS[i]) < 3000:
            assert twin.encode(CORPUS[i]) == GOLDEN["ids"]["special"][i], CORPUS[i]


def test_compiled_path_is_the_one_used(tok):
    # Gemma has every byte token and no merge of one: the compiled loop runs, with word splitting.
    assert tok.model._merger is not None and tok.model._split is not None


def test_decode_like_tokenizers_on_random_ids(tok, ref):
    rng = random.Random(11)
    byte_ids = sorted(tok._byte_token_ids)
    for _ in range(300):
        ids = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(262144)
               for _ in range(rng.randrange(1, 16))]
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == \
                ref.decode(ids, skip_special_tokens=skip), ids
        dec = tok.stream_decoder()
        assert dec.push_many(ids) + dec.finish() == tok.decode(ids)


# Any character, characters that matter here, and whole token spellings.
TEXT = st.lists(st.one_of(st.characters(exclude_categories=("Cs",)),
                          st.sampled_from(list(" \t\n\u2581\u00a0\u3000aé你😀\u200d<>/bos_unk\x00")),
                          st.sampled_from(["<bos>", "<start_of_turn>", "<table>", "\n\n", "<0x41>",
                                           " the", "ing", "  "])),
                max_size=30).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_random_text_ids_and_round_trip_equal_tokenizers(tok, ref, text):
    ids = tok.encode(text)
    assert ids == ref.encode(text).ids
    ref.encode_special_tokens = True
    try:
        assert tok.encode(text, split_special_tokens=True) == ref.encode(text).ids
    finally:
        ref.encode_special_tokens = False
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_random_vocabulary_concatenations_equal_tokenizers(tok, ref):
    # Text made of the vocabulary's own pieces meets the merges where they matter most.
    vocab = list(tok.model.vocab)
    rng = random.Random(5)
    for _ in range(3000):
        s = "".join(rng.choice(vocab) for _ in range(rng.randrange(1, 15)))
        if rng.random() < 0.8:
            s = s.replace("\u2581", " ")
        ids = tok.encode(s)
        assert ids == ref.encode(s).ids, s
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False), s
