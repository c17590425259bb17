"""The tokenizer section of a compiled model: everything csrc/native/tokenizer.c needs to tokenize
exactly as ignis's Python Tokenizer does, as one binary blob (layout in csrc/native/tokenizer.h).

Only pipelines the C side reproduces step for step are written; anything else raises
UnsupportedTokenizerError naming what is unsupported, never a blob that tokenizes differently.
The split regexes are recognised by their exact text (the C side has a scanner for each known one).
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

from ignis.tokenizer.bpe import BPEModel
from ignis.tokenizer.bytelevel import BYTE_TO_CHAR, CHAR_TO_BYTE
from ignis.tokenizer.decoders import ByteLevelDecoder, PieceDecoder
from ignis.tokenizer.errors import UnsupportedTokenizerError
from ignis.tokenizer.gguf_vocab import LLAMA3_SPLIT_PATTERN, QWEN2_SPLIT_PATTERN
from ignis.tokenizer.pipeline import GPT2_SPLIT_PATTERN
from ignis.tokenizer.spm_bpe import BYTE_TOKENS, CharBPEModel
from ignis.tokenizer.tokenizer import Tokenizer

MAGIC = b"IGNTOKB1"
VERSION = 1                 # = IG_TOK_BLOB_VERSION in tokenizer.h
N_SECTIONS = 16
HEADER_WORDS = 14
HEADER_BYTES = 8 + 4 * HEADER_WORDS + 8 * N_SECTIONS
NONE = 0xFFFFFFFF

(S_POOL, S_TOK_ENDS, S_TOK_FLAGS, S_FIRST_ENDS, S_BYTE_IDS, S_MERGES, S_VOCAB, S_ADDED_RAW,
 S_ADDED_NORM, S_NORM, S_PRE, S_PREFIX, S_SUFFIX, S_EOS) = range(14)
F_PRESENT, F_SPECIAL, F_BYTE = 1, 2, 4
A_SPECIAL, A_LSTRIP, A_RSTRIP, A_SINGLE_WORD = 1, 2, 4, 8
N_NFC, N_REPLACE, N_PREPEND = 1, 2, 3
P_QWEN2, P_LLAMA3, P_GPT2, P_DIGITS, P_METASPACE, P_STRING = 1, 2, 3, 4, 5, 6
BEHAVIORS = {"Isolated": 0, "Removed": 1, "MergedWithPrevious": 2, "MergedWithNext": 3,
             "Contiguous": 4}
M_IGNORE_MERGES, M_BYTE_FALLBACK, M_FUSE_UNK = 1, 2, 4
# The split patterns the C side has a scanner for.
KNOWN_SPLITS = {QWEN2_SPLIT_PATTERN: P_QWEN2, LLAMA3_SPLIT_PATTERN: P_LLAMA3,
                GPT2_SPLIT_PATTERN: P_GPT2}


def _unsupported(what: str) -> UnsupportedTokenizerError:
    return UnsupportedTokenizerError(f"{what}; the native tokenizer cannot reproduce it exactly")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _unsupported(f"{what} {text!r:.60} is not valid Unicode (a lone surrogate)") from None


class _Pool:
    """The bytes every section points into, each string stored once."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._seen: dict[bytes, int] = {}

    def add(self, b: bytes) -> tuple[int, int]:
        off = self._seen.get(b)
        if off is None:
            off = self._seen[b] = len(self.data)
            self.data += b
        return off, len(b)


def _flatten(spec: Any, key: str) -> list[dict[str, Any]]:
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise _unsupported(f"{key} {spec!r:.80} is not an object")
    if spec.get("type") == "Sequence":
        inner = spec.get("normalizers" if key == "normalizer" else "pretokenizers") or []
        return [s for p in inner for s in _flatten(p, key)]
    return [spec]


def _normalizer_ops(spec: Any, pool: _Pool) -> list[tuple[int, ...]]:
    ops = []
    for s in _flatten(spec, "normalizer"):
        kind = s.get("type")
        if kind == "NFC":
            ops.append((N_NFC, 0, 0, 0, 0))
        elif kind == "Replace" and isinstance((s.get("pattern") or {}).get("String"), str):
            pat, content = s["pattern"]["String"], s.get("content")
            if not pat or not isinstance(content, str):
                raise _unsupported(f"normalizer Replace {s!r:.80}")
            ops.append((N_REPLACE, *pool.add(_utf8(pat, "Replace pattern")),
                        *pool.add(_utf8(content, "Replace content"))))
        elif kind == "Prepend" and isinstance(s.get("prepend"), str):
            ops.append((N_PREPEND, *pool.add(_utf8(s["prepend"], "Prepend")), 0, 0))
        else:
            detail = (s.get("pattern") or {}).get("Regex") if kind == "Replace" else None
            raise _unsupported(f"normalizer {kind!r}" + (f" with regex {detail!r}" if detail else "")
                               + " (the native tokenizer knows NFC, Replace of a string, Prepend)")
    return ops


def _pre_tokenizer_ops(spec: Any, pool: _Pool) -> list[tuple[int, ...]]:
    ops = []
    for s in _flatten(spec, "pre_tokenizer"):
        kind = s.get("type")
        if kind == "ByteLevel":
            if s.get("use_regex", True):
                ops.append((P_GPT2, 0, 0, 0, 0, 0))
        elif kind == "Split":
            pat = s.get("pattern") or {}
            behavior = s.get("behavior", "Isolated")
            invert = bool(s.get("invert", False))
            if behavior not in BEHAVIORS:
                raise _unsupported(f"Split behavior {behavior!r}")
            if "Regex" in pat:
                code = KNOWN_SPLITS.get(pat["Regex"])
                if code is None or behavior != "Isolated" or invert:
                    raise _unsupported(
                        f"Split regex \"{pat['Regex']}\" (behavior {behavior}, invert {invert}): the "
                        f"native tokenizer knows the Qwen2, Llama 3 and GPT-2 patterns, Isolated")
                ops.append((code, 0, 0, 0, 0, 0))
            elif isinstance(pat.get("String"), str):
                literal = pat["String"]
                skip_absent = bool(literal) and not invert      # pipeline._unless_absent
                ops.append((P_STRING, BEHAVIORS[behavior], int(invert), int(skip_absent),
                            *pool.add(_utf8(literal, "Split string"))))
            else:
                raise _unsupported(f"Split pattern {pat!r:.80}")
        elif kind == "Digits":
            ops.append((P_DIGITS, 0, int(bool(s.get("individual_digits", False))), 0, 0, 0))
        elif kind == "Metaspace":
            replacement = s.get("replacement", "\u2581")
            scheme = s.get("prepend_scheme", "always" if s.get("add_prefix_space", True) else "never")
            schemes = {"never": 0, "first": 1, "always": 2}
            if not isinstance(replacement, str) or len(replacement) != 1 or scheme not in schemes:
                raise _unsupported(f"Metaspace {s!r:.80}")
            ops.append((P_METASPACE, 0, schemes[scheme], int(bool(s.get("split", True))),
                        *pool.add(_utf8(replacement, "Metaspace replacement"))))
        else:
            raise _unsupported(f"pre-tokenizer {kind!r}")
    return ops


def _added(by_text: dict[str, Any], pool: _Pool) -> list[tuple[int, int, int, int]]:
    rows = []
    for text, tok in by_text.items():        # in the matcher's order: the first spelling wins
        flags = (A_SPECIAL * tok.special | A_LSTRIP * tok.lstrip | A_RSTRIP * tok.rstrip
                 | A_SINGLE_WORD * tok.single_word)
        rows.append((*pool.add(_utf8(text, "added token")), tok.id, flags))
    return rows


def _id(v: int | None) -> int:
    return NONE if v is None else v


def tokenizer_section(tokenizer: Tokenizer, *, eos_token_ids: Sequence[int] | None = None) -> bytes:
    """The blob csrc/native/tokenizer.c opens (ig_tok_open). eos_token_ids: the ids generation
    stops at (a model's list); default the tokenizer's eos_token. Raises UnsupportedTokenizerError
    for a pipeline the C side cannot reproduce exactly."""
    tok = tokenizer
    spec = getattr(tok, "pipeline_spec", None)
    if not isinstance(tok, Tokenizer) or not isinstance(spec, dict):
        raise TypeError("tokenizer_section takes an ignis.tokenizer.Tokenizer")
    model = tok.model
    byte_level = tok.pre_tokenizer.byte_level
    if byte_level != isinstance(model, BPEModel) or (not byte_level and not isinstance(model, CharBPEModel)):
        raise _unsupported(f"BPE model {type(model).__name__}")
    pool = _Pool()
    V = tok.vocab_size
    # Token bytes first and in id order: tok_ends is their running end.
    ends = [0]
    for b in tok._bytes:
        pool.data += b or b""
        ends.append(len(pool.data))
    flags = bytearray(V)
    for i, b in enumerate(tok._bytes):
        if b is not None:
            flags[i] = F_PRESENT | (F_SPECIAL if i in tok.special_ids else 0) \
                | (F_BYTE if tok.is_byte_token(i) else 0)
    header = dict(unk=NONE, decoder=0, strip_char=0x20, strip_left=0, metaspace=0)
    model_flags = M_IGNORE_MERGES if model.ignore_merges else 0
    vocab_rows: list[tuple[int, int, int]] = []
    if byte_level:
        byte_ids = list(model.byte_ids)
        if model.ignore_merges:
            alphabet = set(BYTE_TO_CHAR)
            for text, i in model.vocab.items():
                if text and all(ch in alphabet for ch in text):
                    vocab_rows.append((*pool.add(bytes(CHAR_TO_BYTE[ch] for ch in text)), i))
    else:
        byte_ids = [model.vocab.get(t, -1) for t in BYTE_TOKENS]
        model_flags |= (M_BYTE_FALLBACK if model.byte_fallback else 0) | (M_FUSE_UNK if model.fuse_unk else 0)
        header["unk"] = _id(model.unk_id)
        for text, i in model.vocab.items():
            vocab_rows.append((*pool.add(_utf8(text, "vocabulary token")), i))
    first_ends: list[int] = []
    dec = tok.decoder
    if isinstance(dec, PieceDecoder):
        if len(dec.strip) != 1:
            raise _unsupported(f"decoder Strip of {dec.strip!r}")
        header.update(decoder=1, strip_char=ord(dec.strip), strip_left=dec.strip_left,
                      metaspace=int(dec.metaspace))
        if dec.metaspace:
            # The first token's text: the token less every replacement character.
            first_ends.append(0)
            first_data = bytearray()
            for i in range(V):
                t = tok.id_to_token(i)
                text = t.replace(dec.replacements[0][0], "") if t is not None and flags[i] else ""
                first_data += _utf8(text, "token")
                first_ends.append(len(first_data))
            base = len(pool.data)
            pool.data += first_data
            first_ends = [base + e for e in first_ends]
    elif not isinstance(dec, ByteLevelDecoder):
        raise _unsupported(f"decoder {type(dec).__name__}")
    t = model.merge_table
    merges = [v for row in zip(t.left, t.right, t.new, t.rank) for v in row]
    norm = _normalizer_ops(spec.get("normalizer"), pool)
    pre = _pre_tokenizer_ops(spec.get("pre_tokenizer"), pool)
    if len(pre) != len(tok.pre_tokenizer.steps):
        raise _unsupported(f"pre-tokenizer {spec.get('pre_tokenizer')!r:.120} (steps do not line up "
                           f"with ignis's)")
    raw = _added(tok._raw_matcher.by_text, pool)
    normed = _added(tok._norm_matcher.by_text, pool)
    eos = tok.eos_token_id
    eos_list = list(eos_token_ids) if eos_token_ids is not None else ([] if eos is None else [eos])
    for i in eos_list:
        if not 0 <= i < V:
            raise ValueError(f"eos token id {i} is not in the vocabulary (0..{V - 1})")

    sections: list[bytes] = [b""] * N_SECTIONS
    sections[S_TOK_ENDS] = struct.pack(f"<{V + 1}I", *ends)
    sections[S_TOK_FLAGS] = bytes(flags)
    sections[S_FIRST_ENDS] = struct.pack(f"<{len(first_ends)}I", *first_ends)
    sections[S_BYTE_IDS] = struct.pack("<256i", *byte_ids)
    sections[S_MERGES] = struct.pack(f"<{len(merges)}i", *merges)
    sections[S_VOCAB] = struct.pack(f"<{3 * len(vocab_rows)}I", *(v for r in vocab_rows for v in r))
    sections[S_ADDED_RAW] = struct.pack(f"<{4 * len(raw)}I", *(v for r in raw for v in r))
    sections[S_ADDED_NORM] = struct.pack(f"<{4 * len(normed)}I", *(v for r in normed for v in r))
    sections[S_NORM] = struct.pack(f"<{5 * len(norm)}I", *(v for r in norm for v in r))
    sections[S_PRE] = struct.pack(f"<{6 * len(pre)}I", *(v for r in pre for v in r))
    sections[S_PREFIX] = struct.pack(f"<{len(tok._prefix)}i", *tok._prefix)
    sections[S_SUFFIX] = struct.pack(f"<{len(tok._suffix)}i", *tok._suffix)
    sections[S_EOS] = struct.pack(f"<{len(eos_list)}i", *eos_list)
    sections[S_POOL] = bytes(pool.data)
    body = bytearray()
    table = []
    for data in sections:
        if not data:
            table.append((0, 0))
            continue
        off = HEADER_BYTES + len(body)
        table.append((off, len(data)))
        body += data
        body += b"\0" * (-len(body) % 4)
    total = HEADER_BYTES + len(body)
    words = [VERSION, total, V, 0 if byte_level else 1, model_flags, header["unk"], header["decoder"],
             header["strip_char"], header["strip_left"], header["metaspace"],
             _id(tok.bos_token_id), _id(tok.pad_token_id), _id(eos), 0]
    head = MAGIC + struct.pack(f"<{HEADER_WORDS}I", *words) + \
        struct.pack(f"<{2 * N_SECTIONS}I", *(v for r in table for v in r))
    assert len(head) == HEADER_BYTES
    return head + bytes(body)
