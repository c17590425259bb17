"""Prefill and decode speed: ignis (f32, q8, q4, and gguf: the shipped file's own blocks) beside
llama.cpp (llama-cpp-python: the shipped GGUF and its Q8_0 / Q4_0 requantizations) and PyTorch
transformers (f32, bf16) on the same model.

    python benchmarks/bench_generate.py [--model qwen2.5-coder-0.5b-instruct] [--runs 3] [--threads 2]
                                        [--cases "ignis q8,llama.cpp Q8_0"] [--write FILE.md]
                                        [--tables avx2,avx512_vnni] [--decode-only]
                                        [--compare DIR] [--kv auto|f32|f16]

Every case runs in a fresh process (so peak RSS is its own), the cases interleaved run by run so that
machine drift hits all of them alike. In each process: load, one warm-up step, then
  prefill 128 / 512   one forward pass over a prompt of that many tokens, empty cache   -> tokens/s
  decode 128          greedy, one token per step after a 16-token prompt               -> tokens/s
Every engine is driven the same way: forward, argmax, feed back (no sampling, no detokenizing).
ignis stores its KV cache as ignis.load does by default (--kv auto: f16 on the AVX-512 and AVX2
tables, f32 with f32 weights or on the other tables; the KV column says which ran); --kv f32 is
the setting of the RESULTS.md sections written before this option existed (and, on the avx2
table, of those before 2026-12-03).
llama.cpp runs with flash attention, n_batch 512 and as many threads as ignis. Its Q8_0, Q4_0,
Q5_K_M and Q3_K_M files are made once from the shipped GGUF by llama.cpp's own quantizer
(IGNIS_HOME/peers/); the shipped file is already quantized, so they have the bits per weight of
such a file (what speed depends on), not the accuracy of one made from f16. "ignis gguf Q5_K_M"
runs ignis on the same file as "llama.cpp Q5_K_M" (imported before the timed runs).
--tables runs every ignis case once per kernel table ("ignis gguf @avx2": IGNIS_KERNELS=avx2 in that
process), and adds a table of each format's speed under every kernel table as a ratio to the last
table named (e.g. how far AVX2 is behind AVX-512 VNNI on this machine).
--decode-only skips the prefill passes (decode figures of many fresh processes, quicker). --compare
DIR runs every ignis case a second time with the ignis package in DIR (PYTHONPATH=DIR: say, a copy
of the package built from main), as "CASE [DIR's name]", interleaved with the others.
Prints medians per case, decode's min / median / max over the runs, and the ratio of each case to a baseline (ignis q8 by default); peers
missing from this machine (torch, llama-cpp-python not installed) are listed as skipped, not
guessed. --write also saves the table with machine, versions, flags and date as Markdown.

Building the llama.cpp peer the fast way (clang 14 with OpenMP; AMX flags for CPUs that have AMX):
    apt-get install clang-14 libomp-14-dev
    CC=clang-14 CXX=clang++-14 CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=ON \
      -DCMAKE_C_FLAGS='-mamx-tile -mamx-int8 -mamx-bf16 -D__AMX_TILE__ -D__AMX_INT8__ -D__AMX_BF16__' \
      -DCMAKE_CXX_FLAGS='-mamx-tile -mamx-int8 -mamx-bf16 -D__AMX_TILE__ -D__AMX_INT8__ -D__AMX_BF16__'" \
      pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36
(gcc 12 with native flags builds a library that dies with SIGILL on AMX CPUs.)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

PREFILL = (128, 512)
DECODE = 128

RUNNER = r'''
import json, sys, time
import numpy as np
case, model_name, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
t0 = time.perf_counter()
if case.startswith("llama.cpp"):
    from llama_cpp import Llama
    llm = Llama(model_path=sys.argv[4], n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                n_batch=512, n_ubatch=512, flash_attn=True, verbose=False)
    vocab = llm.n_vocab()
    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
    def prefill(ids):
        llm.reset(); llm.eval(ids.tolist())
    def decode(prompt, n):
        llm.reset(); llm.eval(prompt.tolist()); tok = int(np.argmax(last_logits()))
        t = time.perf_counter()
        for _ in range(n):
            llm.eval([tok]); tok = int(np.argmax(last_logits()))
        return time.perf_counter() - t
elif case.startswith("ignis"):
    import ignis
    from ignis.runtime.engine import Engine
    from ignis.loader.resolve import open_model
    files = open_model(sys.argv[4] or model_name, progress=False)   # argv[4]: a requantized file
    kernels = case.split("@")[1] if "@" in case else None
    eng = Engine(files, n_ctx=1024, threads=threads, weight_format=case.split()[1], kernels=kernels,
                 kv_dtype=sys.argv[6])
    kv = eng.options.kv_dtype
    vocab = files.config.vocab_size
    def prefill(ids):
        eng.reset(); return eng.forward(ids)
    def decode(prompt, n):
        eng.reset(); tok = int(np.argmax(eng.forward(prompt)[0]))
        t = time.perf_counter()
        for _ in range(n):
            tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
        return time.perf_counter() - t
else:
    import torch
    from transformers import AutoModelForCausalLM
    from ignis.loader.registry import pull
    torch.set_num_threads(threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[case.split()[1]]
    m = AutoModelForCausalLM.from_pretrained(str(pull(model_name, progress=False)), dtype=dtype)
    m.eval()
    vocab = m.config.vocab_size
    @torch.inference_mode()
    def prefill(ids):
        return m(torch.tensor(ids)[None], use_cache=True).logits
    @torch.inference_mode()
    def decode(prompt, n):
        out = m(torch.tensor(prompt)[None], use_cache=True)
        past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        t = time.perf_counter()
        for _ in range(n):
            out = m(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        return time.perf_counter() - t
load = time.perf_counter() - t0
prefill(rng.integers(0, 1000, 8))                   # warm-up: page the weights in
res = {"load_s": load, "kv": globals().get("kv")}
for n in json.loads(sys.argv[5]):
    ids = rng.integers(0, 1000, n)
    t = time.perf_counter(); prefill(ids); res[f"prefill{n}"] = n / (time.perf_counter() - t)
res["decode%(decode)d"] = %(decode)d / decode(rng.integers(0, 1000, 16), %(decode)d)
# VmHWM is this process's own high-water mark (ru_maxrss would carry the parent's over exec)
res["peak_rss_mb"] = next(int(l.split()[1]) for l in open("/proc/self/status")
                          if l.startswith("VmHWM")) / 1024
print(json.dumps(res))
''' % {"decode": DECODE}

CASES = ["ignis f32", "ignis q8", "ignis q4", "ignis gguf", "llama.cpp shipped", "llama.cpp Q8_0", "llama.cpp Q4_0",
         "ignis gguf Q5_K_M", "llama.cpp Q5_K_M", "ignis gguf Q3_K_M", "llama.cpp Q3_K_M",
         "transformers f32", "transformers bf16"]
_LLAMA_FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q3_K_M": 12, "Q5_K_M": 17}     # llama.h LLAMA_FTYPE_MOSTLY_*


def compare_cases(cases: list[str], compare: str | None, base_env: dict) -> dict[str, dict]:
    """--compare DIR: after each ignis case, insert the same case tagged " [DIR's name]", to be run
    with the ignis package in DIR (PYTHONPATH=DIR on top of base_env); returns those cases'
    environments. `case_name` strips the tag. Run them in DIR too (`case_cwd`): `python -c` puts
    the working directory ahead of PYTHONPATH, so from a checkout's root a compare case imported
    that checkout's ignis."""
    env_of: dict[str, dict] = {}
    if not compare:
        return env_of
    cmp_dir = os.path.abspath(compare)
    if not os.path.isdir(os.path.join(cmp_dir, "ignis")):
        raise SystemExit(f"--compare {compare}: no ignis package in that directory")
    tag = f" [{os.path.basename(cmp_dir.rstrip('/'))}]"
    for c in [c for c in cases if c.startswith("ignis")]:
        cases.insert(cases.index(c) + 1, c + tag)
        env_of[c + tag] = dict(base_env, PYTHONPATH=cmp_dir)
    return env_of


def case_cwd(case: str, env_of: dict[str, dict]) -> str | None:
    """Where a case runs: its --compare DIR, or here (None)."""
    return env_of[case]["PYTHONPATH"] if case in env_of else None


def case_name(case: str) -> str:
    """A case without the tag compare_cases gave it."""
    return case.split(" [")[0]


def llama_file(case: str, model: str) -> str:
    """The GGUF a llama.cpp case runs: the shipped file, or its Q8_0/Q4_0/Q5_K_M/Q3_K_M
    requantization (made once with llama.cpp's quantizer into IGNIS_HOME/peers/); "ignis gguf
    Q5_K_M" runs the same file as "llama.cpp Q5_K_M"."""
    from ignis.loader.registry import gguf_path, ignis_home
    src = gguf_path(model)
    kind = case.split()[-1]
    if kind == "shipped":
        return str(src)
    dst = ignis_home() / "peers" / f"{model}-{kind.lower()}.gguf"
    if not dst.is_file():
        import ctypes
        import llama_cpp
        dst.parent.mkdir(parents=True, exist_ok=True)
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = _LLAMA_FTYPES[kind]
        p.nthread = os.cpu_count() or 1
        p.allow_requantize = True
        tmp = dst.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(p)) != 0:
            raise SystemExit(f"llama.cpp could not quantize {src} to {kind}")
        os.replace(tmp, dst)
    return str(dst)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for dist in ("ignis", "llama-cpp-python", "torch", "transformers", "numpy"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from ignis import _core
    return f"{cpu}, {os.cpu_count()} cores, ignis kernels {_core.active_kernels()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--baseline", default="ignis q8", help="the case ratios are taken against")
    ap.add_argument("--write", default=None, metavar="FILE.md", help="also write the results here")
    ap.add_argument("--tables", default=None, help="comma-separated kernel tables to run every ignis "
                    "case under (default: only the active one)")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill passes")
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="also run every ignis case with the ignis package in DIR")
    ap.add_argument("--kv", default="auto", choices=("auto", "f32", "f16"),
                    help="the ignis cases' KV cache storage (auto, the default: what ignis.load "
                         "stores, f16 on the x86 tables; llama.cpp's default is f16)")
    args = ap.parse_args()
    prefill = [] if args.decode_only else list(PREFILL)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from: {', '.join(CASES)}")
    tables = [t.strip() for t in args.tables.split(",") if t.strip()] if args.tables else []
    if tables:
        from ignis import _core
        known = {t["name"]: t["eligible"] for t in _core.kernel_tables()}
        bad = [t for t in tables if not known.get(t)]
        if bad:
            raise SystemExit(f"kernel table(s) {bad} unknown or not eligible on this CPU; eligible: "
                             f"{', '.join(n for n, ok in known.items() if ok)}")
        cases = [f"{c} @{t}" for c in cases if c.startswith("ignis") for t in tables] + \
                [c for c in cases if not c.startswith("ignis")]
        if args.baseline not in cases:
            args.baseline = f"{args.baseline} @{tables[-1]}"
    env_of = compare_cases(cases, args.compare, dict(os.environ))
    for prefix, mods, what in (("transformers", ("torch", "transformers"), "torch/transformers"),
                               ("llama.cpp", ("llama_cpp",), "llama-cpp-python")):
        try:
            for mod in mods:
                __import__(mod)
        except ImportError:
            skipped = [c for c in cases if c.startswith(prefix)]
            cases = [c for c in cases if not c.startswith(prefix)]
            if skipped:
                print(f"skipped ({what} not installed): {', '.join(skipped)}")

    import ignis
    ignis.pull(args.model)
    on_file = lambda c: c.startswith("llama.cpp") or len(case_name(c).split(" @")[0].split()) == 3
    files = {c: llama_file(case_name(c).split(" @")[0], args.model) if on_file(c) else "" for c in cases}
    from ignis.loader.resolve import open_model
    for f in dict.fromkeys(f for c, f in files.items() if f and c.startswith("ignis")):
        open_model(f, progress=True).weights.close()     # imported once, before any timing
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(args.runs):
        for c in cases:
            out = subprocess.run([sys.executable, "-c", RUNNER, case_name(c), args.model, str(args.threads),
                                  files[c], json.dumps(prefill), args.kv], capture_output=True, text=True,
                                 timeout=1800, env=env_of.get(c), cwd=case_cwd(c, env_of))
            if out.returncode != 0:
                raise SystemExit(f"case {c!r} failed:\n{out.stderr[-3000:]}")
            results[c].append(json.loads(out.stdout.strip().splitlines()[-1]))

    head = (f"model {args.model}; {machine()}; {args.threads} threads; ignis KV cache {args.kv}; "
            f"median of {args.runs} runs, a fresh process per case and run, cases interleaved")
    kv_of = {c: rs[0].get("kv") or "-" for c, rs in results.items()}   # what each case stored
    print(head)
    keys = [f"prefill{n}" for n in prefill] + [f"decode{DECODE}"]
    med = {c: {k: statistics.median(r[k] for r in rs) for k in keys + ["load_s", "peak_rss_mb"]}
           for c, rs in results.items()}
    base = med.get(args.baseline)
    cols = "".join(f"{k + ' tok/s':>18}" for k in keys)
    print(f"{'case':<34}{cols}{'load s':>9}{'peak RSS MB':>13}{'KV':>5}")
    rows = []
    for c in cases:
        cells = [f"{med[c][k]:.1f}" + (f" ({med[c][k] / base[k]:.2f}x)" if base else "") for k in keys]
        rows.append([c] + cells + [f"{med[c]['load_s']:.2f}", f"{med[c]['peak_rss_mb']:.0f}", kv_of[c]])
        print(f"{c:<34}" + "".join(f"{x:>18}" for x in cells)
              + f"{med[c]['load_s']:>9.2f}{med[c]['peak_rss_mb']:>13.0f}{kv_of[c]:>5}")
    note = f"(ratios are against {args.baseline} in this run)" if base else "(no baseline case ran)"
    print(note)
    dk = f"decode{DECODE}"
    spread = {c: (min(r[dk] for r in rs), med[c][dk], max(r[dk] for r in rs)) for c, rs in results.items()}
    print(f"decode tok/s over the {args.runs} runs, min / median / max")
    for c in cases:
        print(f"{c:<34}" + " / ".join(f"{v:.1f}" for v in spread[c]))
    by_table = []
    if len(tables) > 1:       # per format: every table's speed as a ratio to the last table's
        ref = tables[-1]
        print(f"per format, kernel table vs {ref} (tok/s and its ratio)")
        print(f"{'format':<12}{'table':<14}" + "".join(f"{k:>18}" for k in keys))
        for c in dict.fromkeys(c.split(" @")[0] for c in cases if " @" in c):
            for t in tables:
                cells = [f"{med[f'{c} @{t}'][k]:.1f} ({med[f'{c} @{t}'][k] / med[f'{c} @{ref}'][k]:.2f}x)"
                         for k in keys]
                by_table.append([c.split()[1], t] + cells)
                print(f"{c.split()[1]:<12}{t:<14}" + "".join(f"{x:>18}" for x in cells))
    print(json.dumps({"model": args.model, "threads": args.threads, "medians": med,
                      "decode_runs": {c: [r[dk] for r in rs] for c, rs in results.items()}}))
    if args.write:
        import datetime
        from ignis import _core
        lines = [f"# bench_generate, {datetime.date.today().isoformat()}", "", head + ".", "",
                 f"Versions: {versions()}. ignis kernels `{_core.active_kernels()}`, OpenMP "
                 f"{'on' if _core.openmp_enabled() else 'off'}; llama.cpp: flash attention, "
                 f"n_batch 512.", "",
                 "| case | " + " | ".join(k + " tok/s" for k in keys) + " | load s | peak RSS MB | KV |",
                 "|---" * (len(keys) + 4) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines += ["", note, ""]
        if by_table:
            lines += [f"Per format, every kernel table against {tables[-1]}:", "",
                      "| format | kernel table | " + " | ".join(k + " tok/s" for k in keys) + " |",
                      "|---" * (len(keys) + 2) + "|"]
            lines += ["| " + " | ".join(r) + " |" for r in by_table] + [""]
        with open(args.write, "w") as f:
            f.write("\n".join(lines))


if __name__ == "__main__":
    main()
