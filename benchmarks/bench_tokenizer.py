"""Tokenizer throughput: ignis.tokenizer versus Hugging Face tokenizers, same files, same run.

    python benchmarks/bench_tokenizer.py [--family qwen2.5|smollm2|gemma3|all] [--runs 5] [--mb 1.0]

gemma3 is SentencePiece-style BPE from the real Gemma 3 270M GGUF ($IGNIS_GEMMA_GGUF, or assembled
from its packages, see tests/gemma_gguf.py); tokenizers runs the tokenizer.json ignis rebuilds from
it, which tests/test_tokenizer_gemma.py proves equal to the one transformers builds.

A mixed corpus of about 1 MB (Python source from the standard library, plus the multilingual golden
tokenizer corpus: prose, CJK, Arabic, Hindi, Cyrillic, emoji, whitespace runs, numbers) is encoded
and decoded single-threaded (TOKENIZERS_PARALLELISM=false, one call per document, and once as one
string). Prints median MB/s of each and the ratio ignis / tokenizers; ids are checked to be equal.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def mixed_corpus(mb: float) -> list[str]:
    from test_tokenizer_support import DATA, read_gz_json
    golden = [s for s in read_gz_json(DATA / "golden.json.gz")["corpus"] if s]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:400]]
    docs, size, i = [], 0, 0
    limit = int(mb * 1_000_000)
    # Interleave code files with chunks of the multilingual corpus until the byte budget is used.
    while size < limit:
        doc = code[i % len(code)] if i % 2 == 0 else "\n".join(golden[(i * 37) % len(golden):][:40])
        doc = doc[:8000]
        docs.append(doc)
        size += len(doc.encode("utf-8"))
        i += 1
    return docs


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tokenizers_of(family: str):
    """(ignis tokenizer, Hugging Face tokenizers Tokenizer) of one family, from the same files."""
    if family != "gemma3":
        from test_tokenizer_support import ours, reference
        return ours(family), reference(family)
    import json
    import tempfile

    import gguf
    import tokenizers
    from gemma_gguf import gemma_gguf
    from ignis.tokenizer import load_tokenizer, tokenizer_files_from_gguf
    with tempfile.TemporaryDirectory() as tmp:
        files = tokenizer_files_from_gguf(gguf.GGUFReader(str(gemma_gguf(Path(tmp)))))
    return (load_tokenizer(files),
            tokenizers.Tokenizer.from_str(json.dumps(files["tokenizer.json"])))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="qwen2.5", choices=["qwen2.5", "smollm2", "gemma3", "all"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=float, default=1.0)
    args = ap.parse_args()
    for family in (["qwen2.5", "smollm2", "gemma3"] if args.family == "all" else [args.family]):
        bench(family, args.runs, args.mb)


def bench(family: str, runs: int, mb_wanted: float) -> None:
    tok, ref = tokenizers_of(family)
    docs = mixed_corpus(mb_wanted)
    one = "".join(docs)
    mb = len(one.encode("utf-8")) / 1e6

    ids_ours = [tok.encode(d) for d in docs]
    ids_ref = [ref.encode(d).ids for d in docs]
    assert ids_ours == ids_ref, "ids differ from tokenizers"
    assert tok.encode(one) == ref.encode(one).ids, "ids differ from tokenizers (one string)"

    rows = [
        ("encode, per document", lambda: [tok.encode(d) for d in docs],
         lambda: [ref.encode(d) for d in docs]),
        ("encode, one string", lambda: tok.encode(one), lambda: ref.encode(one)),
        ("decode, per document", lambda: [tok.decode(i) for i in ids_ours],
         lambda: [ref.decode(i, skip_special_tokens=False) for i in ids_ref]),
    ]
    print(f"{family}: {mb:.2f} MB, {len(docs)} documents, {sum(map(len, ids_ours))} tokens, "
          f"median of {runs} runs, single-threaded")
    print(f"{'':24s} {'ignis MB/s':>11s} {'tokenizers MB/s':>16s} {'ratio':>7s}")
    for name, f_ours, f_ref in rows:
        a, b = mb / median_time(f_ours, runs), mb / median_time(f_ref, runs)
        print(f"{name:24s} {a:11.2f} {b:16.2f} {a / b:7.2f}x")


if __name__ == "__main__":
    main()
