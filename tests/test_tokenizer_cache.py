"""The compiled-tokenizer cache (ignis.tokenizer.compiled): a tokenizer loaded from the cache is the
tokenizer loaded from the JSON files (same tables, same ids as Hugging Face tokenizers), the cache is
written once and reused, a changed file is never served from a stale cache, and a damaged cache or
an unwritable IGNIS_HOME only costs a warning."""
from __future__ import annotations

import json
import os
import shutil
import warnings
import zlib
from array import array
from pathlib import Path
from typing import Callable

import pytest
import tokenizers

from ignis.tokenizer import Tokenizer, load_tokenizer
from ignis.tokenizer import compiled
from ignis.tokenizer import tokenizer as tokenizer_module

from test_tokenizer_support import DATA, FAMILIES, committed_files, read_gz_json

GOLDEN = read_gz_json(DATA / "golden.json.gz")
CORPUS: list[str] = GOLDEN["corpus"]
SAMPLE = CORPUS[::7]                 # ~300 varied strings: scripts, emoji, code, specials, controls


# --- helpers ------------------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private IGNIS_HOME per test, so cache files can be counted."""
    h = tmp_path / "home"
    monkeypatch.setenv("IGNIS_HOME", str(h))
    return h


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DATA / f"tiny-{name}", d / name)
    return d


@pytest.fixture
def json_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the tokenizer files parsed from JSON since the test began: a load served by the
    cache never parses tokenizer.json."""
    seen: list[str] = []
    real = tokenizer_module._read_json

    def spy(path: Path, *, required: bool):
        seen.append(path.name)
        return real(path, required=required)
    monkeypatch.setattr(tokenizer_module, "_read_json", spy)
    return seen


def cache_files(home: Path) -> list[Path]:
    d = home / "tokenizers"
    return sorted(d.iterdir()) if d.is_dir() else []


def load_quietly(directory: Path, **kw) -> Tokenizer:
    """load_tokenizer that fails the test on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_tokenizer(directory, **kw)


def assert_same_tokenizer(got: Tokenizer, want: Tokenizer, texts: list[str]) -> None:
    """Every table, and encode/decode of texts in every mode, equal."""
    # id by id first: a cached tokenizer answers these before (or without) its id -> text table
    for i in range(-2, want.vocab_size + 3):
        assert got.id_to_token(i) == want.id_to_token(i), i
    assert got.model.vocab == want.model.vocab
    assert list(got.model.vocab) == list(want.model.vocab)
    assert got.model.id_to_token == want.model.id_to_token
    assert got.model.ranks == want.model.ranks
    assert got.model.byte_ids == want.model.byte_ids
    assert got.model.ignore_merges == want.model.ignore_merges
    assert got._id_to_token == want._id_to_token
    assert got._token_to_id == want._token_to_id
    assert got._bytes == want._bytes
    assert got.added_tokens == want.added_tokens
    assert got.special_ids == want.special_ids
    assert (got._prefix, got._suffix) == (want._prefix, want._suffix)
    assert got.config == want.config
    assert (got.bos_token_id, got.eos_token_id, got.pad_token_id) == \
        (want.bos_token_id, want.eos_token_id, want.pad_token_id)
    assert got.vocab_size == want.vocab_size
    for text in texts:
        for kw in ({}, {"split_special_tokens": True}, {"add_special_tokens": False}):
            ids = want.encode(text, **kw)
            assert got.encode(text, **kw) == ids, (text, kw)
        assert got.decode(ids) == want.decode(ids)
        assert got.decode(ids, skip_special_tokens=True) == want.decode(ids, skip_special_tokens=True)


def write_files(directory: Path, files: dict[str, dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content), encoding="utf-8")
    return directory


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def repack(path: Path, edit_header: Callable[[dict], None]) -> None:
    """Rewrite a cache file with an edited header and a valid checksum: damage that only the
    count and consistency checks can catch."""
    data = path.read_bytes()
    magic, version, header_len, _ = compiled._PREFIX.unpack_from(data)
    body = data[compiled._PREFIX.size:]
    header = json.loads(body[:header_len])
    edit_header(header)
    head = json.dumps(header).encode()
    head += b" " * (-(len(head) + compiled._PREFIX.size) % 8)
    new_body = head + body[header_len:]
    path.write_bytes(compiled._PREFIX.pack(magic, version, len(head), zlib.crc32(new_body)) + new_body)


# --- a cached load is the same tokenizer ---------------------------------------------------------

def test_cached_load_equals_uncached_load_and_tokenizers(home, tiny_dir, json_reads):
    want = load_tokenizer(tiny_dir, cache=False)
    assert cache_files(home) == []
    first = load_quietly(tiny_dir)                 # builds from JSON, writes the cache
    assert json_reads.count("tokenizer.json") == 2
    second = load_quietly(tiny_dir)                # from the cache
    assert json_reads.count("tokenizer.json") == 2
    assert_same_tokenizer(first, want, SAMPLE)
    assert_same_tokenizer(second, want, SAMPLE)
    ref = tokenizers.Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    for text in SAMPLE:
        assert second.encode(text) == ref.encode(text).ids, text
    assert second.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        want.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("family", FAMILIES)
def test_registry_tokenizers_through_the_cache_give_the_golden_ids(home, tmp_path, json_reads, family):
    # The committed Qwen2.5 / SmolLM2 files are the real 150k / 49k vocabularies; the golden ids
    # are Hugging Face tokenizers' (test_tokenizer.py keeps them honest).
    directory = write_files(tmp_path / family, committed_files(family))
    want = load_tokenizer(directory, cache=False)
    load_quietly(directory)
    cached = load_quietly(directory)
    assert json_reads.count("tokenizer.json") == 2      # the uncached load and the first one
    assert_same_tokenizer(cached, want, SAMPLE[:60])
    ids = GOLDEN["ids"][family]
    for i, text in enumerate(CORPUS):
        assert cached.encode(text) == ids["special"][i], text
        assert cached.encode(text, add_special_tokens=False) == \
            ids["no_add_special"].get(str(i), ids["special"][i]), text


def test_pure_python_backend_from_the_cache(home, tiny_dir):
    load_quietly(tiny_dir)
    cached = load_quietly(tiny_dir, backend="ref")
    want = load_tokenizer(tiny_dir, cache=False, backend="ref")
    assert cached.model.backend == "ref"
    assert_same_tokenizer(cached, want, SAMPLE[:80])


@pytest.mark.parametrize("variant", ["string_merges_with_a_duplicate", "two_tokens_share_an_id"])
def test_unusual_layouts_round_trip(home, tiny_dir, variant):
    # Old "a b" merges with a pair listed twice (the later rank wins, so ranks have a gap), and a
    # vocabulary that spells one id twice (the text -> id table cannot be copied from the vocab).
    def edit(j: dict) -> None:
        model = j["model"]
        if variant == "string_merges_with_a_duplicate":
            model["merges"] = [" ".join(m) for m in model["merges"]]
            model["merges"].append(model["merges"][1])
        else:
            model["vocab"]["zz-alias"] = model["vocab"]["at"]
    edit_json(tiny_dir / "tokenizer.json", edit)
    want = load_tokenizer(tiny_dir, cache=False)
    load_quietly(tiny_dir)
    cached = load_quietly(tiny_dir)
    assert_same_tokenizer(cached, want, SAMPLE[:80])
    if variant == "string_merges_with_a_duplicate":
        ref = tokenizers.Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
        for text in SAMPLE[:80]:
            assert cached.encode(text) == ref.encode(text).ids, text


def test_cached_byte_table_is_the_fresh_list_entry_by_entry(home, tiny_dir):
    # A cached load keeps its id -> bytes table in one blob and cuts entries on use.
    want = load_tokenizer(tiny_dir, cache=False)
    load_quietly(tiny_dir)
    got = load_quietly(tiny_dir)
    assert isinstance(got._bytes, compiled.TokenBytes) and isinstance(want._bytes, list)
    table, n = got._bytes, len(want._bytes)
    assert len(table) == n and got.vocab_size == want.vocab_size
    assert [table[i] for i in range(n)] == want._bytes         # cut one by one, before any list
    assert table._list is None
    assert table[-1] == want._bytes[-1] and table[-n] == want._bytes[0]
    assert table[3:40] == want._bytes[3:40] and list(table) == want._bytes
    assert (None in table) == (None in want._bytes)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            table[bad]
    for size in (0, 5, n, n + 7):
        assert got.token_mask(size) == want.token_mask(size)
    assert [got.has_token(i) for i in range(-2, n + 3)] == [want.has_token(i) for i in range(-2, n + 3)]


def test_a_cached_load_builds_the_id_to_text_table_only_when_asked(home, tiny_dir):
    want = load_tokenizer(tiny_dir, cache=False)
    load_quietly(tiny_dir)
    got = load_quietly(tiny_dir)
    for text in SAMPLE[:40]:
        ids = got.encode(text)
        assert ids == want.encode(text) and got.decode(ids) == want.decode(ids)
    assert got._id_table is None and got.model._id_to_token is None
    assert [got.id_to_token(i) for i in range(-1, want.vocab_size + 1)] == \
        [want.id_to_token(i) for i in range(-1, want.vocab_size + 1)]
    assert got._id_table is None and got.model._id_to_token is None       # still not built
    assert got._id_to_token == want._id_to_token and got.model.id_to_token == want.model.id_to_token


def test_byte_table_with_holes_from_the_cache(home, tiny_dir):
    # ids without a token (a vocabulary with a gap) are None in the cached table and masked
    def edit(j: dict) -> None:
        top = max([*j["model"]["vocab"].values(), *(t["id"] for t in j.get("added_tokens") or [])])
        j["added_tokens"] = [*(j.get("added_tokens") or []),
                             {"id": top + 5, "content": "<|gap|>", "special": True}]
    edit_json(tiny_dir / "tokenizer.json", edit)
    want = load_tokenizer(tiny_dir, cache=False)
    assert None in want._bytes
    load_quietly(tiny_dir)
    got = load_quietly(tiny_dir)
    holes = [i for i, b in enumerate(want._bytes) if b is None]
    assert all(got._bytes[i] is None for i in holes) and not any(got.has_token(i) for i in holes)
    assert got.token_mask(len(want._bytes) + 2) == want.token_mask(len(want._bytes) + 2)
    assert_same_tokenizer(got, want, SAMPLE[:40])


# --- written once, reused, never stale -----------------------------------------------------------

def test_cache_file_is_written_once_and_reused(home, tiny_dir, json_reads):
    load_quietly(tiny_dir)
    files = cache_files(home)
    assert len(files) == 1 and files[0].suffix == ".bin"
    before = files[0].stat()
    for _ in range(3):
        load_quietly(tiny_dir)
    assert cache_files(home) == files
    after = files[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json_reads.count("tokenizer.json") == 1


def test_touched_tokenizer_json_is_rebuilt(home, tiny_dir, json_reads):
    load_quietly(tiny_dir)
    old = cache_files(home)
    bump_mtime(tiny_dir / "tokenizer.json")
    tok = load_quietly(tiny_dir)
    assert json_reads.count("tokenizer.json") == 2
    new = cache_files(home)
    assert len(new) == 1 and new != old          # the stale file is replaced, not kept beside
    assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:40])


def test_changed_tokenizer_json_is_not_served_from_the_stale_cache(home, tiny_dir):
    old = load_quietly(tiny_dir)
    assert old.encode("<|im_begin|>") != [257]

    def rename(j: dict) -> None:
        j["added_tokens"][1]["content"] = "<|im_begin|>"
        j["model"]["merges"] = j["model"]["merges"][:-3]
    edit_json(tiny_dir / "tokenizer.json", rename)
    bump_mtime(tiny_dir / "tokenizer.json")      # a coarse-mtime filesystem could keep the old one
    for _ in range(2):                           # the rebuild, then the new cache file
        tok = load_quietly(tiny_dir)
        assert tok.encode("<|im_begin|>") == [257]
        assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:80])
        ref = tokenizers.Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
        for text in SAMPLE[:80]:
            assert tok.encode(text) == ref.encode(text).ids, text
    assert len(cache_files(home)) == 1


def test_changed_or_removed_tokenizer_config_is_not_served_stale(home, tiny_dir):
    assert load_quietly(tiny_dir).eos_token_id == 258
    edit_json(tiny_dir / "tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>"))
    bump_mtime(tiny_dir / "tokenizer_config.json")
    assert load_quietly(tiny_dir).eos_token_id == 256
    (tiny_dir / "tokenizer_config.json").unlink()
    tok = load_quietly(tiny_dir)
    assert tok.eos_token_id is None and tok.chat_template is None
    assert len(cache_files(home)) == 1


def test_two_model_dirs_keep_their_own_cache_files(home, tiny_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    edit_json(other / "tokenizer.json", lambda j: j["added_tokens"][0].update(content="<|eot|>"))
    a, b = load_quietly(tiny_dir), load_quietly(other)
    assert len(cache_files(home)) == 2
    assert load_quietly(tiny_dir).encode("<|eot|>") == a.encode("<|eot|>") != [256]
    assert load_quietly(other).encode("<|eot|>") == b.encode("<|eot|>") == [256]


def test_in_memory_files_and_cache_false_are_never_cached(home, tiny_dir, json_reads):
    files = {name: json.loads((tiny_dir / name).read_text()) for name in
             ("tokenizer.json", "tokenizer_config.json")}
    load_quietly(files)
    load_quietly(tiny_dir, cache=False)
    assert cache_files(home) == []
    load_quietly(tiny_dir)
    load_quietly(tiny_dir, cache=False)
    assert json_reads.count("tokenizer.json") == 3  # cache=False parses even with a cache present


def test_missing_or_broken_tokenizer_json_reports_as_before(home, tmp_path):
    from ignis.tokenizer import TokenizerFormatError
    with pytest.raises(TokenizerFormatError, match="tokenizer.json not found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    (tmp_path / "tokenizer_config.json").write_text("{also not json")
    with pytest.raises(TokenizerFormatError, match="tokenizer.json is not valid JSON"):
        load_tokenizer(tmp_path)
    assert cache_files(home) == []


# --- damaged caches and unwritable homes ---------------------------------------------------------

def _flip_middle_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))


def _flip_in_section(name: str, bit: int) -> Callable[[Path], None]:
    """Flip one bit inside a section: every size still adds up, only the checksum can tell."""
    def flip(p: Path) -> None:
        data = bytearray(p.read_bytes())
        _, _, header_len, _ = compiled._PREFIX.unpack_from(data)
        payload = compiled._PREFIX.size + header_len
        start, size = json.loads(data[compiled._PREFIX.size:payload])["sections"][name]
        data[payload + start + size // 2] ^= bit
        p.write_bytes(bytes(data))
    return flip


def _edit_ends(edit: Callable[[array], None], section: str = "bytes_ends") -> Callable[[Path], None]:
    """Edit an integer section (the byte offsets) and write a valid checksum: only the checks of
    what the integers mean can tell."""
    def damage(p: Path) -> None:
        data = bytearray(p.read_bytes())
        _, _, header_len, _ = compiled._PREFIX.unpack_from(data)
        payload = compiled._PREFIX.size + header_len
        start, size = json.loads(data[compiled._PREFIX.size:payload])["sections"][section]
        ends = array("i", bytes(data[payload + start:payload + start + size]))
        edit(ends)
        data[payload + start:payload + start + size] = ends.tobytes()
        body = bytes(data[compiled._PREFIX.size:])
        compiled._PREFIX.pack_into(data, 0, *compiled._PREFIX.unpack_from(data)[:3], zlib.crc32(body))
        p.write_bytes(bytes(data))
    return damage


def _swap(a: array, i: int, j: int) -> None:
    a[i], a[j] = a[j], a[i]


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "byte_offsets_out_of_order": _edit_ends(lambda e: _swap(e, 100, 200)),
    # two tokens with one id: an id below the table's end has no token, yet is not a hole
    "an_id_without_token_or_hole": _edit_ends(lambda e: e.__setitem__(10, e[11]), "vocab_ids"),
    "byte_offsets_past_the_blob": _edit_ends(lambda e: e.__setitem__(len(e) - 1, e[-1] + 5)),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "flipped_byte": _flip_middle_byte,
    "flipped_bit_in_token_bytes": _flip_in_section("bytes_blob", 0x01),
    "flipped_bit_in_merge_ids": _flip_in_section("merge_new", 0x01),
    "garbage": lambda p: p.write_bytes(b"not a cache file " * 100),
    "bad_magic": lambda p: p.write_bytes(b"XXXXXXXX" + p.read_bytes()[8:]),
    "other_format_version": lambda p: p.write_bytes(
        p.read_bytes()[:8] + (compiled.FORMAT_VERSION + 1).to_bytes(4, "little") + p.read_bytes()[12:]),
    # Valid checksums (random damage never gets past the CRC-32), contents that do not add up:
    "vocab_count": lambda p: repack(p, lambda h: h["counts"].update(vocab=h["counts"]["vocab"] + 1)),
    "merge_count": lambda p: repack(p, lambda h: h["counts"].update(merges=h["counts"]["merges"] - 1)),
    "section_outside_file": lambda p: repack(p, lambda h: h["sections"]["merge_new"].__setitem__(0, 1 << 40)),
    "other_key": lambda p: repack(p, lambda h: h.update(key="0" * 32)),
    "spec_with_ids_the_tables_lack": lambda p: repack(p, lambda h: h["spec"]["added_tokens"].append(
        {"id": 300, "content": "<|new|>", "special": True})),
    "spec_not_a_tokenizer": lambda p: repack(p, lambda h: h["spec"]["model"].update(type="WordPiece")),
    "header_nested_too_deep": lambda p: p.write_bytes(compiled.pack_cache_file(
        compiled.MAGIC, compiled.FORMAT_VERSION, b"[" * 200_000 + b"]" * 200_000, b"")),
    "header_not_an_object": lambda p: p.write_bytes(compiled.pack_cache_file(
        compiled.MAGIC, compiled.FORMAT_VERSION, b"[1, 2]", b"")),
    "sections_not_an_object": lambda p: repack(p, lambda h: h.update(sections=[1, 2])),
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_damaged_cache_falls_back_with_a_warning_and_exact_ids(home, tiny_dir, json_reads, damage):
    want = load_tokenizer(tiny_dir, cache=False)
    load_quietly(tiny_dir)
    (path,) = cache_files(home)
    CORRUPTIONS[damage](path)
    with pytest.warns(RuntimeWarning, match="tokenizer cache"):
        tok = load_tokenizer(tiny_dir)
    assert_same_tokenizer(tok, want, SAMPLE[:80])
    # The damaged file was replaced by a good one: the next load is quiet and served by it.
    reads = json_reads.count("tokenizer.json")
    assert_same_tokenizer(load_quietly(tiny_dir), want, SAMPLE[:20])
    assert json_reads.count("tokenizer.json") == reads
    assert cache_files(home) == [path]


def test_ignis_home_that_is_a_file_only_warns(tmp_path, tiny_dir, monkeypatch):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("IGNIS_HOME", str(blocker))
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="could not store the tokenizer cache"):
            tok = load_tokenizer(tiny_dir)
        assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:20])


def test_failed_rename_warns_and_leaves_no_temp_file(home, tiny_dir, monkeypatch):
    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(compiled.os, "replace", refuse)
    with pytest.warns(RuntimeWarning, match="could not store the tokenizer cache"):
        tok = load_tokenizer(tiny_dir)
    assert cache_files(home) == []              # the temp file was removed, nothing half-written
    assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:20])


def test_unreadable_cache_file_warns_and_is_bypassed(home, tiny_dir, monkeypatch):
    load_quietly(tiny_dir)
    real = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self.parent == home / "tokenizers":
            raise PermissionError(13, "Permission denied")
        return real(self)
    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.warns(RuntimeWarning, match="unreadable tokenizer cache"):
        tok = load_tokenizer(tiny_dir)
    assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:20])


def test_tokenizer_whose_tables_cannot_be_stored_is_only_a_warning(home, tiny_dir):
    # A token holding every character the vocabulary text could be joined with.
    edit_json(tiny_dir / "tokenizer.json",
              lambda j: j["model"]["vocab"].update({compiled._SEPARATORS: 272}))
    with pytest.warns(RuntimeWarning, match="cannot cache this tokenizer"):
        tok = load_tokenizer(tiny_dir)
    assert cache_files(home) == []
    assert tok.token_to_id(compiled._SEPARATORS) == 272
    assert_same_tokenizer(tok, load_tokenizer(tiny_dir, cache=False), SAMPLE[:20])


# --- the real model directory --------------------------------------------------------------------

@pytest.mark.model
@pytest.mark.slow
def test_real_qwen_model_dir_cached_equals_uncached(default_model_dir, home, json_reads):
    want = load_tokenizer(default_model_dir, cache=False)
    load_quietly(default_model_dir)
    cached = load_quietly(default_model_dir)
    assert json_reads.count("tokenizer.json") == 2
    assert_same_tokenizer(cached, want, SAMPLE[:60])
    ids = GOLDEN["ids"]["qwen2.5"]["special"]
    for i in range(0, len(CORPUS), 3):
        assert cached.encode(CORPUS[i]) == ids[i], CORPUS[i]
