"""Structured outputs: grammar engines side by side on ignis's own vocabulary, and what a schema
costs ignis's decode.

    python benchmarks/bench_structured.py [--model qwen2.5-coder-0.5b-instruct] [--runs 3]
                                          [--weights gguf] [--gemma3] [--skip-engines]
                                          [--skip-coverage] [--skip-decode]

1. Engines. Each installed engine among llguidance (what ignis uses), xgrammar and outlines-core
   gets the same vocabulary: every id's bytes from ignis's tokenizer of the model (151,936 ids for
   the default model). For a few JSON Schemas it compiles the grammar (timed), then walks a valid
   answer token by token (ignis's tokenization of it), `--runs` times from a fresh state made from
   the compiled grammar: the mask of allowed ids is computed into a bitmask before each token
   (timed: mask us/token) and the token is accepted (timed with it: mask+accept). Printed: compile
   ms, mean (and the first walk's, with the engine's lazy caches cold) / median / p99 / max us per
   token, per engine and schema, and over all tokens. Then which schemas of the test corpus each engine compiles, and
   whether it refuses the keywords it cannot enforce. "ignis" is llguidance as ignis drives it (GrammarConstraint:
   mask, unpack to one bool per id, -inf into float64 logits, accept), the whole per-token cost
   inside the sampler.
2. Decode. The model answers the same chat prompt greedily with a JSON Schema (an array of
   objects, long enough to time) and without one (the same number of tokens, ignore_eos);
   interleaved runs; median decode tok/s of each and the ratio (the goal: >= 0.85).

Engines other than llguidance are optional peers: `pip install outlines-core`, and xgrammar
without its dependencies (`pip install --no-deps xgrammar apache-tvm-ffi`; it needs torch, never
install torch unpinned here: torch==2.13.0).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMAS = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"}, "admin": {"type": "boolean"}},
        "required": ["name", "age", "email", "admin"], "additionalProperties": False},
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "admin": True}),
    "order": ({"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 10, "items": {
            "type": "object", "properties": {"sku": {"type": "string"},
                                             "qty": {"type": "integer", "minimum": 1},
                                             "price": {"type": "number", "minimum": 0}},
            "required": ["sku", "qty", "price"], "additionalProperties": False}},
        "note": {"type": ["string", "null"]}},
        "required": ["id", "status", "items", "note"], "additionalProperties": False},
        {"id": "ORD-123456", "status": "shipped", "items": [
            {"sku": "widget-blue", "qty": 3, "price": 9.99},
            {"sku": "gadget", "qty": 1, "price": 120.5}], "note": None}),
    "tree_defs": ({"$defs": {"node": {"type": "object", "properties": {
        "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["label", "children"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
        {"label": "root", "children": [{"label": "left leaf", "children": []},
                                       {"label": "right", "children": [{"label": "x", "children": []}]}]}),
    "code_review": ({"type": "object", "properties": {
        "summary": {"type": "string"},
        "issues": {"type": "array", "items": {"type": "object", "properties": {
            "line": {"type": "integer"}, "severity": {"enum": ["info", "warning", "error"]},
            "message": {"type": "string"}}, "required": ["line", "severity", "message"],
            "additionalProperties": False}},
        "approve": {"type": "boolean"}}, "required": ["summary", "issues", "approve"],
        "additionalProperties": False},
        {"summary": "The function reverses a string but ignores Unicode grapheme clusters.",
         "issues": [{"line": 3, "severity": "warning", "message": "s[::-1] splits combining marks"},
                    {"line": 7, "severity": "info", "message": "Add a docstring."}],
         "approve": False}),
}

DECODE_SCHEMA = {"type": "array", "minItems": 12, "maxItems": 12, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                     "language": {"enum": ["Python", "C", "Rust", "Go", "Java"]},
                                     "year": {"type": "integer", "minimum": 1950, "maximum": 2030}},
    "required": ["name", "language", "year"], "additionalProperties": False}}
DECODE_PROMPT = [{"role": "user", "content": "List twelve programming tools as JSON: name, language "
                                             "they are written in, and the year they appeared."}]


def answer_text(value) -> str:
    # the compact separators ignis's grammar uses (constrain._JSON_OPTIONS)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def stats_us(ts: list[float]) -> dict[str, float]:
    us = np.asarray(ts) * 1e6
    return {"mean": float(us.mean()), "median": float(np.median(us)),
            "p99": float(np.percentile(us, 99)), "max": float(us.max()), "n": len(us)}


# ---- the engines -----------------------------------------------------------------------------

class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab_size: int, eos: list[int]):
        import llguidance.numpy  # noqa: F401  (the bitmask helpers)
        from ignis.generate.constrain import Constrainer
        self.c = Constrainer(tok, vocab_size, eos)
        t0 = time.perf_counter()
        import llguidance as llg
        self.llg = llg
        self.tok = self.c._engine_tokenizer(llg)
        self.setup_s = time.perf_counter() - t0
        self.bits = np.zeros((1, (vocab_size + 31) // 32), np.int32)

    def compile(self, schema):
        from ignis.generate.constrain import _JSON_OPTIONS
        g = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def start(self, m):
        return m.deep_copy()

    def mask(self, m):
        self.llg.numpy.fill_next_token_bitmask(m, self.bits)

    def accept(self, m, t):
        assert m.consume_token(t), m.get_error()


class IgnisConstraint:
    """llguidance as the sampler drives it: GrammarConstraint.mask() on float64 logits."""
    name = "ignis (llguidance + apply)"

    def __init__(self, tok, vocab_size: int, eos: list[int]):
        from ignis.generate.constrain import Constrainer
        self.c = Constrainer(tok, vocab_size, eos)
        t0 = time.perf_counter()
        import llguidance as llg
        self.c._engine_tokenizer(llg)
        self.setup_s = time.perf_counter() - t0
        self.x = np.zeros(vocab_size, np.float64)

    def compile(self, schema):
        from ignis.generate.constrain import GrammarSpec
        self.c._cache.clear()              # time a real compile, not a cache hit
        spec = GrammarSpec("json_schema", schema, "bench")
        self.c.compile(spec)
        return spec

    def start(self, spec):
        return self.c.compile(spec)        # a cache hit: a copy, as a repeated request gets

    def mask(self, con):
        con.mask(self.x)

    def accept(self, con, t):
        con.accept(t)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab_size: int, eos: list[int]):
        import xgrammar as xgr
        self.xgr = xgr
        valid = tok.token_mask(vocab_size)
        t0 = time.perf_counter()
        # special ids get bytes no text can spell, as llguidance marks them
        special = set(tok.special_ids)
        vocab = [(b"\xff" + tok.token_bytes(i) if i in special else tok.token_bytes(i))
                 if valid[i] else b"" for i in range(vocab_size)]
        info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=eos)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.setup_s = time.perf_counter() - t0
        self.bits = xgr.allocate_token_bitmask(1, vocab_size)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                 separators=(", ", ": "))

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m):
        m.fill_next_token_bitmask(self.bits)

    def accept(self, m, t):
        assert m.accept_token(t)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, vocab_size: int, eos: list[int]):
        import outlines_core
        self.oc = outlines_core
        valid = tok.token_mask(vocab_size)
        t0 = time.perf_counter()
        table: dict[bytes, list[int]] = {}
        for i in range(vocab_size):
            if valid[i] and i not in tok.special_ids and i not in eos:
                table.setdefault(tok.token_bytes(i), []).append(i)
        self.vocab = outlines_core.Vocabulary(eos[0], table)
        self.setup_s = time.perf_counter() - t0
        self.bits = np.zeros((1, (vocab_size + 31) // 32), np.int32)

    def compile(self, schema):
        from outlines_core.json_schema import build_regex_from_schema
        regex = build_regex_from_schema(json.dumps(schema), r"[ ]?")
        return self.oc.Index(regex, self.vocab)

    def start(self, index):
        return self.oc.Guide(index)

    def mask(self, g):
        g.write_mask_into(self.bits.ctypes.data, self.bits.size, 4)

    def accept(self, g, t):
        g.advance(t)


ENGINES = (LLGuidance, IgnisConstraint, XGrammar, OutlinesCore)


def gemma3_tokenizer():
    """ignis's tokenizer of the real Gemma 3 270M GGUF (as benchmarks/bench_tokenizer.py reads it)."""
    import tempfile

    import gguf
    sys.path.insert(0, str(ROOT / "tests"))
    from gemma_gguf import gemma_gguf
    from ignis.tokenizer import load_tokenizer, tokenizer_files_from_gguf
    with tempfile.TemporaryDirectory() as tmp:
        files = tokenizer_files_from_gguf(gguf.GGUFReader(str(gemma_gguf(Path(tmp)))))
    return load_tokenizer(files)


class _ByteTokenizer:
    """256 one-byte tokens and an end token: enough to ask an engine which schemas it compiles."""
    special_ids = frozenset({256})
    bos_token_id = None

    def token_mask(self, n: int) -> list[bool]:
        return [True] * n

    def token_bytes(self, i: int) -> bytes:
        return bytes([i]) if i < 256 else b"<end>"

    def encode(self, text: str, **_: object) -> list[int]:
        return list(text.encode("utf-8"))


def bench_coverage() -> None:
    """Which of the test corpus's schemas each engine compiles, and what it does with keywords
    none of them enforces: refused (what ignis needs, to answer 400) or accepted (and then
    silently not enforced)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from structured_schemas import SCHEMAS as CORPUS, UNSUPPORTED
    print(f"\nJSON Schema coverage: the {len(CORPUS)} schemas of tests/structured_schemas.py, and "
          f"{len(UNSUPPORTED)} keywords no engine here enforces")
    for cls in (LLGuidance, XGrammar, OutlinesCore):
        try:
            eng = cls(_ByteTokenizer(), 257, [256])
        except ImportError:
            continue
        failed = []
        for name, schema in CORPUS.items():
            try:
                eng.compile(schema)
            except Exception as e:
                failed.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:60]})")
        refused, accepted = [], []
        for kw, schema in UNSUPPORTED.items():
            try:
                eng.compile(schema)
                accepted.append(kw)
            except Exception:
                refused.append(kw)
        print(f"  {cls.name:14s} compiles {len(CORPUS) - len(failed)}/{len(CORPUS)}"
              f"{'; fails ' + '; '.join(failed) if failed else ''}")
        print(f"  {'':14s} unsupported keywords refused: {', '.join(refused) or 'none'}; "
              f"accepted silently: {', '.join(accepted) or 'none'}")


def bench_engines(tok, vocab_size: int, eos: list[int], runs: int,
                  only: set[str] | None = None) -> list[dict]:
    rows = []
    walks = {name: tok.encode(answer_text(doc), add_special_tokens=False)
             for name, (_, doc) in SCHEMAS.items()}
    for cls in ENGINES:
        if only and cls.name.split()[0] not in only:
            continue
        try:
            eng = cls(tok, vocab_size, eos)
        except ImportError as e:
            print(f"{cls.name}: not installed ({e}); skipped")
            continue
        except Exception as e:       # an engine that cannot take this vocabulary is a result too
            print(f"{cls.name}: failed to set up ({type(e).__name__}: {e}); skipped")
            continue
        print(f"{cls.name}: vocabulary set up in {eng.setup_s * 1e3:.0f} ms", flush=True)
        all_mask, all_step = [], []
        for name, (schema, _) in SCHEMAS.items():
            mask_t, step_t, cold = [], [], []
            try:
                t0 = time.perf_counter()
                compiled = eng.compile(schema)
                compile_s = time.perf_counter() - t0
                for run in range(runs):
                    m = eng.start(compiled)
                    for t in walks[name]:
                        t0 = time.perf_counter()
                        eng.mask(m)
                        t1 = time.perf_counter()
                        eng.accept(m, t)
                        t2 = time.perf_counter()
                        mask_t.append(t1 - t0)
                        step_t.append(t2 - t0)
                        if run == 0:
                            cold.append(t1 - t0)
            except Exception as e:
                print(f"  {name}: failed ({type(e).__name__}: {str(e)[:120]})")
                continue
            ms, ss = stats_us(mask_t), stats_us(step_t)
            all_mask += mask_t
            all_step += step_t
            rows.append({"engine": cls.name, "schema": name, "compile_ms": compile_s * 1e3,
                         "mask": ms, "step": ss})
            print(f"  {name:12s} compile {compile_s * 1e3:8.1f} ms  mask us/token mean "
                  f"{ms['mean']:6.1f} (first walk {np.mean(cold) * 1e6:6.1f}) median "
                  f"{ms['median']:6.1f} p99 {ms['p99']:7.1f} max {ms['max']:7.1f}  mask+accept mean "
                  f"{ss['mean']:6.1f} ({len(walks[name])} tokens x {runs})", flush=True)
        if all_mask:
            ms, ss = stats_us(all_mask), stats_us(all_step)
            rows.append({"engine": cls.name, "schema": "ALL", "mask": ms, "step": ss})
            print(f"  {'all tokens':12s}                      mask us/token mean {ms['mean']:7.1f} "
                  f"median {ms['median']:7.1f} p99 {ms['p99']:8.1f}   mask+accept mean {ss['mean']:7.1f}")
    return rows


# ---- decode with and without a schema ------------------------------------------------------------

def bench_decode(model_name: str, weights: str, runs: int) -> None:
    import ignis
    m = ignis.load(model_name, weight_format=weights, progress=False)
    rf = {"type": "json_schema", "json_schema": {"name": "tools", "schema": DECODE_SCHEMA}}
    m.chat(DECODE_PROMPT, max_tokens=8, temperature=0)          # warm: conversion, caches
    first = m.chat(DECODE_PROMPT, temperature=0, response_format=rf)
    n = first.completion_tokens
    if first.finish_reason == "stop":
        json.loads(first.text)
    print(f"\ndecode, {model_name} {weights}, greedy, {n} tokens per answer "
          f"(finish_reason {first.finish_reason}); answer starts {first.text[:80]!r}")
    free, constrained = [], []
    for _ in range(runs):
        m.reset()                   # same prompt work for both: no cached prefix
        r = m.chat(DECODE_PROMPT, max_tokens=n, temperature=0, ignore_eos=True)
        free.append(r.completion_tokens / r.generate_seconds)
        m.reset()
        r = m.chat(DECODE_PROMPT, temperature=0, response_format=rf)
        constrained.append(r.completion_tokens / r.generate_seconds)
    a, b = statistics.median(free), statistics.median(constrained)
    print(f"  without a schema: {a:6.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in free)})")
    print(f"  with the schema:  {b:6.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in constrained)})")
    print(f"  ratio with/without: {b / a:.3f}  (goal >= 0.85)")
    m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                    help="a registry name or a model directory")
    ap.add_argument("--weights", default="gguf", help="weight format of the decode runs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-coverage", action="store_true")
    ap.add_argument("--engines", default="", metavar="A,B",
                    help="only these of llguidance, ignis, xgrammar, outlines-core (default: all "
                         "installed)")
    ap.add_argument("--gemma3", action="store_true",
                    help="also the engines on Gemma 3's 262,144-id SentencePiece vocabulary (its "
                         "GGUF from the gemma3-270m packages or $IGNIS_GEMMA_GGUF; default: off)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}{' (a busy machine: compare within this run only)' if load > 1.5 else ''}")
    if not args.skip_engines:
        import ignis
        from ignis.api.model import stop_token_ids
        from ignis.loader.resolve import open_dir
        from ignis.tokenizer import load_tokenizer
        path = Path(args.model) if Path(args.model).is_dir() else ignis.pull(args.model)
        files = open_dir(path, name=args.model, progress=False)
        tok = load_tokenizer(path)
        eos = list(stop_token_ids(files.generation_config, tok))
        vocab = files.config.vocab_size
        print(f"{args.model}: vocabulary {vocab} ids ({tok.vocab_size} with tokens), end ids {eos}")
        only = {e.strip() for e in args.engines.split(",") if e.strip()} or None
        bench_engines(tok, vocab, eos, args.runs, only)
        if args.gemma3:
            tok = gemma3_tokenizer()
            eos = [i for i in (tok.eos_token_id, tok.token_to_id("<end_of_turn>")) if i is not None]
            print(f"\ngemma3: vocabulary {tok.vocab_size} ids (SentencePiece, byte fallback), "
                  f"end ids {eos}")
            bench_engines(tok, tok.vocab_size, eos, args.runs, only)
    if not args.skip_coverage:
        bench_coverage()
    if not args.skip_decode:
        bench_decode(args.model, args.weights, args.runs)


if __name__ == "__main__":
    main()
