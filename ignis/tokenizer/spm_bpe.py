"""The BPE model of SentencePiece-style tokenizers (Gemma, Llama 2, Mistral, TinyLlama): BPE over
characters with byte fallback, as Hugging Face tokenizers runs a "BPE" model whose text is not
mapped to the byte alphabet.

A word starts as one symbol per character (tokenizers' BPE::merge_word): the character's token;
else, with byte_fallback, the tokens "<0xNN>" of its UTF-8 bytes (when all exist); else unk_token,
consecutive ones fused into one when fuse_unk; else nothing. Then merges by rank, lowest first,
leftmost on ties (bpe.py), with no pre-tokenizer split: a whole text is one word.

Speed comes from two exact rewrites, checked against the vocabulary when the model is built:
- The compiled merge loop (ignis._core.BPEMerger) starts from UTF-8 bytes. Each byte starts as its
  byte-fallback token (an ASCII byte: its character's token, if any), and "assembly" merges ranked
  before every real merge join a character's bytes into its token, through private ids for partial
  characters. Every assembly merge runs before any real one, so the real merges see exactly the
  symbols above; a character without a token is left as its bytes' tokens, which is byte fallback
  (private ids left over are spelled out as byte tokens). Exact when all 256 byte tokens exist and
  no real merge involves one; otherwise the pure-Python path runs.
- A word is cut before each run of "▁" whose previous character no token joins to "▁" (no
  vocabulary token holds that character followed by "▁"): no merge can make a symbol across such a
  point, so the pieces merge independently, and repeat often enough to be cached.
"""
from __future__ import annotations

import heapq
import re
from typing import Any, Iterable

from ignis.tokenizer.bpe import MergeModel, _load_merger_class, bpe_word_ref
from ignis.tokenizer.errors import TokenizerFormatError, UnsupportedTokenizerError

SPACE = "\u2581"            # "▁", SentencePiece's visible space
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
_SCAN_MAX = 48              # words up to this many symbols merge with bpe_word_ref's scan


def bpe_merge_heap(ids: list[int], ranks: dict[tuple[int, int], tuple[int, int]]) -> list[int]:
    """bpe_word_ref in O(n log n), as tokenizers' Word::merge_all runs it: a heap of (rank,
    position, new id); an entry whose pair no longer makes that id is dropped when popped."""
    n = len(ids)
    sym = list(ids)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for i in range(n - 1):
        hit = ranks.get((sym[i], sym[i + 1]))
        if hit is not None:
            heap.append((hit[0], i, hit[1]))
    heapq.heapify(heap)
    while heap:
        rank, i, new = heapq.heappop(heap)
        j = nxt[i]
        if not alive[i] or j < 0:
            continue
        hit = ranks.get((sym[i], sym[j]))
        if hit is None or hit[1] != new:
            continue
        sym[i] = new
        alive[j] = False
        nxt[i] = k = nxt[j]
        if k >= 0:
            prv[k] = i
        p = prv[i]
        if p >= 0 and (hit := ranks.get((sym[p], new))) is not None:
            heapq.heappush(heap, (hit[0], p, hit[1]))
        if k >= 0 and (hit := ranks.get((new, sym[k]))) is not None:
            heapq.heappush(heap, (hit[0], i, hit[1]))
    out = []
    i = 0
    while i >= 0:
        out.append(sym[i])
        i = nxt[i]
    return out


class CharBPEModel(MergeModel):
    """Vocabulary and merges of a Hugging Face "BPE" model section over characters."""

    byte_level = False

    @staticmethod
    def _check_options(model: dict[str, Any], path: str | None) -> None:
        _check_options(model, path)             # this module's option rules

    def _setup(self, model: dict[str, Any], vocab: dict[str, int],
               id_to_token: dict[int, str] | None, *, path: str | None) -> None:
        self.vocab = vocab
        self._id_to_token = id_to_token
        self._ranks: dict[tuple[int, int], tuple[int, int]] | None = None
        self.ignore_merges = bool(model.get("ignore_merges", False))
        unk = model.get("unk_token")
        self.unk_id = vocab.get(unk) if unk is not None else None
        if unk is not None and self.unk_id is None:
            raise TokenizerFormatError(f"unk_token {unk!r} is not in the vocabulary", path=path)
        self.fuse_unk = bool(model.get("fuse_unk", False))
        self.byte_fallback = bool(model.get("byte_fallback", False))
        # Byte tokens count only all together: a character whose bytes lack one is unknown.
        self.byte_tokens: list[int] | None = None
        if self.byte_fallback and all(t in vocab for t in BYTE_TOKENS):
            self.byte_tokens = [vocab[t] for t in BYTE_TOKENS]
        self._partial_bytes = self.byte_fallback and self.byte_tokens is None and \
            any(t in vocab for t in BYTE_TOKENS)

    @property
    def ranks(self) -> dict[tuple[int, int], tuple[int, int]]:
        if self._ranks is None:
            self._ranks = self.merge_table.ranks()
        return self._ranks

    # ---------------------------------------------------------------- the compiled path

    def _build_merger(self, backend: str) -> None:
        if backend not in ("core", "ref"):
            raise ValueError(f"backend must be 'core' or 'ref', not {backend!r}")
        self.backend = backend
        self._cache: dict[str, tuple[int, ...]] = {}
        self._merger = None
        self._split = None
        if backend == "ref" or not self._compiled_path_is_exact():
            return
        vocab, t = self.vocab, self.merge_table
        byte_tok = self.byte_tokens
        assert byte_tok is not None
        byte_ids = [vocab.get(chr(b), byte_tok[b]) for b in range(128)] + byte_tok[128:]
        # Assembly merges: (prefix, next byte) -> longer prefix, the last one -> the character.
        next_id = max(max(vocab.values(), default=0), max(t.new, default=0)) + 1
        self._max_id = next_id - 1
        prefix_ids: dict[bytes, int] = {}
        self._spelled: dict[int, tuple[int, ...]] = {}      # private id -> its bytes' tokens
        assembly: list[tuple[int, int, int]] = []
        for tok, tid in vocab.items():
            if len(tok) != 1 or ord(tok) < 0x80:
                continue
            data = tok.encode("utf-8", "surrogatepass")
            left = byte_tok[data[0]]
            for k in range(2, len(data) + 1):
                right = byte_tok[data[k - 1]]
                if k == len(data):
                    new = tid
                else:
                    new = prefix_ids.get(data[:k], -1)
                    if new < 0:
                        new = prefix_ids[data[:k]] = next_id
                        self._spelled[new] = tuple(byte_tok[b] for b in data[:k])
                        next_id += 1
                assembly.append((left, right, new))
                left = new
        assembly = list(dict.fromkeys(assembly))   # a shared prefix is listed once per character
        self._merger = _load_merger_class()(
            byte_ids, assembly + list(zip(t.left, t.right, t.new)))
        self._split = _word_splitter(vocab)

    def _compiled_path_is_exact(self) -> bool:
        if self.byte_tokens is None or self.ignore_merges:
            return False
        byte_set = set(self.byte_tokens)
        t = self.merge_table
        return byte_set.isdisjoint(t.left) and byte_set.isdisjoint(t.right)

    # ---------------------------------------------------------------- encode

    def encode_words(self, words: Iterable[str], out: list[int]) -> list[int]:
        """Append the ids of each pre-token (normalized text) to out."""
        if self._merger is None:
            for w in words:
                out.extend(self.encode_word_ref(w))
            return out
        split = self._split
        pieces = [p for w in words for p in split(w) if p] if split is not None else \
            [w for w in words if w]
        start = len(out)
        self._merger.encode_words(pieces, self._cache, out)
        if len(out) > start and max(out[start:]) > self._max_id:
            spelled = self._spelled
            tail = out[start:]
            del out[start:]
            for i in tail:
                if i in spelled:
                    out.extend(spelled[i])
                else:
                    out.append(i)
        return out

    def initial_symbols(self, word: str) -> list[int]:
        """The word's symbols before any merge, as tokenizers' BPE::merge_word makes them."""
        vocab, byte_tok, unk_id = self.vocab, self.byte_tokens, self.unk_id
        out: list[int] = []
        unk_pending = False
        for c in word:
            tid = vocab.get(c)
            if tid is not None:
                if unk_pending:
                    out.append(unk_id)          # type: ignore[arg-type]
                    unk_pending = False
                out.append(tid)
                continue
            if self.byte_fallback:
                data = c.encode("utf-8")
                if byte_tok is not None:
                    out.extend(byte_tok[b] for b in data)
                    continue        # (tokenizers leaves a pending unk for later here, as this does)
                if self._partial_bytes:
                    got = [self.vocab.get(BYTE_TOKENS[b]) for b in data]
                    if None not in got:
                        out.extend(got)     # type: ignore[arg-type]
                        continue
            if unk_id is not None:
                if unk_pending and not self.fuse_unk:
                    out.append(unk_id)
                unk_pending = True
        if unk_pending:
            out.append(unk_id)                  # type: ignore[arg-type]
        return out

    def encode_word_ref(self, word: str) -> list[int]:
        """Pure-Python ids of one word (the reference the compiled path is tested against)."""
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        ids = self.initial_symbols(word)
        if len(ids) <= _SCAN_MAX:
            return bpe_word_ref(ids, self.ranks)
        return bpe_merge_heap(ids, self.ranks)


def _word_splitter(vocab: dict[str, int]) -> "Any":
    """A function cutting a word at the points no merge can cross (see the module docstring), or
    None when the vocabulary has no "▁"."""
    if SPACE not in vocab:
        return None
    joins: set[str] = set()
    for tok in vocab:
        if SPACE in tok[1:]:
            for i in range(1, len(tok)):
                if tok[i] == SPACE and tok[i - 1] != SPACE:
                    joins.add(tok[i - 1])
    joins.add(SPACE)
    cls = "".join(re.escape(c) for c in sorted(joins))
    pattern = re.compile(f"(?<=[^{cls}])(?={SPACE})")
    return pattern.split


def _check_options(model: dict[str, Any], path: str | None) -> None:
    for key, ok in (("dropout", (None,)), ("continuing_subword_prefix", (None, "")),
                    ("end_of_word_suffix", (None, ""))):
        if model.get(key) not in ok:
            raise UnsupportedTokenizerError(
                f"BPE option {key}={model.get(key)!r} is not supported by ignis's BPE", path=path)
