"""The golden corpus of the SentencePiece-style tokenizers (Gemma 3, and the Llama-2-style tokenizers
trained in the tests): corpus.py's >= 2,000 strings plus what a SentencePiece tokenizer adds to the
risks: its special and user-defined tokens in context, characters with no token (byte fallback),
leading spaces (the space prefix), "▁" and "<0xNN>" written as text.

Deterministic (seeded). tests/reference/make_tokenizer_golden.py gemma stores it, with the ids
transformers' Gemma 3 tokenizer gives, in golden-gemma3.json.gz.
"""
from __future__ import annotations

import random

from corpus import CODE, EMOJI, PROSE, SCRIPTS, build_corpus

GEMMA_TOKENS = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                "<start_of_image>", "<end_of_image>", "[multimodal]", "<unused0>", "<unused6241>",
                "<table>", "</td>", "<h1>", "<code>", "</code>", "<s>", "</s>", "<bbox>"]
LLAMA_TOKENS = ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]
# Characters Gemma 3 has no token for (control characters, private use, unassigned, rare scripts).
NO_TOKEN = ["\x00", "\x04", "\x0b", "\x1e", "\ue00b", "\U00020000", "\U0002a700", "\U0010fffd",
            "\uffff", "\u0378", "\U00013000", "\ua000"]


def build_spm_corpus(seed: int = 4321) -> list[str]:
    rng = random.Random(seed)
    corpus = build_corpus()
    for t in GEMMA_TOKENS + LLAMA_TOKENS:
        corpus += [t, f" {t}", f"{t} ", f"a{t}b", f"{t}{t}", f"{t}\n\nx", f" {t} hello", t[:-1],
                   f"<start_of_turn>user\n{t}<end_of_turn>\n<start_of_turn>model\n"]
    corpus += ["<start_of_turn>user\nWrite a poem.<end_of_turn>\n<start_of_turn>model\n",
               "<bos><start_of_turn>user\nhi<end_of_turn>", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"]
    for c in NO_TOKEN:
        corpus += [c, c * 3, f"a{c}b", f" {c} ", f"{c}\u00e9{c}", f"word{c}word {c}"]
    def any_char() -> str:
        c = rng.randrange(0x80, 0x30000 - 0x800)
        return chr(c + 0x800 if c >= 0xD800 else c)        # never a surrogate
    corpus += ["".join(any_char() for _ in range(rng.randrange(1, 12))) for _ in range(150)]
    # Text spelling the tokenizer's own markers: it must stay text.
    corpus += ["\u2581", "\u2581\u2581x", "a\u2581b", "\u2581 \u2581", "<0x41>", "<0xE4><0xBD><0xA0>",
               "<0x0A>\n", "<0xZZ>", "<0x+F>", " <0x41> "]
    # Leading and trailing spaces (the space prefix), alone and before every kind of text.
    for s in [PROSE.splitlines()[0], SCRIPTS[0], EMOJI[4], next(iter(CODE.values()))]:
        for pre in (" ", "  ", "\t", "\n", " \n "):
            corpus += [pre + s, s + pre]
    seen: set[str] = set()
    out = []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
