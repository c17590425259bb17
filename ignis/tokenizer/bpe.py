"""The BPE model of a byte-level tokenizer: vocabulary, ranked merges, and the word -> ids step.

The merge loop runs in C (ignis._core.BPEMerger, from ignis/_bpe.pxi); bpe_word_ref is its plain
Python twin, used by the tests to check the compiled one.
"""
from __future__ import annotations

from typing import Any, Iterable

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


class BPEModel:
    """Vocabulary and merges of a Hugging Face "BPE" model section, for byte-level input."""

    def __init__(self, model: dict[str, Any], *, path: str | None = None, backend: str = "core"):
        for key, ok in (("dropout", (None,)), ("continuing_subword_prefix", (None, "")),
                        ("end_of_word_suffix", (None, "")), ("byte_fallback", (None, False))):
            if model.get(key) not in ok:
                raise UnsupportedTokenizerError(
                    f"BPE option {key}={model.get(key)!r} is not supported by ignis's byte-level BPE",
                    path=path)
        vocab = model.get("vocab")
        merges = model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(merges, list):
            raise TokenizerFormatError("BPE model needs a 'vocab' object and a 'merges' list",
                                       path=path)
        self.vocab: dict[str, int] = vocab
        self.ignore_merges = bool(model.get("ignore_merges", False))
        self.id_to_token: dict[int, str] = {}
        for tok, tid in vocab.items():
            if not isinstance(tid, int) or tid < 0:
                raise TokenizerFormatError(f"vocab entry {tok!r} has id {tid!r}, not an int >= 0",
                                           path=path)
            self.id_to_token[tid] = tok
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
        # A later duplicate of a pair overrides the earlier one, as tokenizers' HashMap build does.
        self.ranks: dict[tuple[int, int], tuple[int, int]] = {}
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
            self.ranks[(vocab[a], vocab[b])] = (rank, vocab[ab])
        self.backend = backend
        if backend == "core":
            ordered = sorted(self.ranks.items(), key=lambda kv: kv[1][0])
            self._merger = _load_merger_class()(
                self.byte_ids, [(a, b, new) for (a, b), (_, new) in ordered])
        elif backend != "ref":
            raise ValueError(f"backend must be 'core' or 'ref', not {backend!r}")
        self._cache: dict[str, tuple[int, ...]] = {}

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


def _merge_pair(merge: Any) -> tuple[str, str] | None:
    # tokenizers writes merges as "a b" (older files) or ["a", "b"] (newer files).
    if isinstance(merge, str):
        parts = merge.split(" ")
        return (parts[0], parts[1]) if len(parts) == 2 else None
    if isinstance(merge, list) and len(merge) == 2 and all(isinstance(p, str) for p in merge):
        return merge[0], merge[1]
    return None
