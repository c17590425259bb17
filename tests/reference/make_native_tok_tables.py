"""Writes csrc/native/tok_unicode.h: the Unicode tables of the native tokenizer (csrc/native/tokenizer.c),
from the same data ignis's Python tokenizer uses at run time, so the two classify every code point alike:
\\p{L} and \\p{N} as tokenizers' Oniguruma sees them and Rust's is_numeric (ignis/tokenizer/
_unicode_tables.py), the `regex` package's \\s (the split patterns' whitespace) and [\\p{Alphabetic}\\p{N}]
(added tokens' single_word) and its grapheme-cluster properties (\\X, which the streaming
decoder holds the last cluster back by), the INERT code points (tokenizers' older Unicode), and this Python's
unicodedata (canonical decompositions, combining classes, primary composites) for NFC, and this Python's
str.isidentifier as XID_Start / XID_Continue runs and str.isprintable (csrc/native/api.c's
chat_template_kwargs key check and its repr() of what an error message quotes).

    python tests/reference/make_native_tok_tables.py      # rewrites csrc/native/tok_unicode.h
"""
from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import regex

from ignis.tokenizer import _unicode_tables as t
from make_tokenizer_golden import ranges  # beside this file

OUT = Path(__file__).resolve().parents[2] / "csrc" / "native" / "tok_unicode.h"
N_CP = 0x110000
BLOCK = 256

P_L, P_N, P_WS, P_RUSTNUM, P_WORD, P_INERT, P_NFC_MAYBE = 1, 2, 4, 8, 16, 32, 64
# Grapheme_Cluster_Break values (low 4 bits), Extended_Pictographic (16), Indic_Conjunct_Break (32*k)
GCB = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend", "SpacingMark",
       "L", "V", "T", "LV", "LVT"]
INCB = ["None", "Consonant", "Extend", "Linker"]


def expand(ranges):
    out = set()
    for a, b in ranges:
        out.update(range(a, b + 1))
    return out


def two_stage(values: bytearray, name: str) -> str:
    """A stage-1 index per 256 code points into deduplicated 256-entry stage-2 blocks."""
    blocks: dict[bytes, int] = {}
    index = []
    for start in range(0, N_CP, BLOCK):
        blk = bytes(values[start:start + BLOCK])
        index.append(blocks.setdefault(blk, len(blocks)))
    lines = [f"static const uint16_t {name}_index[{len(index)}] = {{"]
    for i in range(0, len(index), 24):
        lines.append("  " + ",".join(map(str, index[i:i + 24])) + ",")
    lines.append("};")
    lines.append(f"static const uint8_t {name}_blocks[{len(blocks)}][{BLOCK}] = {{")
    for blk in blocks:
        lines.append("  {" + ",".join(map(str, blk)) + "},")
    lines.append("};")
    return "\n".join(lines)


def range_table(runs: list[tuple[int, int]], name: str, what: str) -> str:
    lines = [f"#define {name.upper()}_N {len(runs)}",
             f"static const uint32_t {name}[{len(runs)}][2] = {{  /* {what}: first, last; sorted */"]
    for i in range(0, len(runs), 8):
        lines.append("  " + ",".join(f"{{{a},{b}}}" for a, b in runs[i:i + 8]) + ",")
    lines.append("};")
    return "\n".join(lines)


def main() -> None:
    if unicodedata.unidata_version != t.PROBED_UNIDATA_VERSION:
        sys.exit(f"this Python's Unicode is {unicodedata.unidata_version}, ignis's INERT table was "
                 f"probed against {t.PROBED_UNIDATA_VERSION}: run with a matching Python")
    everything = "".join(chr(c) for c in range(N_CP) if not 0xD800 <= c < 0xE000)
    ws = {ord(c) for c in regex.findall(r"\s", everything)}
    word = {ord(c) for c in regex.findall(r"[\p{Alphabetic}\p{N}]", everything)}
    props = bytearray(N_CP)
    for bit, cps in ((P_L, expand(t.ONIG_L)), (P_N, expand(t.ONIG_N)), (P_WS, ws),
                     (P_RUSTNUM, expand(t.RUST_NUMERIC)), (P_WORD, word), (P_INERT, expand(t.INERT))):
        for c in cps:
            props[c] |= bit
    gcb = bytearray(N_CP)
    for k, name in enumerate(GCB[1:], 1):
        for ch in regex.findall(rf"\p{{Grapheme_Cluster_Break={name}}}", everything):
            gcb[ord(ch)] = k
    for ch in regex.findall(r"\p{Extended_Pictographic}", everything):
        gcb[ord(ch)] |= 16
    for k, name in enumerate(INCB[1:], 1):
        for ch in regex.findall(rf"\p{{Indic_Conjunct_Break={name}}}", everything):
            gcb[ord(ch)] |= 32 * k
    ccc = bytearray(N_CP)
    decomp: list[tuple[int, list[int]]] = []
    pairs: list[tuple[int, int, int]] = []
    for c in range(N_CP):
        if 0xD800 <= c < 0xE000 or 0xAC00 <= c <= 0xD7A3:      # Hangul syllables: algorithmic
            continue
        ch = chr(c)
        ccc[c] = unicodedata.combining(ch)
        d = unicodedata.normalize("NFD", ch)
        if d != ch:
            decomp.append((c, [ord(x) for x in d]))
        raw = unicodedata.decomposition(ch)
        if raw and not raw.startswith("<"):
            parts = [int(x, 16) for x in raw.split()]
            if len(parts) == 2 and unicodedata.normalize("NFC", ch) == ch:
                pairs.append((parts[0], parts[1], c))
    pairs.sort()
    # NFC may change text holding one of these (else a run of them is its own NFC): a combining
    # mark, a character NFC changes alone, the second of a composition (Hangul V and T too), or one
    # whose decomposition starts with such a second.
    seconds = {b for _, b, _ in pairs} | set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for c in range(N_CP):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        if (ccc[c] or c in seconds or unicodedata.normalize("NFC", ch) != ch
                or ord(unicodedata.normalize("NFD", ch)[0]) in seconds):
            props[c] |= P_NFC_MAYBE
    # str.isidentifier (chat_template_kwargs keys): XID_Start or "_" first, XID_Continue after
    xid_start = ranges(c for c in range(N_CP) if chr(c).isidentifier())
    xid_continue = ranges(c for c in range(N_CP) if ("a" + chr(c)).isidentifier())
    # str.isprintable (what repr() shows as it is rather than escaped), for the error messages
    unprintable = ranges(c for c in range(N_CP) if not chr(c).isprintable())
    pool: list[int] = []
    entries = []
    for c, d in decomp:
        entries.append((c, len(pool), len(d)))
        pool.extend(d)
    parts = [
        "/* Generated by tests/reference/make_native_tok_tables.py -- do not edit.",
        f"   Unicode data of Python's unicodedata {unicodedata.unidata_version} and ignis/tokenizer/"
        "_unicode_tables.py (tokenizers' Oniguruma classes). */",
        "#ifndef IG_TOK_UNICODE_H", "#define IG_TOK_UNICODE_H", "#include <stdint.h>",
        f"enum {{ TP_L = {P_L}, TP_N = {P_N}, TP_WS = {P_WS}, TP_RUSTNUM = {P_RUSTNUM}, "
        f"TP_WORD = {P_WORD}, TP_INERT = {P_INERT}, TP_NFC_MAYBE = {P_NFC_MAYBE} }};",
        "enum { " + ", ".join(f"GCB_{n.upper()} = {k}" for k, n in enumerate(GCB))
        + ", GCB_EXTPICT = 16, " + ", ".join(f"INCB_{n.upper()} = {32 * k}" for k, n in enumerate(INCB))
        + " };",
        two_stage(props, "tok_prop"), two_stage(ccc, "tok_ccc"), two_stage(gcb, "tok_gcb"),
        f"#define TOK_N_DECOMP {len(entries)}",
        "static const uint32_t tok_decomp[TOK_N_DECOMP][3] = {  /* code point, start, length */",
        "\n".join(f"  {{{c},{s},{n}}}," for c, s, n in entries), "};",
        f"static const uint32_t tok_decomp_pool[{len(pool)}] = {{",
        "\n".join("  " + ",".join(map(str, pool[i:i + 16])) + "," for i in range(0, len(pool), 16)), "};",
        f"#define TOK_N_COMPOSE {len(pairs)}",
        "static const uint32_t tok_compose[TOK_N_COMPOSE][3] = {  /* first, second, composite; sorted */",
        "\n".join(f"  {{{a},{b},{c}}}," for a, b, c in pairs), "};",
        range_table(xid_start, "tok_xid_start", "XID_Start and '_'"),
        range_table(xid_continue, "tok_xid_continue", "XID_Continue"),
        range_table(unprintable, "tok_unprintable", "not str.isprintable"), "#endif", ""]
    OUT.write_text("\n".join(parts))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {len(entries)} decompositions, "
          f"{len(pairs)} compositions")


if __name__ == "__main__":
    main()
