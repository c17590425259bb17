"""The golden tokenizer corpus: >= 2,000 strings covering what tends to break a BPE tokenizer.

Deterministic (seeded). tests/reference/make_tokenizer_golden.py stores its output, with the reference
ids from Hugging Face tokenizers, in golden.json.gz; the tests read the stored strings, not this file.
"""
from __future__ import annotations

import random

PROSE = """\
The quick brown fox jumps over the lazy dog. It wasn't the first time, and it won't be the last.
In 1969, Apollo 11 landed on the Moon; Neil Armstrong said: "That's one small step for man."
She'd rather we'd gone, but they'll stay -- we've seen it all before, haven't we?
Compilers turn programs into machine code: parsing, type checking, optimisation, and code generation.
A tokenizer splits text into pieces; byte-level BPE guarantees every byte sequence can be encoded.
E-mail me at someone@example.com or visit https://example.org/path?q=1&r=two#frag for details.
Prices rose 3.5% to $1,234.56 (about EUR 1.100,00) on 2024-03-15 at 09:30:00 UTC.
WHY ARE YOU SHOUTING?! I'M NOT SHOUTING, YOU'RE SHOUTING. WE'LL SEE. THEY'VE GONE. HE'D KNOW.
Mr. O'Neil's dog -- "Rex" -- isn't allowed in the cafe\u0301; the naïve café owner's rule.
"Quotes" and 'single quotes', «guillemets», „low quotes“, and ‘curly’ “double” ones.
Bullet list:\n- one\n- two\n  - nested three\n\nNumbered:\n1. first\n2. second\n
Tabs\tseparate\tcolumns\tin\tthis\tline, and trailing spaces follow   
"""

CODE = {
    "python": '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    result, a, b = [], 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class VeryLongClassNameForTestingTokenizerBehaviourOnIdentifiers:
\tdef __init__(self):\n\t\tself._private_attribute_with_long_name = {"key": [1, 2, 3]}
''',
    "c": '''#include <stdio.h>
static int ig_rmsnorm_f32(float *out, const float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    return printf("%d\\n", n) > 0 ? 0 : -1;  /* comment */
}
''',
    "rust": '''fn main() -> Result<(), Box<dyn std::error::Error>> {
    let v: Vec<u32> = (0..10).map(|x| x * x).collect();
    println!("{:?}", v.iter().sum::<u32>());
    Ok(())
}
''',
    "javascript": '''const fetchData = async (url) => {
  const res = await fetch(url, { method: "GET" });
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  return res.json();
};
''',
    "go": '''package main

import "fmt"

func main() {
\tch := make(chan int, 3)
\tgo func() { ch <- 42 }()
\tfmt.Println(<-ch)
}
''',
    "java": '''public final class HelloWorld {
    public static void main(String[] args) {
        System.out.println("Hello, World!" + args.length);
    }
}
''',
    "sql": '''SELECT u.id, COUNT(*) AS n_orders
FROM users u LEFT JOIN orders o ON o.user_id = u.id
WHERE u.created_at >= '2024-01-01'
GROUP BY u.id HAVING COUNT(*) > 5 ORDER BY n_orders DESC;
''',
    "shell": '''#!/usr/bin/env bash
set -euo pipefail
for f in *.txt; do
  wc -l "$f" | awk '{print $1}' >> counts.log
done
''',
    "html": '''<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>T&amp;C</title></head>
<body><div class="x" id='y'>Hello &lt;world&gt;</div></body></html>
''',
}

SCRIPTS = [
    "我们今天去公园散步，天气非常好。", "机器学习模型需要大量的数据进行训练。", "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。", "東京は日本の首都です。ラーメンが好きです。",
    "한국어 텍스트입니다. 안녕하세요, 세계!", "서울은 대한민국의 수도입니다.",
    "مرحبا بالعالم، هذا اختبار للنص العربي.", "اللغة العربية تكتب من اليمين إلى اليسار.",
    "नमस्ते दुनिया, यह हिंदी पाठ का परीक्षण है।", "भारत एक विशाल देश है।",
    "Привет, мир! Это тест кириллицы.", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Україна, Беларусь, Српски језик.", "Γειά σου κόσμε! Ελληνικά γράμματα.", "שלום עולם, זה מבחן.",
    "สวัสดีชาวโลก นี่คือการทดสอบ", "Tiếng Việt có nhiều dấu: ạ ả ã ấ ầ ẩ ẫ ậ.",
    "ქართული ენა", "Հայերեն լեզու", "ᐊᓂᔑᓈᐯᒧᐎᓐ", "ⴰⵣⴰⵡⴰⵖ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒳",
]

EMOJI = [
    "😀", "👍🏽", "👍🏿", "👋🏻👋🏼👋🏽👋🏾👋🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "❤️", "❤", "✌️",
    "🇺🇸🇯🇵🇩🇪", "1️⃣#️⃣", "🧑‍🤝‍🧑", "🫠🫡🥹", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "I ❤️ NY 🗽!", "emoji😀inside😀words",
]

COMBINING = [
    "e\u0301", "a\u0300\u0301\u0302\u0303", "n\u0303o", "Z\u0351\u0352\u0353\u0354a\u0355\u0356l\u0357g\u0358o",
    "cafe\u0301 vs café", "A\u030a vs Å vs \u212b", "\u1100\u1161\u11a8", "각", "ﬁ ligature ﬀ",
    "q\u0307\u0323", "o\u0328\u0304", "\u0915\u094d\u0937", "a\u07f3\u07fd", "\u0d3b\u0d3c x",
    "x\u1ac0\u0301", "\u0301 leading mark", "Ω \u2126 K \u212a", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
]

WHITESPACE_CHARS = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u200b",
                    "\u2009", "\u202f", "\u0085", "\x0b", "\x0c", "\u1680", "\ufeff"]

NUMBERS = [
    "0", "7", "42", "123", "1234", "12345", "123456789012345678901234567890", "3.14159", "-2.5e-10",
    "1,000,000", "1 000 000", "0x1F", "0b1010", "+1 (555) 123-4567", "2024-03-15T09:30:00Z", "v1.2.3",
    "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "１２３", "²³¹", "½ ¾ ⅓", "Ⅻ ⅻ", "①②③", "𝟏𝟐𝟑", "一二三", "12abc34def",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]


def _specials() -> list[str]:
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>", "<|repo_name|>",
            "<|vision_start|>", "<repo_name>", "<file_sep>", "<jupyter_code>", "<empty_output>",
            "<gh_stars>", "<issue_start>"]
    out = []
    for t in toks:
        out += [t, f"a{t}b", f" {t} ", f"\n{t}\n", f"{t}{t}", f"text {t}more", f"{t}\n\nuser",
                t[:-1], t[1:], f"<{t}>", t.upper()]
    out += [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|im_start|><|im_end|><|endoftext|>", "<|im_start <|im_end|>", "<<|im_start|>|>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<|endoftext|>" * 5, "x<|endoftext|> <|endoftext|>  <|endoftext|>\n",
    ]
    return out


def build_corpus(seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    corpus: list[str] = []
    lines = PROSE.splitlines()
    corpus += lines + [PROSE]
    corpus += [ln.upper() for ln in lines] + [ln.lower() for ln in lines] + [ln.title() for ln in lines]
    for src in CODE.values():
        corpus.append(src)
        corpus += src.splitlines()
        corpus.append(src.replace("    ", "\t"))
        corpus.append(src.replace("\n", "\r\n"))
    corpus += SCRIPTS + [s + " " + t for s, t in zip(SCRIPTS, SCRIPTS[1:])]
    corpus += EMOJI + ["".join(EMOJI)] + [f"a{e}b {e} {e}{e}" for e in EMOJI]
    corpus += COMBINING + [c.upper() for c in COMBINING]
    # Every ASCII control character, alone and in context.
    for c in range(0x20):
        ch = chr(c)
        corpus += [ch, f"a{ch}b", f"word{ch}", f" {ch} ", ch * 3, f"1{ch}2"]
    corpus += ["\x7f", "a\x7fb", "".join(chr(c) for c in range(0x80)), "".join(chr(c) for c in range(0x80, 0x100))]
    # Whitespace runs of every kind and length, leading, trailing, between words.
    for w in WHITESPACE_CHARS:
        for n in (1, 2, 3, 5, 8, 17):
            corpus += [w * n, f"a{w * n}b", f"{w * n}x", f"x{w * n}", f"x{w * n}\n y"]
    for n in range(1, 12):
        corpus += [" " * n + "\n" * (n % 3 + 1) + "\t" * (n % 2) + "end", "foo" + " " * n, "\n" * n]
    corpus += ["  \n  \n", " \r\n \r\n", "a \n b", "a\n\n\n\nb", "\t\t\tx", "x \t \n \u00a0 y \u3000 z "]
    # Numbers, digit splitting.
    for num in NUMBERS:
        corpus += [num, f"x{num}y", f" {num} ", f"{num}.", f"${num}"]
    corpus += [str(rng.randrange(10 ** rng.randrange(1, 25))) for _ in range(60)]
    # Contractions in every case.
    for c in CONTRACTIONS:
        for v in (c, c.upper(), c.capitalize(), c.swapcase()):
            corpus += [f"it{v}", f"IT{v} fine", f"{v}", f" {v}x", f"don{v}"]
    corpus += ["I'M", "you’re", "it\u2019s", "ſ's", "'S", "''s", "'ll've", "WE'LL'VE"]
    corpus += _specials()
    # Very long inputs.
    corpus += [PROSE * 8, "a" * 10000, " " * 3000, "1" * 2000, "😀" * 500, "\n" * 1000,
               "ab" * 3000, "x" * 500 + " " + "y" * 500, "".join(CODE.values()) * 2,
               "".join(SCRIPTS) * 3, "supercalifragilistic" * 100]

    # Random mixtures of everything above, to fill the corpus and catch interactions.
    pools = [lines, SCRIPTS, EMOJI, COMBINING, WHITESPACE_CHARS, NUMBERS, CONTRACTIONS, _specials(),
             [ln for src in CODE.values() for ln in src.splitlines()]]
    while len(corpus) < 2400:
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randrange(1, 6))]
        joiner = rng.choice(["", " ", "\n", "\t", "  "])
        s = joiner.join(parts)
        if rng.random() < 0.1:
            s = s.upper()
        corpus.append(s)
    corpus.append("")
    seen: set[str] = set()
    out = []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
