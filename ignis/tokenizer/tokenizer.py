"""The tokenizer: text <-> ids for BPE models, byte-level (Qwen2, SmolLM2, GPT-2) or SentencePiece-
style (Gemma, Llama 2, Mistral: characters with byte fallback), exactly as Hugging Face tokenizers
does it.

encode: split out added/special tokens -> normalize the rest -> pre-tokenize -> BPE -> post-process.
decode: ids -> tokens -> the decoder chain (decoders.py): UTF-8 of the token bytes for byte-level
BPE, text with byte-fallback runs for SentencePiece-style BPE.
"""
from __future__ import annotations

import contextlib
import gc
import json
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import regex

from ignis.tokenizer import compiled
from ignis.tokenizer.bpe import MAX_TOKEN_ID, BPEModel
from ignis.tokenizer.decoders import build_decoder
from ignis.tokenizer.errors import (CompiledCacheError, TokenIdError, TokenizerError,
                                    TokenizerFormatError, TokenizerInputError,
                                    UnsupportedTokenizerError)
from ignis.tokenizer.pipeline import PreTokenizer, build_normalizer, build_pre_tokenizer
from ignis.tokenizer.spm_bpe import CharBPEModel

if TYPE_CHECKING:
    from ignis.tokenizer.chat import TextMasker
    from ignis.tokenizer.stream import StreamDecoder

# Rust's char::is_whitespace (the White_Space property) and char::is_alphanumeric, which
# tokenizers uses for lstrip/rstrip and single_word.
_WS = regex.compile(r"\s")
_WORD_CHAR = regex.compile(r"[\p{Alphabetic}\p{N}]")


@dataclass(frozen=True)
class AddedToken:
    """One entry of tokenizer.json's added_tokens."""
    id: int
    content: str
    special: bool = False
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


def _trie_pattern(words: Iterable[str]) -> str:
    """A regular expression matching any of `words`, the longest one at a position: their trie,
    each node's continuations tried before ending there. Unlike an alternation of the words it is
    cheap to scan with thousands of them (Gemma has 6,384 added tokens)."""
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for c in w:
            node = node.setdefault(c, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = []
        for c, child in sorted(node.items()):
            if c:
                chain = [c]
                while len(child) == 1 and "" not in child:     # one way on: a literal run
                    (c, child), = child.items()
                    chain.append(c)
                alts.append(re.escape("".join(chain)) + emit(child))
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body
    return emit(trie)


def longest_match_pattern(words: Iterable[str]) -> "re.Pattern[str] | regex.Pattern[str]":
    """A compiled pattern finding any of `words`, the longest at the leftmost position."""
    words = list(words)
    try:
        return re.compile(_trie_pattern(words))
    except (RecursionError, OverflowError, re.error):   # too deep or big for re: the plain way
        # longest first, so that at any one position the alternation takes the longest
        alts = sorted(words, key=len, reverse=True)
        return regex.compile("|".join(regex.escape(a) for a in alts))


class _AddedMatcher:
    """Finds added tokens in text the way tokenizers' AddedVocabulary does: leftmost-longest
    non-overlapping matches, then the single_word / lstrip / rstrip rules on each match."""

    def __init__(self, tokens: list[tuple[str, AddedToken]]):
        self.by_text: dict[str, AddedToken] = {}
        for text, tok in tokens:
            if text:
                self.by_text.setdefault(text, tok)
        self.pattern = longest_match_pattern(self.by_text) if self.by_text else None

    def split(self, text: str, skip_special: bool) -> list[tuple[str, int | None]]:
        if self.pattern is None or not text:
            return [(text, None)]
        out: list[tuple[str, int | None]] = []
        start_offset = 0
        n = len(text)
        for m in self.pattern.finditer(text):
            start, stop = m.start(), m.end()
            tok = self.by_text[m.group()]
            if skip_special and tok.special:
                continue
            if tok.single_word:
                before_ok = start == 0 or not _WORD_CHAR.match(text[start - 1])
                after_ok = stop == n or not _WORD_CHAR.match(text[stop])
                if not (before_ok and after_ok):
                    continue
            if tok.lstrip:
                s = start
                while s > 0 and _WS.match(text[s - 1]):
                    s -= 1
                start = max(s, start_offset)
            if tok.rstrip:
                while stop < n and _WS.match(text[stop]):
                    stop += 1
            if start > start_offset:
                out.append((text[start_offset:start], None))
            out.append((text[start:stop], tok.id))
            start_offset = stop
        if start_offset != n:
            out.append((text[start_offset:], None))
        return out


class Tokenizer:
    """A BPE tokenizer built from tokenizer.json (+ tokenizer_config.json): byte-level, or
    SentencePiece-style (no ByteLevel pre-tokenizer, a model with byte_fallback).

    backend="core" runs the merge loop in ignis._core; backend="ref" is its pure-Python twin, kept
    for the tests that check one against the other.
    """

    def __init__(self, tokenizer_json: dict[str, Any], config: dict[str, Any] | None = None, *,
                 path: str | None = None, backend: str = "core"):
        self.path = path
        model = _check_spec(tokenizer_json, path)
        pre = _pre_tokenizer(tokenizer_json, model, path)
        model_class = BPEModel if pre.byte_level else CharBPEModel
        self.model = model_class(model, path=path, backend=backend)
        self._build(tokenizer_json, config, pre_tokenizer=pre)

    @classmethod
    def _from_compiled(cls, tables: compiled.CompiledTables, config: dict[str, Any] | None, *,
                       path: str | None, backend: str) -> "Tokenizer":
        """The tokenizer a previous build made from the same files, from its cached tables: the same
        checks and steps as __init__, minus parsing the vocabulary and merges and spelling every
        token as bytes. Raises CompiledCacheError when the tables do not fit together."""
        self = cls.__new__(cls)
        self.path = path
        model = _check_spec(tables.spec, path)
        pre = _pre_tokenizer(tables.spec, model, path)
        model_class = BPEModel if pre.byte_level else CharBPEModel
        self.model = model_class.from_tables(model, tables.tokens, tables.ids, tables.merges,
                                             path=path, backend=backend)
        self._build(tables.spec, config, pre_tokenizer=pre, token_bytes=tables.token_bytes,
                    holes=tables.holes, vocab_ids=tables.ids,
                    token_to_id_is_vocab_and_added=tables.token_to_id_is_vocab_and_added)
        return self

    def _build(self, tokenizer_json: dict[str, Any], config: dict[str, Any] | None, *,
               pre_tokenizer: PreTokenizer, token_bytes: Sequence[bytes | None] | None = None,
               holes: list[int] | None = None, vocab_ids: Sequence[int] | None = None,
               token_to_id_is_vocab_and_added: bool = False) -> None:
        """Everything but the BPE model: pipeline, added tokens, and the id <-> token tables.

        token_bytes/holes: the id -> bytes table and its empty ids from a cache, instead of spelling
        ~150k tokens again (checked to fit this vocabulary). token_to_id_is_vocab_and_added: a
        cache's finding (see _token_to_id_is_vocab_and_added) that lets the text -> id table be copied
        from the vocabulary instead of inverted entry by entry."""
        path = self.path
        # The pipeline as tokenizer.json describes it, for what rebuilds it outside Python
        # (ignis.native.tokenizer_blob serializes it for the C tokenizer).
        self.pipeline_spec: dict[str, Any] = {
            k: tokenizer_json.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder")}
        self.normalizer = build_normalizer(tokenizer_json.get("normalizer"), path=path)
        self.pre_tokenizer = pre_tokenizer
        self.decoder = build_decoder(tokenizer_json.get("decoder"),
                                     byte_level=pre_tokenizer.byte_level, path=path)
        self._prefix, self._suffix = _post_processor(tokenizer_json.get("post_processor"), path)
        self.config: dict[str, Any] = dict(config or {})

        self.added_tokens: list[AddedToken] = []
        for entry in tokenizer_json.get("added_tokens") or []:
            try:
                tok = AddedToken(id=int(entry["id"]), content=str(entry["content"]),
                                 special=bool(entry.get("special", False)),
                                 lstrip=bool(entry.get("lstrip", False)),
                                 rstrip=bool(entry.get("rstrip", False)),
                                 single_word=bool(entry.get("single_word", False)),
                                 normalized=bool(entry.get("normalized", not entry.get("special"))))
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise TokenizerFormatError(f"malformed added token {entry!r:.200}", path=path) from exc
            if not 0 <= tok.id <= MAX_TOKEN_ID:
                raise TokenizerFormatError(f"added token {tok.content!r:.60} has id {tok.id}, not in "
                                           f"0..{MAX_TOKEN_ID}", path=path)
            model_id = self.model.vocab.get(tok.content)
            if model_id is not None and model_id != tok.id:
                raise TokenizerFormatError(
                    f"added token {tok.content!r} has id {tok.id} but the vocabulary says {model_id}",
                    path=path)
            self.added_tokens.append(tok)
        self._raw_matcher = _AddedMatcher([(t.content, t) for t in self.added_tokens
                                           if not t.normalized])
        self._norm_matcher = _AddedMatcher(
            [(self.normalizer(t.content) if self.normalizer else t.content, t)
             for t in self.added_tokens if t.normalized])
        self.special_ids: frozenset[int] = frozenset(t.id for t in self.added_tokens if t.special)

        # id -> text: built on first use (_id_to_token) where a cached load needs it for nothing
        # else, i.e. when the text -> id table is the vocabulary's and the ids are checked below
        self._id_table: dict[int, str] | None = None
        self._added_text = {t.id: t.content for t in self.added_tokens}
        self._token_to_id: dict[str, int]
        if token_to_id_is_vocab_and_added:
            self._token_to_id = self._vocab_and_added()
        else:
            # Inverted; a token spelled by several ids keeps the last, as a comprehension would.
            self._token_to_id = dict(zip(self._id_to_token.values(), self._id_to_token.keys()))
        # id -> bytes: a list, or a cache's TokenBytes (the same entries, cut from its blob on use)
        self._bytes: Sequence[bytes | None]
        if token_bytes is None:
            n = max(self._id_to_token) + 1
            table: list[bytes | None] = [None] * n
            for i, b in zip(self._id_to_token,
                            self.decoder.token_bytes_many(self._id_to_token.values())):
                table[i] = b
            self._bytes = table
            self._holes = frozenset(i for i, b in enumerate(table) if b is None)
        else:
            _check_cached_ids(token_bytes, holes or [], vocab_ids if vocab_ids is not None else [],
                              [t.id for t in self.added_tokens])
            self._bytes = token_bytes
            self._holes = frozenset(holes or ())
        # SentencePiece-style decoding tells byte-fallback tokens ("<0xNN>") from text tokens.
        self._byte_token_ids: frozenset[int] = frozenset(
            i for i, t in self._id_to_token.items()
            if len(t) == 6 and t.startswith("<0x") and self.decoder.is_byte_token(t)
        ) if not self.decoder.byte_level else frozenset()

    @property
    def _id_to_token(self) -> dict[int, str]:
        """id -> text: the vocabulary's, then the added tokens'."""
        table = self._id_table
        if table is None:
            table = dict(self.model.id_to_token)
            for t in self.added_tokens:
                table[t.id] = t.content
            self._id_table = table
        return table

    def _vocab_and_added(self) -> dict[str, int]:
        table = dict(self.model.vocab)
        table.update((t.content, t.id) for t in self.added_tokens)
        return table

    def _token_to_id_is_vocab_and_added(self) -> bool:
        """Whether the text -> id table equals the vocabulary updated with the added tokens (true
        unless two ids share a spelling), so a cached load may build it that way."""
        return self._token_to_id == self._vocab_and_added()

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_dir(cls, directory: str | Path, *, backend: str = "core",
                 cache: bool = True) -> "Tokenizer":
        """Load tokenizer.json (required) and tokenizer_config.json (optional) from a model dir.

        cache: reuse (or write) the compiled tables under IGNIS_HOME/tokenizers, which makes later
        loads of the same, unchanged files several times faster (see ignis.tokenizer.compiled).
        """
        with _gc_paused():
            return cls._from_dir(Path(directory), backend=backend, cache=cache)

    @classmethod
    def _from_dir(cls, directory: Path, *, backend: str, cache: bool) -> "Tokenizer":
        tj_path = directory / "tokenizer.json"
        cfg_path = directory / "tokenizer_config.json"
        path = str(tj_path)
        key = compiled.source_key(tj_path, cfg_path) if cache else None
        tables = compiled.read(key) if key is not None else None
        tj = _read_json(tj_path, required=True) if tables is None else None
        cfg = _read_json(cfg_path, required=False)     # small: always read, never cached
        if tables is not None:
            try:
                return cls._from_compiled(tables, cfg, path=path, backend=backend)
            except TokenizerError as exc:    # CompiledCacheError, or a check that fails
                compiled.warn_unusable(key, exc)
            tj = _read_json(tj_path, required=True)
        tok = cls(tj, cfg, path=path, backend=backend)
        # Store only if the files did not change while they were read.
        if key is not None and compiled.source_key(tj_path, cfg_path) == key:
            compiled.write(key, tj, tok)
        return tok

    # ---------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        """One past the largest token id (ids below it without a token are holes)."""
        return len(self._bytes)

    def token_to_id(self, token: str) -> int | None:
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        if self._id_table is None and type(token_id) is int:     # one id: no table built for it
            added = self._added_text.get(token_id)
            return added if added is not None else self.model.token_of(token_id)
        return self._id_to_token.get(token_id)

    def has_token(self, token_id: int) -> bool:
        """Whether decode() accepts token_id. A model's embedding may have more rows than the
        tokenizer has tokens (Qwen2.5: 151936 rows, 151665 tokens); samplers should mask the rest."""
        return 0 <= token_id < len(self._bytes) and self._bytes[token_id] is not None

    def token_mask(self, size: int) -> list[bool]:
        """has_token(i) for i in range(size), at once (a sampler's mask of ids it may emit)."""
        n = min(size, len(self._bytes))
        mask = [True] * n + [False] * (size - n)
        for h in self._holes:
            if h < n:
                mask[h] = False
        return mask

    def _special_id(self, name: str) -> int | None:
        value = self.config.get(name)
        if isinstance(value, dict):  # older configs store AddedToken objects
            value = value.get("content")
        return self._token_to_id.get(value) if isinstance(value, str) else None

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def chat_template(self) -> str | None:
        t = self.config.get("chat_template")
        if isinstance(t, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
            t = named.get("default")
        return t if isinstance(t, str) else None

    # ---------------------------------------------------------------- encode

    def normalize(self, text: str) -> str:
        """The text as the model sees it between added tokens, after the normalizer (for byte-level
        BPE, what decode(encode(text)) gives)."""
        return self.normalizer(text) if self.normalizer else text

    def encode(self, text: str, add_special_tokens: bool = True,
               split_special_tokens: bool = False) -> list[int]:
        """Token ids of text.

        add_special_tokens: add what the post-processor adds (e.g. BOS), as tokenizers does.
        split_special_tokens: treat the text of special tokens ("<|im_start|>") as plain text, for
        untrusted input; non-special added tokens are still matched, as in tokenizers.
        """
        if not isinstance(text, str):
            raise TokenizerInputError(f"encode() takes a str, not {type(text).__name__}")
        out: list[int] = list(self._prefix) if add_special_tokens else []
        with _valid_text():
            for k, (piece, tid) in enumerate(self._raw_matcher.split(text, split_special_tokens)):
                if tid is not None:
                    out.append(tid)
                else:
                    self._encode_piece(piece, split_special_tokens, out, at_start=k == 0)
        if add_special_tokens:
            out.extend(self._suffix)
        return out

    def _encode_piece(self, piece: str, split_special_tokens: bool, out: list[int],
                      unmask: Callable[[str], str] | None = None, *, at_start: bool = False) -> None:
        """Ids of text between two raw-matched added tokens, appended to out: normalize, match the
        normalized added tokens, pre-tokenize and BPE the rest. unmask (encode_chat) puts back the
        special-token text that was masked in message content, in the text BPE sees. at_start: the
        piece begins the input (a Metaspace pre-tokenizer with prepend_scheme "first" needs it)."""
        if self.normalizer is not None:
            piece = self.normalizer(piece)
        for k, (sub, sid) in enumerate(self._norm_matcher.split(piece, split_special_tokens)):
            if sid is not None:
                out.append(sid)
            elif sub:
                self.model.encode_words(
                    self.pre_tokenizer(unmask(sub) if unmask else sub, at_start and k == 0), out)

    def encode_chat(self, messages: list[dict[str, Any]], *,
                    tools: list[dict[str, Any]] | None = None,
                    documents: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, chat_template: str | None = None,
                    **kwargs: Any) -> list[int]:
        """Prompt ids of a conversation rendered by the chat template, where only the template's own
        markup can become added tokens (control tokens such as "<|im_end|>", markup such as
        "<tool_call>"): every string of the messages, tools, documents and extra template
        variables (content, names, tool results, arguments, schemas) is plain text, so "<|im_end|>" written by a user is the
        ordinary tokens that spell it, never the token that ends their turn.

        Equal to encode(apply_chat_template(...), add_special_tokens=False), which is what
        transformers does, whenever no string holds an added token's text; where one does,
        transformers would let it through as that token and this deliberately does not."""
        template = chat_template if chat_template is not None else self.chat_template
        # the template's own variables too: a template that prints one (Llama 3's date_string)
        # must not turn a request's "<|eot_id|>" into the control token
        # (their values: the names are the template's)
        (messages, tools, documents, values), masks = self._text_masker().mask(
            (messages, tools, documents, list(kwargs.values())), avoid=template or "")
        kwargs = dict(zip(kwargs, values))
        text = self.apply_chat_template(messages, tools=tools, documents=documents,
                                        add_generation_prompt=add_generation_prompt,
                                        chat_template=template, **kwargs)
        if not masks:            # no string held token text: exactly what transformers does
            return self.encode(text, add_special_tokens=False)
        # BPE sees the masked text back as the normalizer would have left it
        table = {ord(c): self.normalizer(t) if self.normalizer and t else t for c, t in masks.items()}

        def unmask(s: str) -> str:
            return s.translate(table)

        out: list[int] = []
        with _valid_text():
            # The masked text holds no added-token text but the template's, so the matchers find
            # exactly the template's markup; the rest gets its masked text back, as plain text.
            for k, (piece, tid) in enumerate(self._raw_matcher.split(text, False)):
                if tid is not None:
                    out.append(tid)
                else:
                    self._encode_piece(piece, False, out, unmask, at_start=k == 0)
        return out

    def _text_masker(self) -> "TextMasker":
        """The masker of every added token's spellings (as written, and as normalized)."""
        masker = getattr(self, "_masker", None)
        if masker is None:
            from ignis.tokenizer.chat import TextMasker
            masker = TextMasker([t.content for t in self.added_tokens]
                                + list(self._norm_matcher.by_text))
            self._masker = masker
        return masker

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True,
                     split_special_tokens: bool = False) -> list[list[int]]:
        """encode() of each text (single-threaded; the per-word cache is shared)."""
        return [self.encode(t, add_special_tokens, split_special_tokens) for t in texts]

    # ---------------------------------------------------------------- decode

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one id stands for."""
        try:
            token_id = operator.index(token_id)
        except TypeError:
            raise TokenIdError(f"token id {token_id!r} is not an integer") from None
        b = self._bytes[token_id] if 0 <= token_id < len(self._bytes) else None
        if b is None:
            raise TokenIdError(f"token id {token_id!r} is not in the vocabulary (ids run 0.."
                               f"{len(self._bytes) - 1})")
        return b

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The raw bytes of ids joined (may end inside a UTF-8 character)."""
        table = self._bytes
        special = self.special_ids
        parts: list[bytes] = []
        for i in ids:
            if skip_special_tokens and i in special:
                continue
            if not isinstance(i, int):
                try:
                    i = operator.index(i)       # numpy integers from a sampler are fine
                except TypeError:
                    raise TokenIdError(f"token id {i!r} is not an integer") from None
            b = table[i] if 0 <= i < len(table) else None
            if b is None:
                raise TokenIdError(f"token id {i!r} is not an id of this vocabulary (ids run "
                                   f"0..{len(table) - 1}, with holes where no token is assigned)")
            parts.append(b)
        return b"".join(parts)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ids, as the tokenizer's decoder makes it (invalid UTF-8 becomes U+FFFD)."""
        if self.decoder.byte_level:
            return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", "replace")
        return self._decode_pieces(ids, skip_special_tokens)

    def _decode_pieces(self, ids: Iterable[int], skip_special_tokens: bool) -> str:
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        if not self.decoder.metaspace and self._byte_token_ids.isdisjoint(ids):
            # No byte-fallback token: the text is the tokens' texts joined (all valid UTF-8).
            return self.decoder.strip_start(self.decode_bytes(ids, skip_special_tokens).decode())
        stream = self.decoder.stream()
        parts = []
        for i in ids:
            data = self.token_bytes(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            parts.append(stream.feed(data, i in self._byte_token_ids, self._id_to_token[i]))
        parts.append(stream.flush())
        return "".join(parts)

    def is_byte_token(self, token_id: int) -> bool:
        """Whether token_id is a byte-fallback token ("<0xNN>"), whose byte joins the bytes of
        the byte tokens around it before it is text."""
        return token_id in self._byte_token_ids

    # ---------------------------------------------------------------- chat, streaming

    def apply_chat_template(self, messages: list[dict[str, Any]], *,
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = False,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """Render a conversation with the model's chat template (see ignis.tokenizer.chat)."""
        from ignis.tokenizer.chat import SPECIAL_TOKEN_NAMES, render_chat_template
        template = chat_template if chat_template is not None else self.chat_template
        special = {k: self.config[k] for k in SPECIAL_TOKEN_NAMES
                   if isinstance(self.config.get(k), str)}
        return render_chat_template(template, messages, tools=tools,
                                    add_generation_prompt=add_generation_prompt,
                                    special_tokens=special, **kwargs)

    def stream_decoder(self, skip_special_tokens: bool = False,
                       continuation: bool = False) -> "StreamDecoder":
        from ignis.tokenizer.stream import StreamDecoder
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens, continuation=continuation)


@contextlib.contextmanager
def _valid_text() -> Iterator[None]:
    """Turns the UnicodeEncodeError of a lone surrogate met while encoding into a typed error."""
    try:
        yield
    except UnicodeEncodeError as exc:
        raise TokenizerInputError(
            f"text holds a character that is not valid Unicode text ({exc.object[exc.start:exc.end]!r} "
            f"at {exc.start}, a lone surrogate); encode it as UTF-8 with errors='replace' first"
        ) from None


def _pre_tokenizer(tokenizer_json: dict[str, Any], model: dict[str, Any],
                   path: str | None) -> PreTokenizer:
    return build_pre_tokenizer(tokenizer_json.get("pre_tokenizer"), path=path,
                               byte_fallback=bool(model.get("byte_fallback", False)))


def _check_spec(tokenizer_json: Any, path: str | None) -> dict[str, Any]:
    """The BPE model section, after checking the file is a BPE tokenizer ignis knows."""
    if not isinstance(tokenizer_json, dict):
        raise TokenizerFormatError("tokenizer.json must hold a JSON object", path=path)
    model = tokenizer_json.get("model")
    # Older files may omit the model type; tokenizers then recognises BPE by its merges.
    kind = None
    if isinstance(model, dict):
        kind = model.get("type", "BPE" if "merges" in model else None)
    if kind is None:
        raise TokenizerFormatError("tokenizer.json has no 'model' section with a 'type'",
                                   path=path)
    if kind != "BPE":
        raise UnsupportedTokenizerError(
            f"tokenizer model type {kind!r} is not supported; ignis supports BPE (byte-level, or "
            f"SentencePiece-style with byte fallback)", path=path)
    return model


def _check_cached_ids(token_bytes: Sequence[bytes | None], holes: list[int],
                      vocab_ids: Sequence[int], added_ids: list[int]) -> None:
    """A cached id -> bytes table must cover exactly this vocabulary's ids, or it belongs to
    something else: checked from the cache's vocabulary ids and the added tokens' ids, without
    the id -> text table. The ids run up to the table's last entry, and the holes are exactly
    the ids below it that no token has."""
    import numpy as np
    n = len(token_bytes)
    ids = np.concatenate([np.asarray(vocab_ids, np.int64).reshape(-1),
                          np.asarray(added_ids, np.int64).reshape(-1)])
    present = np.zeros(n, bool)
    ok = n > 0 and ids.size > 0 and int(ids.min()) >= 0 and int(ids.max()) == n - 1
    if ok:
        present[ids] = True
        ok = np.array_equal(np.flatnonzero(~present), np.asarray(sorted(holes), np.int64))
    if not ok:
        raise CompiledCacheError(
            f"cached byte table has {n} entries and {len(holes)} holes, which do not fit the "
            f"vocabulary's {int(present.sum())} ids")


def _post_processor(spec: dict[str, Any] | None, path: str | None) -> tuple[list[int], list[int]]:
    """Ids the post-processor puts before and after a single sequence."""
    if spec is None or spec.get("type") == "ByteLevel":
        return [], []
    kind = spec.get("type")
    if kind == "Sequence":
        pre: list[int] = []
        post: list[int] = []
        for p in spec.get("processors", []):
            a, b = _post_processor(p, path)
            pre, post = a + pre, post + b
        return pre, post
    if kind == "TemplateProcessing":
        special = spec.get("special_tokens") or {}
        pre, post = [], []
        seen_a = False
        for item in spec.get("single") or []:
            if "Sequence" in item:
                seen_a = True
            elif "SpecialToken" in item:
                name = item["SpecialToken"].get("id")
                if name not in special:
                    raise TokenizerFormatError(
                        f"TemplateProcessing uses special token {name!r} it does not define", path=path)
                (post if seen_a else pre).extend(special[name].get("ids") or [])
            else:
                raise TokenizerFormatError(f"malformed TemplateProcessing item {item!r}", path=path)
        return pre, post
    raise UnsupportedTokenizerError(
        f"post-processor {kind!r} is not supported (ignis knows ByteLevel, TemplateProcessing, "
        f"Sequence)", path=path)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a vocabulary is built: its ~10^6 new objects (none of
    them garbage) would trigger full collections worth ~10% of the load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise TokenizerFormatError(f"{path.name} not found; a model directory needs one",
                                       path=str(path))
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerFormatError(f"{path.name} is not valid JSON: {exc}", path=str(path)) from exc
    except RecursionError:
        raise TokenizerFormatError(f"{path.name} is nested too deeply to be a tokenizer file",
                                   path=str(path)) from None
    except OSError as exc:
        raise TokenizerFormatError(f"{path.name} cannot be read: {exc.strerror or exc}",
                                   path=str(path)) from None
    if not isinstance(data, dict):
        raise TokenizerFormatError(f"{path.name} must hold a JSON object", path=str(path))
    return data


def load_tokenizer(source: str | Path | dict[str, dict], *, backend: str = "core",
                   cache: bool = True) -> Tokenizer:
    """A Tokenizer from a model directory, or from the dict tokenizer_files_from_gguf returns.

    cache: for a directory, reuse the compiled tables stored under IGNIS_HOME/tokenizers by an
    earlier load of the same files (or store them). In-memory files are never cached.
    """
    if isinstance(source, dict):
        if "tokenizer.json" not in source:
            raise TokenizerFormatError("tokenizer files dict has no 'tokenizer.json'")
        with _gc_paused():
            return Tokenizer(source["tokenizer.json"], source.get("tokenizer_config.json"),
                             backend=backend)
    return Tokenizer.from_dir(source, backend=backend, cache=cache)
