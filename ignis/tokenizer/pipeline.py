"""Normalizers and pre-tokenizers of a tokenizer.json, as Hugging Face tokenizers defines them.

Each is built from its JSON object into a plain function: a normalizer maps str -> str, a
pre-tokenizer step maps one piece of text to its sub-pieces. Patterns run with the `regex` package,
which has the Unicode classes (\\p{L}, \\p{N}) and look-arounds the tokenizer.json patterns need.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

import regex

from ignis.tokenizer.errors import TokenizerFormatError, UnsupportedTokenizerError

# The split ByteLevel(use_regex=true) applies: GPT-2's pattern.
GPT2_SPLIT_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

Normalizer = Callable[[str], str]
Step = Callable[[str], list[str]]


_inert_re: "re.Pattern[str] | None" = None


def _inert_pattern() -> "re.Pattern[str]":
    """Characters tokenizers' (older) Unicode tables treat as plain starters but Python does not."""
    global _inert_re
    if _inert_re is None:
        from ignis.tokenizer import _unicode_tables as t
        if unicodedata.unidata_version == t.PROBED_UNIDATA_VERSION:
            ranges = t.INERT
        else:
            # Another Python, another Unicode: everything Python would touch that tokenizers'
            # tables do not know is inert (a one-off scan of the code space).
            known = set()
            for a, b in t.KNOWN:
                known.update(range(a, b + 1))
            cps = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and cp not in known
                   and (unicodedata.combining(chr(cp)) or unicodedata.decomposition(chr(cp)))]
            ranges = [(cp, cp) for cp in cps]
        cls = "".join(f"{regex.escape(chr(a))}-{regex.escape(chr(b))}" for a, b in ranges)
        _inert_re = re.compile(f"([{cls}])") if ranges else re.compile("(?!)")
    return _inert_re


def _class_body(ranges: list[tuple[int, int]]) -> str:
    return "".join(regex.escape(chr(a)) if a == b else f"{regex.escape(chr(a))}-{regex.escape(chr(b))}"
                   for a, b in ranges)


_divergent_re: "re.Pattern[str] | None" = None


def _divergent_pattern() -> "re.Pattern[str]":
    """Characters whose \\p{L} / \\p{N} membership differs between the `regex` package and the
    reference (Oniguruma's tables; Rust's is_numeric for Digits). Text without them can use the
    fast built-in classes."""
    global _divergent_re
    if _divergent_re is None:
        from ignis.tokenizer import _unicode_tables as t

        def expand(ranges: list[tuple[int, int]]) -> set[int]:
            out: set[int] = set()
            for a, b in ranges:
                out.update(range(a, b + 1))
            return out
        everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
        ours_l = set(map(ord, regex.findall(r"\p{L}", everything)))
        ours_n = set(map(ord, regex.findall(r"\p{N}", everything)))
        div = (ours_l ^ expand(t.ONIG_L)) | (ours_n ^ expand(t.ONIG_N)) | (ours_n ^ expand(t.RUST_NUMERIC))
        ranges: list[list[int]] = []
        for cp in sorted(div):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
        # The stdlib engine scans a plain character class several times faster than `regex`.
        _divergent_re = (re.compile(f"[{_class_body([(a, b) for a, b in ranges])}]") if ranges
                         else re.compile("(?!)"))
    return _divergent_re


def reference_pattern(pattern: str) -> str:
    """pattern with \\p{L} and \\p{N} spelled out as the code points tokenizers' regex engine
    (Oniguruma, an older Unicode than the `regex` package's) counts as letters and numbers, so that
    newly assigned characters split exactly as in the reference."""
    from ignis.tokenizer import _unicode_tables as t
    classes = {"L": _class_body(t.ONIG_L), "N": _class_body(t.ONIG_N)}
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            m = regex.match(r"\\p\{(L|N)\}", pattern[i:])
            if m:
                body = classes[m.group(1)]
                out.append(body if in_class else f"[{body}]")
                i += m.end()
                continue
            # Other properties (\p{Lu}, \p{M}, ...) are left to the `regex` package's tables:
            # the registry tokenizers use only L and N, which are probed.
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            # a ']' right after '[' or '[^' is a literal
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _unicode_normalizer(form: str) -> Normalizer:
    def normalize(s: str) -> str:
        if s.isascii():
            return s
        inert = _inert_pattern()
        if inert.search(s) is None:
            return unicodedata.normalize(form, s)
        # An inert character is a starter nothing composes with: normalize around it, keep it.
        parts = inert.split(s)
        return "".join(p if i % 2 else unicodedata.normalize(form, p) for i, p in enumerate(parts))
    return normalize


def build_normalizer(spec: dict[str, Any] | None, *, path: str | None = None) -> Normalizer | None:
    """The normalizer a tokenizer.json names, or None for none."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return _unicode_normalizer(kind)
    if kind == "Lowercase":
        return str.lower
    if kind == "Replace":
        return _replace(spec, path)
    if kind == "Prepend":
        prefix = spec.get("prepend")
        if not isinstance(prefix, str):
            raise TokenizerFormatError(f"Prepend normalizer {spec!r} has no 'prepend' string", path=path)

        def prepend(s: str) -> str:
            return prefix + s if s else s      # tokenizers prepends to non-empty text only
        return prepend
    if kind == "Sequence":
        parts = [build_normalizer(p, path=path) for p in spec.get("normalizers", [])]
        parts = [p for p in parts if p is not None]

        def sequence(s: str) -> str:
            for p in parts:
                s = p(s)
            return s
        return sequence
    raise UnsupportedTokenizerError(f"normalizer {kind!r} is not supported (ignis knows NFC, NFD, "
                                    f"NFKC, NFKD, Lowercase, Replace, Prepend, Sequence)", path=path)


def _replace(spec: dict[str, Any], path: str | None) -> Normalizer:
    """tokenizers' Replace: every match of a String or Regex pattern becomes `content`."""
    pat, content = spec.get("pattern") or {}, spec.get("content")
    if not isinstance(content, str):
        raise TokenizerFormatError(f"Replace {spec!r} has no 'content' string", path=path)
    if isinstance(pat.get("String"), str):
        literal = pat["String"]
        if not literal:
            raise TokenizerFormatError("Replace pattern is the empty string", path=path)
        return lambda s: s.replace(literal, content)
    if isinstance(pat.get("Regex"), str):
        try:
            compiled = regex.compile(pat["Regex"])
        except regex.error as exc:
            raise TokenizerFormatError(f"Replace pattern {pat['Regex']!r} does not compile: {exc}",
                                       path=path) from exc
        return lambda s: compiled.sub(lambda m: content, s)
    raise TokenizerFormatError(f"Replace pattern {pat!r} has neither String nor Regex", path=path)


def _split_regex(source: str, behavior: str, invert: bool,
                 exact: Callable[[], str] | None = None, *, path: str | None = None) -> Step:
    """Split like tokenizers' Split: matches and the gaps between them, combined per behavior.

    exact: makes the same pattern with the reference's Unicode classes spelled out (slow to match);
    used only on text holding a character the two Unicode versions disagree on. It is made and
    compiled on first such text, not at load: its character classes take ~70 ms to compile, which
    every process would pay before its first token.
    """
    fast_re = regex.compile(source)
    # The common case: regex.split with one group yields gap, match, gap, ...
    isolated_path = behavior == "Isolated" and not invert and fast_re.groups == 0
    grouped_fast = regex.compile(f"({fast_re.pattern})", fast_re.flags) if isolated_path else None
    # [exact_re, grouped_exact] once compiled; exact_re is None when it equals the fast pattern.
    exact_state: list["regex.Pattern[str] | None"] = []

    def exact_patterns() -> list["regex.Pattern[str] | None"]:
        if not exact_state:
            pattern = exact() if exact is not None else source
            try:
                exact_re = regex.compile(pattern) if pattern != source else None
                grouped = (regex.compile(f"({exact_re.pattern})", exact_re.flags)
                           if exact_re is not None and isolated_path else None)
            except regex.error as exc:
                raise TokenizerFormatError(f"Split pattern {source!r} does not compile: {exc}",
                                           path=path) from exc
            exact_state[:] = [exact_re, grouped]
        return exact_state

    def pick(text: str, grouped: bool = False) -> "regex.Pattern[str]":
        # The divergent set takes ~0.4 s to build: only once some text is not ASCII, not at load.
        if exact is None or text.isascii() or _divergent_pattern().search(text) is None:
            return grouped_fast if grouped else fast_re
        exact_re, grouped_exact = exact_patterns()
        if exact_re is None:
            return grouped_fast if grouped else fast_re
        return grouped_exact if grouped else exact_re

    if isolated_path:
        def isolated(text: str) -> list[str]:
            return [p for p in pick(text, grouped=True).split(text) if p]
        return isolated

    def split(text: str) -> list[str]:
        pattern = pick(text)
        spans: list[tuple[str, bool]] = []  # (piece, is_delimiter)
        last = 0
        for m in pattern.finditer(text):
            if m.start() == m.end():
                continue
            if m.start() > last:
                spans.append((text[last:m.start()], invert))
            spans.append((m.group(), not invert))
            last = m.end()
        if last < len(text):
            spans.append((text[last:], invert))
        # The same folds as tokenizers' NormalizedString::split, over (piece, is_match) pairs.
        out: list[str] = []
        if behavior == "Isolated":
            out = [p for p, _ in spans]
        elif behavior == "Removed":
            out = [p for p, d in spans if not d]
        elif behavior == "Contiguous":
            prev: bool | None = None
            for p, d in spans:
                if d == prev and out:
                    out[-1] += p
                else:
                    out.append(p)
                prev = d
        elif behavior == "MergedWithPrevious":
            prev_match = False
            for p, d in spans:
                if d and not prev_match and out:
                    out[-1] += p
                else:
                    out.append(p)
                prev_match = d
        elif behavior == "MergedWithNext":
            prev_match = False
            for p, d in reversed(spans):
                if d and not prev_match and out:
                    out[-1] = p + out[-1]
                else:
                    out.append(p)
                prev_match = d
            out.reverse()
        return out
    return split


def _unless_absent(literal: str, step: Step) -> Step:
    """step, skipped for text without `literal` (a String split then leaves the text whole; Gemma
    splits on " " text whose spaces its normalizer has already replaced)."""
    def split(text: str) -> list[str]:
        return step(text) if literal in text else [text]
    return split


def _rust_numeric_pattern(suffix: str) -> str:
    """Rust's char::is_numeric as a character class (what tokenizers' Digits splits on)."""
    from ignis.tokenizer import _unicode_tables as t
    return f"[{_class_body(t.RUST_NUMERIC)}]{suffix}"


_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")


@dataclass(frozen=True)
class Metaspace:
    """tokenizers' Metaspace pre-tokenizer: spaces become `replacement`, which is prepended to a
    piece not starting with it (every piece: "always"; only a piece at the start of the original
    text: "first"), then, with split, each replacement starts a new piece."""
    replacement: str
    prepend_scheme: str
    split: bool

    def __call__(self, text: str, at_start: bool) -> list[str]:
        r = self.replacement
        text = text.replace(" ", r)
        if (self.prepend_scheme == "always" or (self.prepend_scheme == "first" and at_start)) \
                and not text.startswith(r):
            text = r + text
        if not self.split:
            return [text]
        out: list[str] = []
        for i, part in enumerate(text.split(r)):
            if i == 0:
                if part:
                    out.append(part)
            else:
                out.append(r + part)
        return out


@dataclass
class PreTokenizer:
    """A chain of split steps. byte_level: the chain ends in ByteLevel, so the BPE model maps the
    pieces to the byte alphabet; otherwise the pieces are BPE'd as characters (SentencePiece-style)."""
    steps: list[Step | Metaspace]
    byte_level: bool = True

    def __call__(self, text: str, at_start: bool = True) -> list[str]:
        """at_start: the text begins the original input (Metaspace's "first" prepends only there)."""
        pieces = [text] if text else []
        for step in self.steps:
            out: list[str] = []
            if isinstance(step, Metaspace):
                for k, p in enumerate(pieces):
                    out.extend(step(p, at_start and k == 0))
            else:
                for p in pieces:
                    out.extend(step(p))
            pieces = out
        return pieces


def build_pre_tokenizer(spec: dict[str, Any] | None, *, path: str | None = None,
                        byte_fallback: bool = False) -> PreTokenizer:
    """The pre-tokenizer of a BPE tokenizer.json: byte-level (its last step is ByteLevel), or, for
    a model with byte_fallback (SentencePiece-style), any chain of the other steps, or none."""
    flat: list[dict[str, Any]] = []

    def flatten(s: dict[str, Any]) -> None:
        if s.get("type") == "Sequence":
            for p in s.get("pretokenizers", []):
                flatten(p)
        else:
            flat.append(s)
    if spec is not None:
        flatten(spec)
    byte_level = any(s.get("type") == "ByteLevel" for s in flat)
    if not byte_level and not byte_fallback:
        raise UnsupportedTokenizerError(
            "the pre-tokenizer does not end in ByteLevel and the BPE model has no byte_fallback; "
            "ignis supports byte-level BPE and SentencePiece-style BPE with byte fallback", path=path)
    if byte_level and flat[-1].get("type") != "ByteLevel":
        raise UnsupportedTokenizerError("ByteLevel must be the last pre-tokenizer", path=path)
    steps: list[Step | Metaspace] = []
    for i, s in enumerate(flat):
        kind = s.get("type")
        if kind == "ByteLevel":
            if i != len(flat) - 1:
                raise UnsupportedTokenizerError("ByteLevel must be the last pre-tokenizer", path=path)
            if s.get("add_prefix_space", False):
                raise UnsupportedTokenizerError("ByteLevel add_prefix_space=true is not supported",
                                                path=path)
            if s.get("use_regex", True):
                steps.append(_split_regex(GPT2_SPLIT_PATTERN, "Isolated", False,
                                          lambda: reference_pattern(GPT2_SPLIT_PATTERN), path=path))
        elif kind == "Split":
            pat = s.get("pattern") or {}
            behavior = s.get("behavior", "Isolated")
            if behavior not in _BEHAVIORS:
                raise TokenizerFormatError(f"Split behavior {behavior!r} is not one of {_BEHAVIORS}",
                                           path=path)
            exact: Callable[[], str] | None = None
            if "Regex" in pat:
                source = pat["Regex"]
                if not isinstance(source, str):
                    raise TokenizerFormatError(f"Split pattern {source!r} is not a string", path=path)
                if "\\p{L}" in source or "\\p{N}" in source:   # else reference_pattern is a no-op
                    exact = functools.partial(reference_pattern, source)
            elif "String" in pat:
                source = regex.escape(pat["String"])
            else:
                raise TokenizerFormatError(f"Split pattern {pat!r} has neither Regex nor String",
                                           path=path)
            try:
                step = _split_regex(source, behavior, bool(s.get("invert", False)), exact, path=path)
            except regex.error as exc:
                raise TokenizerFormatError(f"Split pattern {source!r} does not compile: {exc}",
                                           path=path) from exc
            if "String" in pat and pat["String"] and not s.get("invert", False):
                step = _unless_absent(pat["String"], step)
            steps.append(step)
        elif kind == "Metaspace":
            replacement = s.get("replacement", "\u2581")
            scheme = s.get("prepend_scheme", "always" if s.get("add_prefix_space", True) else "never")
            if not isinstance(replacement, str) or len(replacement) != 1 \
                    or scheme not in ("always", "first", "never"):
                raise TokenizerFormatError(f"malformed Metaspace pre-tokenizer {s!r}", path=path)
            steps.append(Metaspace(replacement, scheme, bool(s.get("split", True))))
        elif kind == "Digits":
            plus = "" if s.get("individual_digits", False) else "+"
            steps.append(_split_regex(r"\p{N}" + plus, "Isolated", False,
                                      functools.partial(_rust_numeric_pattern, plus), path=path))
        else:
            raise UnsupportedTokenizerError(
                f"pre-tokenizer {kind!r} is not supported (ignis knows Split, Digits, Metaspace, "
                f"ByteLevel, Sequence)", path=path)
    return PreTokenizer(steps, byte_level)
