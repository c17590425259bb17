"""Randomized differential tests: ignis.tokenizer against Hugging Face tokenizers on random Unicode
text and on random concatenations of vocabulary pieces, plus decode(encode(s)) == normalize(s)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ignis.tokenizer.bytelevel import alphabet_to_bytes

from test_tokenizer_support import FAMILIES, ours, ref_encode, reference

# Any code point but surrogates (a str holding one cannot be encoded; tested separately).
ANY_CHAR = st.characters(exclude_categories=("Cs",))
# Characters that stress the pre-tokenizer: whitespace kinds, digits, apostrophes, letters of
# several scripts, combining marks, emoji parts, special-token pieces.
TRICKY = st.sampled_from(list(" \t\n\r\x0b\x0c\u00a0\u3000\u2028\u0085'sStTlLdDmMvVrReE0123456789"
                              "٣०①½aéß你好한アБ\u0301\u0308\u200d\ufe0f🏽😀👩<|>_/"))
TEXT = st.text(st.one_of(ANY_CHAR, TRICKY), max_size=40)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _vocab_pieces(family: str) -> list[str]:
    tok = ours(family)
    return [tok.id_to_token(i) for i in range(tok.vocab_size) if tok.id_to_token(i) is not None]


PIECES = {f: _vocab_pieces(f) for f in FAMILIES}


def _check(family: str, text: str) -> None:
    tok, ref = ours(family), reference(family)
    assert tok.encode(text) == ref_encode(ref, text)
    assert tok.encode(text, split_special_tokens=True) == ref_encode(ref, text, split_special_tokens=True)


@SETTINGS
@given(text=TEXT)
def test_random_unicode_qwen(text):
    _check("qwen2.5", text)


@SETTINGS
@given(text=TEXT)
def test_random_unicode_smollm(text):
    _check("smollm2", text)


def _pieces_text(family: str):
    pieces = PIECES[family]
    return st.lists(st.sampled_from(pieces), max_size=12).map(
        # Vocabulary pieces are spelled in the byte alphabet; their bytes may split a character.
        lambda ps: b"".join(alphabet_to_bytes(p) for p in ps).decode("utf-8", "replace"))


@SETTINGS
@given(data=st.data())
@pytest.mark.slow
def test_random_vocabulary_concatenations(data):
    for family in FAMILIES:
        _check(family, data.draw(_pieces_text(family)))


@SETTINGS
@given(text=TEXT)
def test_round_trip_is_the_normalized_text(text):
    tok = ours("qwen2.5")    # every byte has a token in Qwen2's vocabulary
    assert tok.decode(tok.encode(text)) == tok.normalize(text)
    assert tok.decode(tok.encode(text, split_special_tokens=True)) == tok.normalize(text)


@SETTINGS
@given(ids=st.lists(st.integers(0, 151664), max_size=30))
def test_random_ids_decode_and_stream_like_tokenizers(ids):
    tok, ref = ours("qwen2.5"), reference("qwen2.5")
    full = tok.decode(ids)
    assert full == ref.decode(ids, skip_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.finish() == full


@SETTINGS
@given(data=st.data())
@pytest.mark.slow
def test_compiled_merge_loop_equals_pure_python_twin(data):
    family = data.draw(st.sampled_from(FAMILIES))
    tok = ours(family)
    word = data.draw(_pieces_text(family).filter(lambda s: s != ""))
    word = word * data.draw(st.integers(1, 8))          # long words take the heap path
    assert tok.model._merger.encode_word(word) == tok.model.encode_word_ref(word)
