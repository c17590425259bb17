"""The BPE model of a byte-level tokenizer: vocabulary, ranked merges, and the word -> ids step.

The merge loop runs in C (ignis._core.BPEMerger, from ignis/_bpe.pxi); bpe_word_ref is its plain
Python twin, used by the tests to check the compiled one.

A BPEModel is built either from tokenizer.json's model section (parsing and checking every merge)
or, much faster, from the tables a previous build produced (MergeTable plus the vocabulary as two
lists), which is what the compiled-tokenizer cache (ignis.tokenizer.compiled) stores.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, Iterable, Sequence

from ignis.tokenizer.bytelevel import BYTE_TO_CHAR, bytes_to_alphabet
from ignis.tokenizer.errors import TokenizerFormatError, UnsupportedTokenizerError


def _load_merger_class() -> Any:
    try:
        from ignis._core import BPEMerger
    except ImportError as exc:  # the extension is not built, or was built without _bpe.pxi
        raise ImportError(
            "ignis._core.BPEMerger is missing: build the extension (python setup.py build_ext "
            "--inplace, or pip install .) with ignis/_bpe.pxi included in ignis/_core.pyx") from exc
    return BPEMerger


def bpe_word_ref(ids: list[int], ranks: dict[tuple[int, int], tuple[int, int]]) -> list[int]:
    """Merge one word's ids: lowest-ranked adjacent pair first, leftmost on ties, until none merges.

    ranks maps (left_id, right_id) -> (rank, merged_id). Quadratic; the reference for BPEMerger.
    """
    ids = list(ids)
    while len(ids) > 1:
        best = None
        for i in range(len(ids) - 1):
            hit = ranks.get((ids[i], ids[i + 1]))
            if hit is not None and (best is None or hit[0] < best[0]):
                best = (hit[0], i, hit[1])
        if best is None:
            break
        _, i, merged = best
        ids[i:i + 2] = [merged]
    return ids


@dataclass(frozen=True)
class MergeTable:
    """The checked merges as id columns, one row per distinct pair, in rank order.

    rank is the merge's index in tokenizer.json (a pair listed twice keeps its later index, as
    tokenizers' HashMap build does), so ranks are increasing but may have gaps. Columns are lists
    when parsed from JSON and compact array('i') when read from the cache.
    """
    left: Sequence[int]
    right: Sequence[int]
    new: Sequence[int]
    rank: Sequence[int]

    def __len__(self) -> int:
        return len(self.rank)

    def ranks(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(left_id, right_id) -> (rank, merged_id), the form bpe_word_ref takes."""
        return dict(zip(zip(self.left, self.right), zip(self.rank, self.new)))


class MergeModel:
    """What every Hugging Face "BPE" model section shares: read vocab and merges (or take the tables
    a previous build made), then a subclass's _setup (vocabulary rules) and _build_merger."""

    _check_options = staticmethod(lambda model, path: None)    # a subclass's option checks

    def __init__(self, model: dict[str, Any], *, path: str | None = None, backend: str = "core"):
        self._check_options(model, path)
        vocab = model.get("vocab")
        merges = model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(merges, list):
            raise TokenizerFormatError("BPE model needs a 'vocab' object and a 'merges' list",
                                       path=path)
        _check_vocab_ids(vocab, path)
        # Inverted: an id given to several tokens keeps the last one.
        self._setup(model, vocab, dict(zip(vocab.values(), vocab.keys())), path=path)
        self.merge_table = _parse_merges(merges, vocab, path)
        self._build_merger(backend)

    @classmethod
    def from_tables(cls, model: dict[str, Any], tokens: list[str], ids: list[int],
                    merge_table: MergeTable, *, path: str | None = None, backend: str = "core"):
        """The model a previous build made from the same tokenizer.json: `model` is its model
        section without vocab and merges, tokens/ids the vocabulary in file order, merge_table
        that build's merge_table. The per-merge checks are not repeated (they passed then)."""
        self = cls.__new__(cls)
        self._check_options(model, path)
        self._table_vocab = (ids, tokens)           # id_to_token is built from them on first use
        self._setup(model, dict(zip(tokens, ids)), None, path=path)
        self.merge_table = merge_table
        self._build_merger(backend)
        return self

    def _setup(self, model: dict[str, Any], vocab: dict[str, int],
               id_to_token: dict[int, str] | None, *, path: str | None) -> None:
        raise NotImplementedError

    @property
    def id_to_token(self) -> dict[int, str]:
        """id -> token (an id given to several tokens keeps the last). Loaded from tables, built
        on first use: encoding and decoding read other tables."""
        if self._id_to_token is None:
            ids, tokens = self._table_vocab
            self._id_to_token = dict(zip(ids, tokens))
        return self._id_to_token

    def token_of(self, token_id: int) -> str | None:
        """id_to_token.get(token_id), without building that table when the stored vocabulary
        lists the ids 0..n-1 in order (as tokenizer.json files do): decoding one id reads one."""
        if self._id_to_token is None and type(token_id) is int and self._ids_in_order():
            tokens = self._table_vocab[1]
            return tokens[token_id] if 0 <= token_id < len(tokens) else None
        return self.id_to_token.get(token_id)

    def _ids_in_order(self) -> bool:
        in_order = getattr(self, "_in_order", None)
        if in_order is None:
            import numpy as np
            ids = np.asarray(self._table_vocab[0], np.int64).reshape(-1)
            in_order = self._in_order = bool(np.array_equal(ids, np.arange(ids.size)))
        return in_order

    def _build_merger(self, backend: str) -> None:
        raise NotImplementedError


class BPEModel(MergeModel):
    """Vocabulary and merges of a Hugging Face "BPE" model section, for byte-level input."""

    @staticmethod
    def _check_options(model: dict[str, Any], path: str | None) -> None:
        _check_options(model, path)             # this module's option rules

    def _setup(self, model: dict[str, Any], vocab: dict[str, int],
               id_to_token: dict[int, str] | None, *, path: str | None) -> None:
        """Vocabulary, unk_token and the byte tokens (shared by both ways of building)."""
        self._ranks: dict[tuple[int, int], tuple[int, int]] | None = None
        self.vocab: dict[str, int] = vocab
        self._id_to_token = id_to_token
        self.ignore_merges = bool(model.get("ignore_merges", False))
        unk = model.get("unk_token")
        unk_id = vocab.get(unk) if unk is not None else None
        if unk is not None and unk_id is None:
            raise TokenizerFormatError(f"unk_token {unk!r} is not in the vocabulary", path=path)
        if unk_id is not None and model.get("fuse_unk"):
            raise UnsupportedTokenizerError("BPE fuse_unk=true is not supported", path=path)
        if sum(c in vocab for c in BYTE_TO_CHAR) < 128:
            raise UnsupportedTokenizerError(
                "vocabulary lacks most of the 256 byte tokens, so it is not a byte-level BPE "
                "vocabulary", path=path)
        # A byte without a token becomes unk_token, or is dropped when there is none: tokenizers
        # skips characters it cannot look up (SmolLM2 has no token for e.g. 0x04 or 0xF1).
        missing = -1 if unk_id is None else unk_id
        self.byte_ids: list[int] = [vocab.get(c, missing) for c in BYTE_TO_CHAR]

    def _build_merger(self, backend: str) -> None:
        self.backend = backend
        if backend == "core":
            t = self.merge_table
            if all(isinstance(c, array) and c.typecode == "i" and c.itemsize == 4
                   for c in (t.left, t.right, t.new)):
                # a cached tokenizer's int32 columns, read in C (no tuple per merge)
                self._merger = _load_merger_class()(self.byte_ids, columns=(t.left, t.right, t.new))
            else:
                self._merger = _load_merger_class()(self.byte_ids, list(zip(t.left, t.right, t.new)))
        elif backend != "ref":
            raise ValueError(f"backend must be 'core' or 'ref', not {backend!r}")
        self._cache: dict[str, tuple[int, ...]] = {}

    @property
    def ranks(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(left_id, right_id) -> (rank, merged_id); built on first use when loaded from tables
        (only the pure-Python backend and the tests need it)."""
        if self._ranks is None:
            self._ranks = self.merge_table.ranks()
        return self._ranks

    def encode_words(self, words: Iterable[str], out: list[int]) -> list[int]:
        """Append the ids of each pre-token (plain text; bytes are mapped here) to out."""
        if self.ignore_merges:
            return self._encode_words_ignore_merges(words, out)
        if self.backend == "core":
            return self._merger.encode_words(words if isinstance(words, list) else list(words),
                                             self._cache, out)
        for w in words:
            out.extend(self.encode_word_ref(w))
        return out

    def _encode_words_ignore_merges(self, words: Iterable[str], out: list[int]) -> list[int]:
        # tokenizers' ignore_merges: a pre-token that is itself a vocabulary entry is taken whole.
        for w in words:
            whole = self.vocab.get(bytes_to_alphabet(w.encode("utf-8")))
            if whole is not None:
                out.append(whole)
            elif self.backend == "core":
                out.extend(self._merger.encode_word(w))
            else:
                out.extend(self.encode_word_ref(w))
        return out

    def encode_word_ref(self, word: str) -> list[int]:
        """Pure-Python ids of one pre-token (the twin of BPEMerger.encode_word)."""
        ids = [self.byte_ids[b] for b in word.encode("utf-8")]
        return bpe_word_ref([i for i in ids if i >= 0], self.ranks)


def _check_options(model: dict[str, Any], path: str | None) -> None:
    for key, ok in (("dropout", (None,)), ("continuing_subword_prefix", (None, "")),
                    ("end_of_word_suffix", (None, "")), ("byte_fallback", (None, False))):
        if model.get(key) not in ok:
            raise UnsupportedTokenizerError(
                f"BPE option {key}={model.get(key)!r} is not supported by ignis's byte-level BPE",
                path=path)


def _parse_merges(merges: list[Any], vocab: dict[str, int], path: str | None) -> MergeTable:
    """The merges as id columns, checked against the vocabulary.

    A later duplicate of a pair overrides the earlier one, as tokenizers' HashMap build does. This
    runs ~150k times per load, so the usual layouts (all ["a", "b"] lists, or all "a b" strings)
    go through C-level maps; anything else, or any failed check, takes the per-merge loop, which
    reports the first bad merge.
    """
    pairs = _uniform_pairs(merges)
    if pairs is not None:
        firsts, seconds = pairs
        get = vocab.get
        try:
            # str.__add__ raises TypeError unless both halves are str, as _merge_pair requires.
            new = list(map(get, map(str.__add__, firsts, seconds)))
            left = list(map(get, firsts))
            right = list(map(get, seconds))
        except TypeError:
            pass
        else:
            n = len(new)
            # Distinct merged tokens imply distinct pairs; else count the pairs themselves.
            if None not in left and None not in right and None not in new and \
                    (len(set(new)) == n or len(set(zip(left, right))) == n):
                # No pair listed twice: the merges are the table, already in rank order.
                return MergeTable(left, right, new, range(n))
    return _merge_table(_merge_ranks(merges, vocab, path))


def _uniform_pairs(merges: list[Any]) -> tuple[list[Any], list[Any]] | None:
    """(first halves, second halves) when every merge is a list of two items, or every merge is a
    str with exactly one space; else None."""
    kinds = set(map(type, merges))
    if kinds == {str}:
        merges = list(map(str.split, merges, repeat(" ")))
    elif kinds != {list}:
        return None
    if set(map(len, merges)) != {2}:
        return None
    return list(map(itemgetter(0), merges)), list(map(itemgetter(1), merges))


# Far past any real vocabulary (Gemma 3: 262,144), small enough for the id tables and int32 ids.
MAX_TOKEN_ID = 2**24 - 1


def _check_vocab_ids(vocab: dict[str, Any], path: str | None) -> None:
    """Every id is an int in 0..MAX_TOKEN_ID (checked in C-level passes; the loop names the first
    bad one)."""
    ids = vocab.values()
    if (all(map(isinstance, ids, repeat(int))) and min(ids, default=0) >= 0
            and max(ids, default=0) <= MAX_TOKEN_ID):
        return
    for tok, tid in vocab.items():
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid <= MAX_TOKEN_ID:
            raise TokenizerFormatError(f"vocab entry {tok!r:.60} has id {tid!r:.30}, not an "
                                       f"integer in 0..{MAX_TOKEN_ID}", path=path)


def _merge_ranks(merges: list[Any], vocab: dict[str, int],
                 path: str | None) -> dict[tuple[int, int], tuple[int, int]]:
    """(left_id, right_id) -> (rank, merged_id), one merge at a time; raises on the first bad one."""
    ranks: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, merge in enumerate(merges):
        pair = _merge_pair(merge)
        if pair is None:
            raise TokenizerFormatError(f"merge {rank} ({merge!r}) is not a pair of tokens",
                                       path=path)
        a, b = pair
        ab = a + b
        if a not in vocab or b not in vocab or ab not in vocab:
            unknown = next(t for t in (a, b, ab) if t not in vocab)
            raise TokenizerFormatError(
                f"merge {rank} ({a!r} + {b!r}) refers to token {unknown!r}, which is not in the "
                f"vocabulary", path=path)
        ranks[(vocab[a], vocab[b])] = (rank, vocab[ab])
    return ranks


def _merge_table(ranks: dict[tuple[int, int], tuple[int, int]]) -> MergeTable:
    """ranks as columns in rank order."""
    left, right, rank, new = [], [], [], []
    for (a, b), (r, n) in sorted(ranks.items(), key=lambda kv: kv[1][0]):
        left.append(a)
        right.append(b)
        rank.append(r)
        new.append(n)
    return MergeTable(left, right, new, rank)


def _merge_pair(merge: Any) -> tuple[str, str] | None:
    # tokenizers writes merges as "a b" (older files) or ["a", "b"] (newer files).
    if isinstance(merge, str):
        parts = merge.split(" ")
        return (parts[0], parts[1]) if len(parts) == 2 else None
    if isinstance(merge, list) and len(merge) == 2 and all(isinstance(p, str) for p in merge):
        return merge[0], merge[1]
    return None
