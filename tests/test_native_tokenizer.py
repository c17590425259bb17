"""The native tokenizer (csrc/native/tokenizer.c, opened from ignis.native.tokenizer_blob's blob)
against ignis's Python tokenizer and Hugging Face tokenizers: the golden corpora of every registry
tokenizer (Qwen2.5, SmolLM2 here; Gemma 3 from its GGUF, slow) with add_special and parse_special on
and off, the Llama 3 and plain GPT-2 splits and a SentencePiece tokenizer with Metaspace built here,
random unicode text, chat prompts with token text in messages (ig_tok_encode_masked against
Tokenizer.encode_chat), decode and streaming decode (piece by piece equal to StreamDecoder's and to
the Python decoder's),
hostile blobs and invalid UTF-8, and a C driver run under AddressSanitizer/UBSan (fuzzed blobs,
concurrent encodes on one handle).

The library is compiled here from the C source with cc (a missing cc skips, and fails under
IGNIS_REQUIRE_TOOLS=1)."""
from __future__ import annotations

import copy
import ctypes
import json
import random
import struct
import subprocess
from pathlib import Path

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings, strategies as st

from ignis.native.tokenizer_blob import tokenizer_section
from ignis.tokenizer import Tokenizer, UnsupportedTokenizerError, load_tokenizer
from ignis.tokenizer.gguf_vocab import LLAMA3_SPLIT_PATTERN

from test_tokenizer_support import DATA, FAMILIES, ours, read_gz_json, ref_encode, reference, \
    tokenizer_files
from tools_required import missing_tool, require_tool

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "csrc" / "native" / "tokenizer.c"
GOLDEN = read_gz_json(DATA / "golden.json.gz")
CORPUS: list[str] = GOLDEN["corpus"]
FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I" + str(SRC.parent)]
ERR_UTF8, ERR_ID = -1, -3
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _cc() -> str:
    return require_tool("cc", "apt-get install gcc", "the native tokenizer")


@pytest.fixture(scope="session")
def lib(tmp_path_factory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("native-tok") / "libigtok.so"
    subprocess.run([_cc(), *FLAGS, "-fPIC", "-shared", "-o", str(out), str(SRC)], check=True)
    so = ctypes.CDLL(str(out))
    P, I32P, SZ = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t
    so.ig_tok_open.restype = P
    so.ig_tok_open.argtypes = [ctypes.c_char_p, SZ, ctypes.c_char_p, ctypes.c_int]
    so.ig_tok_free.argtypes = [P]
    so.ig_tok_encode.argtypes = [P, ctypes.c_char_p, SZ, ctypes.c_int, ctypes.c_int,
                                 ctypes.POINTER(I32P), ctypes.POINTER(SZ)]
    so.ig_tok_encode_masked.argtypes = [P, ctypes.c_char_p, SZ, ctypes.POINTER(ctypes.c_uint32),
                                        ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(SZ), SZ,
                                        ctypes.POINTER(I32P), ctypes.POINTER(SZ)]
    so.ig_tok_decode.argtypes = [P, I32P, SZ, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(SZ)]
    so.ig_tok_release.argtypes = [P]
    so.ig_tok_token_bytes.argtypes = [P, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(SZ)]
    for name in ("ig_tok_vocab_size", "ig_tok_bos_id", "ig_tok_eos_id", "ig_tok_pad_id"):
        getattr(so, name).argtypes = [P]
        getattr(so, name).restype = ctypes.c_int32
    so.ig_tok_is_special.argtypes = [P, ctypes.c_int32]
    so.ig_tok_eos_ids.argtypes = [P, ctypes.POINTER(I32P)]
    so.ig_tok_eos_ids.restype = SZ
    so.ig_tok_prefix_ids.argtypes = [P, ctypes.POINTER(I32P)]
    so.ig_tok_prefix_ids.restype = SZ
    so.ig_tok_stream_new.restype = P
    so.ig_tok_stream_new.argtypes = [P, ctypes.c_int]
    so.ig_tok_stream_push.argtypes = [P, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(SZ)]
    so.ig_tok_stream_finish.argtypes = [P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(SZ)]
    so.ig_tok_stream_free.argtypes = [P]
    return so


class Native:
    """One ig_tok through ctypes."""

    def __init__(self, so: ctypes.CDLL, blob: bytes):
        self.so = so
        err = ctypes.create_string_buffer(512)
        self.h = so.ig_tok_open(blob, len(blob), err, len(err))
        if not self.h:
            raise ValueError(err.value.decode())

    def __del__(self):
        if getattr(self, "h", None):
            self.so.ig_tok_free(self.h)

    def encode_raw(self, data: bytes, add_special: bool = True, parse_special: bool = True):
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        rc = self.so.ig_tok_encode(self.h, data, len(data), int(add_special), int(parse_special),
                                   ctypes.byref(ids), ctypes.byref(n))
        if rc:
            return rc
        out = ids[:n.value]
        self.so.ig_tok_release(ids)
        return out

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out = self.encode_raw(text.encode("utf-8"), add_special, parse_special)
        assert isinstance(out, list), f"encode failed with {out}"
        return out

    def encode_masked(self, text: str, masks: dict[str, str]) -> list[int]:
        chars = (ctypes.c_uint32 * len(masks))(*map(ord, masks))
        texts = [t.encode("utf-8") for t in masks.values()]
        ptrs = (ctypes.c_char_p * len(masks))(*texts)
        lens = (ctypes.c_size_t * len(masks))(*map(len, texts))
        data = text.encode("utf-8")
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        rc = self.so.ig_tok_encode_masked(self.h, data, len(data), chars, ptrs, lens, len(masks),
                                          ctypes.byref(ids), ctypes.byref(n))
        assert rc == 0, rc
        out = ids[:n.value]
        self.so.ig_tok_release(ids)
        return out

    def decode(self, ids: list[int], skip_special: bool = False) -> str | int:
        arr = (ctypes.c_int32 * len(ids))(*ids)
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = self.so.ig_tok_decode(self.h, arr, len(ids), int(skip_special), ctypes.byref(text),
                                   ctypes.byref(n))
        if rc:
            return rc
        data = ctypes.string_at(text, n.value)
        self.so.ig_tok_release(text)
        return data.decode("utf-8")         # strict: the C side must hand out valid UTF-8

    def stream(self, ids: list[int], skip_special: bool = False, continuation: bool = False,
               chars: bool = False) -> list[str]:
        """Each push's text and finish's. chars: the decoder's steps (no grapheme hold)."""
        s = self.so.ig_tok_stream_new(self.h, skip_special | continuation << 1 | chars << 2)
        assert s
        pieces = []
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        try:
            for i in ids:
                rc = self.so.ig_tok_stream_push(s, i, ctypes.byref(text), ctypes.byref(n))
                assert rc == 0, rc
                pieces.append(ctypes.string_at(text, n.value).decode("utf-8"))
            assert self.so.ig_tok_stream_finish(s, ctypes.byref(text), ctypes.byref(n)) == 0
            pieces.append(ctypes.string_at(text, n.value).decode("utf-8"))
        finally:
            self.so.ig_tok_stream_free(s)
        return pieces

    def token_bytes(self, i: int) -> bytes | None:
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        if self.so.ig_tok_token_bytes(self.h, i, ctypes.byref(p), ctypes.byref(n)):
            return None
        return ctypes.string_at(p, n.value)


def python_stream(tok: Tokenizer, ids: list[int], skip_special: bool = False,
                  continuation: bool = False) -> list[str]:
    """StreamDecoder's push per id, then finish."""
    sd = tok.stream_decoder(skip_special_tokens=skip_special, continuation=continuation)
    return [sd.push(i) for i in ids] + [sd.finish()]


def python_pieces(tok: Tokenizer, ids: list[int], skip_special: bool = False,
                  continuation: bool = False) -> list[str]:
    """What the Python decoder's incremental state (StreamDecoder.add's step) hands out per id."""
    state = tok.decoder.stream(continuation)
    out = []
    for i in ids:
        data = tok.token_bytes(i)
        if skip_special and i in tok.special_ids:
            out.append("")
        else:
            out.append(state.feed(data, tok.is_byte_token(i), tok.id_to_token(i)))
    out.append(state.flush())
    return out


_natives: dict[int, tuple[Tokenizer, Native]] = {}


def native_of(lib, tok: Tokenizer) -> Native:
    """The native twin of tok (kept with tok, so that its id is not reused meanwhile)."""
    if id(tok) not in _natives:
        _natives[id(tok)] = (tok, Native(lib, tokenizer_section(tok)))
    return _natives[id(tok)][1]


def check_same(nat: Native, tok: Tokenizer, texts, ids_of=None) -> None:
    """ids of every text equal, in all four add_special x parse_special modes."""
    bad = []
    for s in texts:
        for add in (True, False):
            for parse in (True, False):
                want = tok.encode(s, add, not parse) if ids_of is None else ids_of(s, add, parse)
                if nat.encode(s, add, parse) != want:
                    bad.append((add, parse, s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:2]!r:.600}"


# --- registry tokenizers (quick: their committed tokenizer files) --------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_golden_corpus_ids(lib, family):
    nat = native_of(lib, ours(family))
    ids = GOLDEN["ids"][family]
    bad = []
    for i, s in enumerate(CORPUS):
        want = ids["special"][i]
        if nat.encode(s) != want:
            bad.append(("special", s))
        if nat.encode(s, True, False) != ids["split_special"].get(str(i), want):
            bad.append(("split_special", s))
        if nat.encode(s, False, True) != ids["no_add_special"].get(str(i), want):
            bad.append(("no_add_special", s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]!r:.600}"


@pytest.mark.parametrize("family", FAMILIES)
def test_no_add_no_parse_equals_python(lib, family):
    tok = ours(family)
    nat = native_of(lib, tok)
    bad = [s for s in CORPUS if nat.encode(s, False, False) != tok.encode(s, False, True)]
    assert not bad, bad[:2]


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_round_trip_and_stream(lib, family):
    tok = ours(family)
    nat = native_of(lib, tok)
    for i, s in enumerate(CORPUS[::3]):
        ids = tok.encode(s)
        for skip in (False, True):
            text = nat.decode(ids, skip)
            assert text == tok.decode(ids, skip_special_tokens=skip), s
            pieces = nat.stream(ids, skip)
            assert "".join(pieces) == text
            assert pieces == python_stream(tok, ids, skip)
            assert nat.stream(ids, skip, chars=True) == python_pieces(tok, ids, skip)
        # a round trip gives the normalized text (SmolLM2 drops the bytes it has no token for)
        if family == "qwen2.5" and not any(t in s for t in tok._raw_matcher.by_text):
            assert nat.decode(ids) == tok.normalize(s)


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_holds_split_characters(lib, family):
    tok = ours(family)
    nat = native_of(lib, tok)
    text = "漢字のテスト 👨‍👩‍👧‍👦 ﷽ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ẞ"
    # One byte token per byte: every multi-byte character arrives in pieces.
    byte_id = {b: tok.model.byte_ids[b] for b in range(256)}
    ids = [byte_id[b] for b in text.encode("utf-8") if byte_id[b] >= 0]
    pieces = nat.stream(ids, chars=True)
    assert "".join(pieces) == text
    assert pieces == python_pieces(tok, ids)
    assert sum(1 for p in pieces if p == "") > 10      # the split characters were held back
    clusters = nat.stream(ids)
    assert clusters == python_stream(tok, ids)
    assert "👨‍👩‍👧‍👦" in clusters                      # the family emoji comes out whole


@pytest.mark.parametrize("family", FAMILIES)
def test_random_ids_decode_and_stream(lib, family):
    tok = ours(family)
    nat = native_of(lib, tok)
    rng = random.Random(18)
    valid = [i for i in range(tok.vocab_size) if tok.has_token(i)]
    for _ in range(300):
        ids = [rng.choice(valid) for _ in range(rng.randint(0, 12))]
        assert nat.decode(ids) == tok.decode(ids)
        assert nat.stream(ids, chars=True) == python_pieces(tok, ids)
        assert nat.stream(ids) == python_stream(tok, ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_vocabulary_queries(lib, family):
    tok = ours(family)
    nat = native_of(lib, tok)
    so = lib
    assert so.ig_tok_vocab_size(nat.h) == tok.vocab_size
    assert so.ig_tok_bos_id(nat.h) == (-1 if tok.bos_token_id is None else tok.bos_token_id)
    assert so.ig_tok_eos_id(nat.h) == (-1 if tok.eos_token_id is None else tok.eos_token_id)
    assert so.ig_tok_pad_id(nat.h) == (-1 if tok.pad_token_id is None else tok.pad_token_id)
    for i in list(range(0, tok.vocab_size, 997)) + sorted(tok.special_ids) + [tok.vocab_size - 1]:
        want = tok.token_bytes(i) if tok.has_token(i) else None
        assert nat.token_bytes(i) == want, i
        assert bool(so.ig_tok_is_special(nat.h, i)) == (i in tok.special_ids)
    assert nat.token_bytes(-1) is None and nat.token_bytes(tok.vocab_size) is None
    eos = ctypes.POINTER(ctypes.c_int32)()
    n = so.ig_tok_eos_ids(nat.h, ctypes.byref(eos))
    assert eos[:n] == [tok.eos_token_id]
    blob = tokenizer_section(tok, eos_token_ids=[3, 1, 2])
    other = Native(lib, blob)       # held: a temporary's handle is freed before the call reads it
    n = so.ig_tok_eos_ids(other.h, ctypes.byref(eos))
    assert eos[:n] == [3, 1, 2]


ANY_CHAR = st.characters(exclude_categories=("Cs",))
# Characters each rule of the scanners and NFC turns on: spaces, line breaks, contractions (and the
# long s that (?i) folds to s), digits of several scripts, combining marks, Hangul jamo, composites.
TRICKY = st.sampled_from(list(
    " \t\n\r\x0b\x0c\u00a0\u3000\u2028\u0085\u1680'sStTlLdDmMvVrReE\u017f0123456789\u0663\u0967\u00b2"
    "\u2155\u0301\u0308\u0323\u031b\u0345\u1100\u1161\u11a8\uac00Åå\u212bḱ\u0344\u0f73\u0cf3\u1e9b"
    "<|im_start|><|im_end|>"))
TEXT = st.text(st.one_of(ANY_CHAR, TRICKY), max_size=60)


@pytest.mark.parametrize("family", FAMILIES)
@given(text=TEXT)
@SETTINGS
def test_random_unicode_equals_python(lib, family, text):
    tok = ours(family)
    nat = native_of(lib, tok)
    for add, parse in ((True, True), (False, False)):
        assert nat.encode(text, add, parse) == tok.encode(text, add, not parse)


@given(text=TEXT)
@SETTINGS
def test_random_unicode_equals_tokenizers(lib, text):
    nat = native_of(lib, ours("qwen2.5"))
    assert nat.encode(text) == ref_encode(reference("qwen2.5"), text)


# What each grapheme-cluster rule turns on: CR LF, controls, Hangul jamo and syllables, Extend,
# ZWJ, SpacingMark, Prepend, Indic conjuncts (consonant, virama, consonant), emoji ZWJ sequences and
# modifiers, regional-indicator pairs.
CLUSTER_PARTS = st.sampled_from([
    "\r", "\n", "\t", "a", " ", "\u0301", "\u200d", "\u200c", "\ufe0f", "\U0001F44D", "\U0001F3FD",
    "\U0001F468", "\U0001F469", "\u2764", "\u00a9", "\U0001F1E6", "\U0001F1E7", "\U0001F1E8", "\u1100",
    "\u1161", "\u11a8", "\uac00", "\uac01", "\u0915", "\u094d", "\u0937", "\u0903", "\u093f", "\u0600",
    "\u0d4e", "\u0e33", "\u0f40", "x\u0308"])


@pytest.mark.parametrize("family", FAMILIES)
@given(parts=st.lists(CLUSTER_PARTS, max_size=24))
@SETTINGS
def test_stream_holds_whole_grapheme_clusters_like_python(lib, family, parts):
    tok = ours(family)
    nat = native_of(lib, tok)
    text = "".join(parts)
    ids = tok.encode(text, add_special_tokens=False)
    byte_ids = [tok.model.byte_ids[b] for b in text.encode("utf-8")]     # one push per byte
    for seq in (ids, [i for i in byte_ids if i >= 0]):
        assert nat.stream(seq) == python_stream(tok, seq)


def test_stream_clusters_over_every_property_class(lib):
    # Random runs of code points drawn class by class (each Grapheme_Cluster_Break value,
    # Extended_Pictographic, each Indic_Conjunct_Break value), as the `regex` package classifies them.
    import regex
    tok = ours("qwen2.5")
    nat = native_of(lib, tok)
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    pools = [regex.findall(p, everything) for p in (
        *(rf"\p{{GCB={v}}}" for v in ("CR", "LF", "Control", "Extend", "ZWJ", "RI", "Prepend",
                                      "SpacingMark", "L", "V", "T", "LV", "LVT")),
        r"\p{ExtPict}", r"\p{InCB=Linker}", r"\p{InCB=Consonant}", r"\p{InCB=Extend}", "[a-z]")]
    rng = random.Random(29)
    for _ in range(3000):
        text = "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 12)))
        ids = tok.encode(text, add_special_tokens=False)
        assert nat.stream(ids) == python_stream(tok, ids), ascii(text)


def test_nfc_on_every_kind_of_character(lib):
    # Qwen2.5 normalizes with NFC: random runs of combining marks (every class), characters with
    # decompositions, singletons and composition exclusions, Hangul jamo and syllables, and the
    # INERT characters tokenizers' older Unicode leaves alone, against the Python tokenizer.
    import unicodedata
    from ignis.tokenizer import _unicode_tables as t
    tok = ours("qwen2.5")
    nat = native_of(lib, tok)
    chars = [chr(c) for c in range(0x30000) if not 0xD800 <= c < 0xE000]
    marks = [c for c in chars if unicodedata.combining(c)]
    decomposable = [c for c in chars if unicodedata.decomposition(c)
                    and not unicodedata.decomposition(c).startswith("<")]
    changed = [c for c in chars if unicodedata.normalize("NFC", c) != c]
    hangul = [chr(c) for c in (*range(0x1100, 0x1113), *range(0x1161, 0x1176), *range(0x11A7, 0x11C3),
                               0xAC00, 0xAC01, 0xAC1C, 0xD7A3)]
    inert = [chr(a) for a, _ in t.INERT] + [chr(b) for _, b in t.INERT]
    pools = [marks, decomposable, changed, hangul, inert, list("aeiouAEIOU "), list("कொ")]
    rng = random.Random(15)
    for _ in range(3000):
        text = "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 10)))
        assert nat.encode(text) == tok.encode(text), ascii(text)


def test_invalid_utf8_is_an_error(lib):
    nat = native_of(lib, ours("qwen2.5"))
    for bad in (b"\xff", b"a\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\x80ok",
                b"\xe2\x82", b"\xf0\x9f\x98"):
        assert nat.encode_raw(bad) == ERR_UTF8, bad
    assert nat.encode_raw(b"") == []
    for chars, texts, want in (([0x41], [b"x"], -4), ([0xE000], [b"\xff"], ERR_UTF8),
                               ([0x110000], [b"x"], -4)):
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        assert lib.ig_tok_encode_masked(
            nat.h, b"ab", 2, (ctypes.c_uint32 * 1)(*chars), (ctypes.c_char_p * 1)(*texts),
            (ctypes.c_size_t * 1)(len(texts[0])), 1, ctypes.byref(ids), ctypes.byref(n)) == want
    stream = lib.ig_tok_stream_new(nat.h, 0)
    text, size = ctypes.c_void_p(), ctypes.c_size_t()
    assert lib.ig_tok_stream_push(stream, 10 ** 8, ctypes.byref(text), ctypes.byref(size)) == ERR_ID
    assert lib.ig_tok_stream_finish(stream, ctypes.byref(text), ctypes.byref(size)) == 0
    assert lib.ig_tok_stream_push(stream, 0, ctypes.byref(text), ctypes.byref(size)) == -5
    lib.ig_tok_stream_free(stream)
    assert not lib.ig_tok_stream_new(nat.h, 8)
    big = ctypes.c_size_t((1 << 30) + 1)       # past IG_TOK_MAX_TEXT: refused before reading
    ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
    assert lib.ig_tok_encode(nat.h, b"x", big, 1, 1, ctypes.byref(ids), ctypes.byref(n)) == -6
    assert nat.decode([10 ** 8]) == ERR_ID and nat.decode([-5]) == ERR_ID


def test_tiny_model_tokenizer(lib):
    tok = Tokenizer(json.loads((DATA / "tiny-tokenizer.json").read_text()),
                    json.loads((DATA / "tiny-tokenizer_config.json").read_text()))
    nat = native_of(lib, tok)
    check_same(nat, tok, CORPUS[::5])
    for s in CORPUS[::11]:
        ids = tok.encode(s)
        assert nat.decode(ids) == tok.decode(ids)
        assert nat.stream(ids, chars=True) == python_pieces(tok, ids)
        assert nat.stream(ids) == python_stream(tok, ids)


def test_blob_of_a_cached_tokenizer_is_the_same(tmp_path):
    # A model directory's second load comes from the compiled-tokenizer cache (another build path
    # of Tokenizer); its blob must not differ.
    import shutil
    shutil.copy(DATA / "tiny-tokenizer.json", tmp_path / "tokenizer.json")
    shutil.copy(DATA / "tiny-tokenizer_config.json", tmp_path / "tokenizer_config.json")
    from ignis.tokenizer import compiled
    first = load_tokenizer(tmp_path)
    assert any(compiled.cache_dir().glob("*.bin"))
    second = load_tokenizer(tmp_path)
    assert tokenizer_section(first) == tokenizer_section(second)


def masked_render(tok: Tokenizer, messages: list[dict],
                  template: str | None = None) -> tuple[str, dict[str, str]]:
    """What Tokenizer.encode_chat renders before it tokenizes: the template's output over the
    masked messages, and the masks (tokenizer.py's encode_chat, its first steps)."""
    template = template or tok.chat_template
    (msgs, tools, docs, _), masks = tok._text_masker().mask((messages, None, None, []),
                                                             avoid=template or "")
    return tok.apply_chat_template(msgs, tools=tools, documents=docs, add_generation_prompt=True,
                                   chat_template=template), masks


def conversations(tok: Tokenizer) -> list[list[dict]]:
    specials = [t.content for t in tok.added_tokens]
    rng = random.Random(11)
    out = []
    for k in range(60):
        pieces = [rng.choice(CORPUS)[:80] for _ in range(3)]
        sp = rng.choice(specials)
        half = sp[:len(sp) // 2]
        user = rng.choice([f"{pieces[0]}{sp}{pieces[1]}", f"{sp}", f"{half}", f"{sp[len(sp) // 2:]}x",
                           f"ünï {sp}{sp} 中文", pieces[2]])
        out.append([{"role": "system", "content": f"Be brief. {half}" if k % 3 else "Be brief."},
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": f"{pieces[1]} {sp if k % 2 else ''}"},
                    {"role": "user", "content": f"{sp[1:]} and {pieces[0]}"}])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_chat_equals_encode_chat(lib, family):
    # The special-token rule of chat: token text inside a message stays plain text.
    tok = ours(family)
    nat = native_of(lib, tok)
    masked = 0
    for messages in conversations(tok):
        text, masks = masked_render(tok, messages)
        masked += bool(masks)
        assert nat.encode_masked(text, masks) == tok.encode_chat(messages), messages
    assert masked > 30


# --- pipelines of other registry families, built on the committed vocabularies -------------------

def _variant(family: str, **changes) -> dict:
    files = copy.deepcopy(tokenizer_files(family))
    files["tokenizer.json"].update(changes.pop("top", {}))
    files["tokenizer.json"]["model"].update(changes.pop("model", {}))
    return files


def _check_against_both(lib, files, texts):
    tok = load_tokenizer(files)
    ref = tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))
    nat = native_of(lib, tok)
    check_same(nat, tok, texts)
    bad = [s for s in texts if nat.encode(s) != ref_encode(ref, s)]
    assert not bad, bad[:2]
    return tok, nat


def test_llama3_split_and_ignore_merges(lib):
    # Llama 3's tokenizer.json: no normalizer, its split, ByteLevel, and ignore_merges.
    files = _variant("qwen2.5", top={"normalizer": None, "pre_tokenizer": {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}}, model={"ignore_merges": True})
    texts = CORPUS[::2] + ["12345678 1234567890123 ٣٤٥٦٧ ²³¹", "x" * 300 + "1" * 40]
    _check_against_both(lib, files, texts)


def test_gpt2_bytelevel_split(lib):
    files = _variant("smollm2", top={"pre_tokenizer": {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}})
    _check_against_both(lib, files, CORPUS[::2])


def test_digit_runs(lib):
    files = _variant("smollm2", top={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}})
    _check_against_both(lib, files, CORPUS[::4] + ["1234 ٣٤٥ x²³ 12ab34", "\u2155\u2156 7"])


def _spm_files(pre_tokenizer, decoder, normalizer=None) -> dict:
    """A small SentencePiece-style BPE (characters, byte fallback, unk) with merges of common
    English pieces, as tokenizers runs it."""
    chars = list("▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,'!?-éü中")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in chars:
        vocab.setdefault(c, len(vocab))
    merges = []
    for word in ["▁the", "▁and", "ing", "▁of", "tion", "▁a", "er", "▁in", "▁to", "▁is", "ed", "▁th",
                 "▁he", "llo", "▁wor", "▁world", "▁hello", "▁quick", "▁brown"]:
        left = word[0]
        for ch in word[1:]:
            if (left + ch) not in vocab:
                vocab[left + ch] = len(vocab)
                merges.append([left, ch])
            left = left + ch
    return {"tokenizer.json": {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for t, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))],
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges}},
        "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>"}}


SPM_TEXTS = ["Hello world", " the quick brown fox", "  two  spaces ", "über naïve café 中文 😀 ☃",
             "<s>hello</s> and the", "", " ", "tion ing ed", "\u0000\u0007 tab\tnew\nline",
             "a" * 70 + " the" * 30] + CORPUS[:400:4]


@pytest.mark.parametrize("scheme", ["first", "always", "never"])
@pytest.mark.parametrize("split", [True, False])
def test_sentencepiece_metaspace(lib, scheme, split):
    files = _spm_files(
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split})
    tok, nat = _check_against_both(lib, files, SPM_TEXTS)
    ref = tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))
    for s in SPM_TEXTS:
        ids = tok.encode(s)
        assert nat.decode(ids) == tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
        for cont in (False, True):
            assert nat.stream(ids, continuation=cont, chars=True) == \
                python_pieces(tok, ids, continuation=cont)
            assert nat.stream(ids, continuation=cont) == python_stream(tok, ids, continuation=cont)


def test_sentencepiece_replace_bytefallback_strip(lib):
    # Llama 2 / Mistral as rebuilt from a GGUF: Metaspace("first", no split), then a decoder that
    # replaces "▁", fuses byte-fallback runs and strips the first space.
    files = _spm_files(
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})
    tok, nat = _check_against_both(lib, files, SPM_TEXTS)
    ref = tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"]))
    rng = random.Random(5)
    for s in SPM_TEXTS:
        ids = tok.encode(s)
        assert nat.decode(ids) == tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
        assert nat.decode(ids, True) == tok.decode(ids, skip_special_tokens=True)
        for cont in (False, True):
            assert nat.stream(ids, continuation=cont, chars=True) == \
                python_pieces(tok, ids, continuation=cont)
            assert nat.stream(ids, continuation=cont) == python_stream(tok, ids, continuation=cont)
    for _ in range(300):        # random runs of byte tokens, valid UTF-8 or not
        ids = [rng.choice([rng.randrange(3, 259), rng.randrange(0, tok.vocab_size)])
               for _ in range(rng.randint(0, 10))]
        assert nat.decode(ids) == tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
        assert nat.stream(ids, chars=True) == python_pieces(tok, ids)
        assert nat.stream(ids) == python_stream(tok, ids)


def test_gemma_style_replace_and_string_split(lib):
    # Gemma's pipeline: Replace(" " -> "▁") normalizer, Split(" ", MergedWithPrevious).
    files = _spm_files({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                        "invert": False},
                       {"type": "Sequence", "decoders": [
                           {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                           {"type": "ByteFallback"}, {"type": "Fuse"}]},
                       {"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
    _check_against_both(lib, files, SPM_TEXTS)


@pytest.mark.parametrize("behavior", ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"])
@pytest.mark.parametrize("invert", [False, True])
def test_string_split_behaviors(lib, behavior, invert):
    # On text the normalizer leaves spaces in: every behavior's fold is exercised.
    files = _spm_files({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "e"},
         "behavior": behavior, "invert": invert},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True})
    _check_against_both(lib, files, SPM_TEXTS + ["eee", "e", "be ee bee", "abc"])


def test_nfc_prepend_normalizers_and_added_token_flags(lib):
    files = _variant("qwen2.5", top={"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Prepend", "prepend": "^"},
        {"type": "Replace", "pattern": {"String": "ab"}, "content": "X"}]}})
    added = files["tokenizer.json"]["added_tokens"]
    base = max(t["id"] for t in added) + 1
    added += [
        {"id": base, "content": "<L>", "lstrip": True, "rstrip": False, "single_word": False,
         "normalized": False, "special": True},
        {"id": base + 1, "content": "<R>", "lstrip": False, "rstrip": True, "single_word": False,
         "normalized": False, "special": False},
        {"id": base + 2, "content": "ẅörd", "lstrip": False, "rstrip": False, "single_word": True,
         "normalized": False, "special": False},
        {"id": base + 3, "content": "\u212b", "lstrip": False, "rstrip": False, "single_word": False,
         "normalized": True, "special": False},      # U+212B: matched as its NFC, U+00C5
        {"id": base + 4, "content": "<R> x", "lstrip": False, "rstrip": False, "single_word": False,
         "normalized": False, "special": False},
    ]
    texts = ["a <L> b", "a  \t<L>", "<R>   x<R>\u3000y", "ẅörd ẅörds sẅörd ẅörd.", "\u212b \u00c5 A\u030a ab",
             "<R> x <R>  x", "\u3000<L><L> <R>ẅörd", "xẅördy 1ẅörd2 éẅörd ẅörd"] + CORPUS[:300:3]
    _check_against_both(lib, files, texts)


# --- unsupported pipelines are refused, naming what ---------------------------------------------

@pytest.mark.parametrize("change, named", [
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+"}, "behavior": "Isolated",
                        "invert": False}}, r"\p{L}+|\s+"),
    ({"normalizer": {"type": "NFKC"}}, "NFKC"),
    ({"normalizer": {"type": "Lowercase"}}, "Lowercase"),
    ({"normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}}, " +"),
])
def test_unsupported_pipelines_raise(change, named):
    files = _variant("smollm2", top=change)
    if "pre_tokenizer" in change:   # keep it a byte-level tokenizer ignis loads
        files["tokenizer.json"]["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            change["pre_tokenizer"], {"type": "ByteLevel", "add_prefix_space": False,
                                      "trim_offsets": True, "use_regex": False}]}
    tok = load_tokenizer(files)
    with pytest.raises(UnsupportedTokenizerError, match="native") as e:
        tokenizer_section(tok)
    assert named in str(e.value)


# --- hostile blobs ------------------------------------------------------------------------------

HEADER = 8 + 4 * 14


def _section(blob: bytes, s: int) -> tuple[int, int]:
    return struct.unpack_from("<II", blob, HEADER + 8 * s)


def _patch(blob: bytes, at: int, fmt: str, *values) -> bytes:
    b = bytearray(blob)
    struct.pack_into(fmt, b, at, *values)
    return bytes(b)


@pytest.fixture(scope="module")
def tiny_blob() -> bytes:
    return tokenizer_section(Tokenizer(json.loads((DATA / "tiny-tokenizer.json").read_text()),
                                       json.loads((DATA / "tiny-tokenizer_config.json").read_text())))


def test_hostile_blobs_are_refused(lib, tiny_blob):
    blob = tiny_blob
    Native(lib, blob)                                       # the intact one opens
    cases = {
        "truncated": [blob[:n] for n in (0, 7, 8, 60, HEADER + 10, len(blob) // 2, len(blob) - 1)],
        "magic": [b"XXXXXXXX" + blob[8:]],
        "version": [_patch(blob, 8, "<I", 99)],
        "length": [_patch(blob, 12, "<I", len(blob) + 4)],
        "vocab_size": [_patch(blob, 16, "<I", 0), _patch(blob, 16, "<I", 1 << 30),
                       _patch(blob, 16, "<I", 100)],
        "bos out of range": [_patch(blob, 8 + 4 * 10, "<i", 10 ** 6)],
    }
    for s in range(14):
        off, size = _section(blob, s)
        cases.setdefault("section bounds", []).extend([
            _patch(blob, HEADER + 8 * s, "<II", len(blob) - 4, 64),
            _patch(blob, HEADER + 8 * s, "<II", 0xFFFFFFF0, 0x20),
            _patch(blob, HEADER + 8 * s, "<II", off + 1 if size else HEADER + 1, 4)])
    ends_off, _ = _section(blob, 1)
    merges_off, merges_len = _section(blob, 5)
    byte_off, _ = _section(blob, 4)
    raw_off, raw_len = _section(blob, 7)
    pre_off, _ = _section(blob, 10)
    cases["ids out of range"] = [
        _patch(blob, merges_off, "<i", 10 ** 6), _patch(blob, merges_off + 8, "<i", -7),
        _patch(blob, byte_off + 4 * 65, "<i", 10 ** 6),
        _patch(blob, raw_off + 8, "<I", 10 ** 6)]
    cases["offsets into the pool"] = [_patch(blob, ends_off + 4 * 5, "<I", 0xFFFFFF),
                                      _patch(blob, raw_off, "<I", 0xFFFFFFF)]
    cases["repeated merge"] = [_patch(blob, merges_off + 16, "<4i", *struct.unpack_from(
        "<4i", blob, merges_off))] if merges_len >= 32 else []
    cases["bad step"] = [_patch(blob, pre_off, "<I", 77), _patch(blob, pre_off + 4, "<I", 9)]
    for what, blobs in cases.items():
        for b in blobs:
            with pytest.raises(ValueError, match="tokenizer blob|bytes|magic|version"):
                Native(lib, b)
    for b in (None,):
        err = ctypes.create_string_buffer(64)
        assert not lib.ig_tok_open(b, 0, err, 64)


DRIVER = r"""
#include "tokenizer.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END); *n = (size_t)ftell(f); fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) exit(2);
    fclose(f);
    return b;
}

typedef struct { const ig_tok *t; char **texts; size_t *lens; int n; unsigned long sum; } job;

static unsigned long encode_all(const ig_tok *t, char **texts, size_t *lens, int n, FILE *out) {
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        for (int mode = 0; mode < 2; mode++) {
            int32_t *ids; size_t m;
            if (ig_tok_encode(t, texts[i], lens[i], mode, mode, &ids, &m)) { printf("encode failed\n"); exit(1); }
            for (size_t k = 0; k < m; k++) { sum = sum * 31 + (unsigned)ids[k]; if (out && mode) fprintf(out, "%d ", ids[k]); }
            if (out && mode) fprintf(out, "\n");
            char *text; size_t tl;
            if (ig_tok_decode(t, ids, m, mode, &text, &tl)) { printf("decode failed\n"); exit(1); }
            ig_tok_stream *s = ig_tok_stream_new(t, mode ? IG_TOK_STREAM_SKIP_SPECIAL | IG_TOK_STREAM_CHARS : 0);
            size_t got = 0; const char *p; size_t pl;
            for (size_t k = 0; k < m; k++) { ig_tok_stream_push(s, ids[k], &p, &pl); if (memcmp(text + got, p, pl)) exit(3); got += pl; }
            ig_tok_stream_finish(s, &p, &pl);
            if (memcmp(text + got, p, pl) || got + pl != tl) { printf("stream differs\n"); exit(1); }
            ig_tok_stream_free(s);
            ig_tok_release(text);
            ig_tok_release(ids);
        }
        uint32_t mask = 0xE000;
        const char *mask_text = "<|im_end|>";
        size_t mask_len = 10;
        int32_t *ids; size_t m;
        if (ig_tok_encode_masked(t, texts[i], lens[i], &mask, &mask_text, &mask_len, 1, &ids, &m)) { printf("masked failed\n"); exit(1); }
        ig_tok_release(ids);
    }
    return sum;
}

static void *run(void *arg) { job *j = arg; j->sum = encode_all(j->t, j->texts, j->lens, j->n, NULL); return NULL; }

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: tok_driver BLOB CORPUS IDS_OUT\n"); return 2; }
    size_t blen, clen;
    unsigned char *blob = slurp(argv[1], &blen), *corpus = slurp(argv[2], &clen);
    char *texts[4096]; size_t lens[4096]; int n = 0;
    for (size_t i = 0; i + 4 <= clen && n < 4096;) {     /* u32 length, then the text */
        uint32_t l; memcpy(&l, corpus + i, 4); i += 4;
        if (l > clen - i) return 2;
        texts[n] = (char *)corpus + i; lens[n++] = l; i += l;
    }
    char err[256];
    ig_tok *t = ig_tok_open(blob, blen, err, sizeof err);
    if (!t) { printf("open: %s\n", err); return 1; }
    FILE *out = fopen(argv[3], "w");
    unsigned long want = encode_all(t, texts, lens, n, out);
    fclose(out);
    /* concurrent encodes on one handle give what one thread gives */
    pthread_t th[4]; job jobs[4];
    for (int k = 0; k < 4; k++) { jobs[k] = (job){t, texts, lens, n, 0}; pthread_create(&th[k], NULL, run, &jobs[k]); }
    for (int k = 0; k < 4; k++) { pthread_join(th[k], NULL); if (jobs[k].sum != want) { printf("thread %d differs\n", k); return 1; } }
    /* random ids, invalid UTF-8 */
    srand(7);
    for (int r = 0; r < 2000; r++) {
        int32_t ids[16]; size_t m = (size_t)(rand() % 16);
        for (size_t k = 0; k < m; k++) ids[k] = rand() % (ig_tok_vocab_size(t) + 4) - 2;
        char *text; size_t tl;
        if (ig_tok_decode(t, ids, m, r & 1, &text, &tl) == 0) ig_tok_release(text);
        unsigned char junk[24];
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)rand();
        int32_t *e; size_t em;
        if (ig_tok_encode(t, (char *)junk, sizeof junk, 1, 1, &e, &em) == 0) ig_tok_release(e);
    }
    ig_tok_free(t);
    /* fuzzed blobs: open must refuse or give a handle that encodes without fault */
    int opened = 0, refused = 0;
    unsigned char *copy = malloc(blen);
    for (int r = 0; r < 3000; r++) {
        memcpy(copy, blob, blen);
        size_t len = blen;
        int flips = 1 + rand() % 4;
        for (int k = 0; k < flips; k++) {
            size_t at = (r % 3 == 0) ? (size_t)(rand() % 200) % blen : (size_t)rand() % blen;
            copy[at] = (unsigned char)rand();
        }
        if (r % 7 == 0) len = (size_t)rand() % blen;
        ig_tok *f = ig_tok_open(copy, len, err, sizeof err);
        if (!f) { refused++; continue; }
        opened++;
        for (int i = 0; i < n && i < 40; i++) {
            int32_t *ids; size_t m;
            if (ig_tok_encode(f, texts[i], lens[i], 1, 1, &ids, &m) == 0) {
                char *text; size_t tl;
                if (ig_tok_decode(f, ids, m, 0, &text, &tl) == 0) ig_tok_release(text);
                ig_tok_release(ids);
            }
        }
        ig_tok_free(f);
    }
    free(copy);
    printf("ok opened=%d refused=%d\n", opened, refused);
    free(blob); free(corpus);
    return 0;
}
"""


def _run_driver(tmp_path: Path, blob: bytes, texts: list[str], tok: Tokenizer) -> None:
    cc = _cc()
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run([cc, *sanitize, "-o", str(tmp_path / "probe"), str(probe)],
                      capture_output=True).returncode:
        missing_tool("cc cannot link -fsanitize=address,undefined (install libasan/libubsan): the "
                     "sanitizer run of the native tokenizer")
    src = tmp_path / "tok_driver.c"
    src.write_text(DRIVER)
    exe = tmp_path / "tok_driver"
    build = subprocess.run([cc, *FLAGS, "-O1", "-g", *sanitize, "-o", str(exe), str(src), str(SRC),
                            "-lpthread"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (tmp_path / "blob.bin").write_bytes(blob)
    (tmp_path / "corpus.bin").write_bytes(b"".join(
        struct.pack("<I", len(b)) + b for b in (t.encode("utf-8") for t in texts)))
    run = subprocess.run([str(exe), str(tmp_path / "blob.bin"), str(tmp_path / "corpus.bin"),
                          str(tmp_path / "ids.txt")], capture_output=True, text=True, timeout=900,
                         env={"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.startswith("ok"), run.stdout
    got = [list(map(int, line.split())) for line in (tmp_path / "ids.txt").read_text().splitlines()]
    assert got == [tok.encode(t) for t in texts]


def test_c_driver_under_sanitizers(tmp_path, tiny_blob):
    tok = Tokenizer(json.loads((DATA / "tiny-tokenizer.json").read_text()),
                    json.loads((DATA / "tiny-tokenizer_config.json").read_text()))
    texts = [t for t in CORPUS[::6] if len(t) < 3000][:300] + ["", "<|im_start|>user\nhi<|im_end|>"]
    _run_driver(tmp_path, tiny_blob, texts, tok)


def test_c_driver_under_sanitizers_sentencepiece(tmp_path):
    files = _spm_files(
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True})
    tok = load_tokenizer(files)
    _run_driver(tmp_path, tokenizer_section(tok), SPM_TEXTS, tok)


# --- Gemma 3 from its GGUF (slow) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_tok(gemma3_gguf):
    import gguf
    from ignis.tokenizer import tokenizer_files_from_gguf
    return load_tokenizer(tokenizer_files_from_gguf(gguf.GGUFReader(str(gemma3_gguf))))


@pytest.mark.model
@pytest.mark.slow
def test_gemma3_golden_corpus(lib, gemma_tok):
    golden = read_gz_json(DATA / "golden-gemma3.json.gz")
    nat = native_of(lib, gemma_tok)
    ids = golden["ids"]
    bad = []
    for i, s in enumerate(golden["corpus"]):
        want = ids["special"][i]
        if nat.encode(s) != want:
            bad.append(("special", s))
        if nat.encode(s, True, False) != ids["split_special"].get(str(i), want):
            bad.append(("split_special", s))
        if nat.encode(s, False, True) != ids["no_add_special"].get(str(i), want):
            bad.append(("no_add_special", s))
        if nat.encode(s, False, False) != gemma_tok.encode(s, False, True):
            bad.append(("neither", s))
        if nat.decode(want) != golden["decoded"][i]:
            bad.append(("decode", s))
        if i % 4 == 0 and (nat.stream(want) != python_stream(gemma_tok, want) or nat.stream(
                want, chars=True) != python_pieces(gemma_tok, want)):
            bad.append(("stream", s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]!r:.600}"


@pytest.mark.model
@pytest.mark.slow
@given(text=TEXT)
@SETTINGS
def test_gemma3_random_unicode(lib, gemma_tok, text):
    nat = native_of(lib, gemma_tok)
    assert nat.encode(text) == gemma_tok.encode(text)
    ids = gemma_tok.encode(text)
    assert nat.decode(ids) == gemma_tok.decode(ids)
    assert nat.stream(ids) == python_stream(gemma_tok, ids)


@pytest.mark.model
@pytest.mark.slow
def test_gemma3_masked_chat(lib, gemma_tok):
    # The GGUF carries no template: Gemma's turn markup, written here.
    template = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] | trim }}"
                "<end_of_turn>\n{% endfor %}<start_of_turn>model\n")
    nat = native_of(lib, gemma_tok)
    for messages in conversations(gemma_tok)[:30]:
        text, masks = masked_render(gemma_tok, messages, template)
        assert nat.encode_masked(text, masks) == gemma_tok.encode_chat(messages, chat_template=template)


@pytest.mark.model
@pytest.mark.slow
def test_gemma3_random_ids_decode(lib, gemma_tok):
    nat = native_of(lib, gemma_tok)
    rng = random.Random(3)
    byte_ids = [i for i in range(gemma_tok.vocab_size) if gemma_tok.is_byte_token(i)]
    for _ in range(500):
        ids = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(gemma_tok.vocab_size)
               for _ in range(rng.randint(0, 12))]
        ids = [i for i in ids if gemma_tok.has_token(i)]
        assert nat.decode(ids) == gemma_tok.decode(ids)
        assert nat.stream(ids, chars=True) == python_pieces(gemma_tok, ids)
        assert nat.stream(ids) == python_stream(gemma_tok, ids)
