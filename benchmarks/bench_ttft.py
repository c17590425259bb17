"""Time to first token from a fresh process: ignis beside llama.cpp on an already converted model.

    python benchmarks/bench_ttft.py [--model qwen2.5-coder-0.5b-instruct] [--runs 5] [--threads 2]
                                    [--cases ...] [--compare DIR]

Each run starts a new Python process that imports the engine, loads the model (ignis: weights
already imported and converted in IGNIS_HOME, as after a first use; llama.cpp: the GGUF file),
applies the chat template to one user message, prefills it and produces one greedy token, then
prints it. The figure is the wall time the parent sees from starting the process to reading that
token: interpreter start, imports, load, tokenizer, template and prefill. Cases interleaved run by
run; medians and each case's ratio to llama.cpp on the shipped file are printed.

The processes run as an installed package does: with bytecode caches (PYTHONDONTWRITEBYTECODE is
removed from their environment) and after one unmeasured run of each case, which writes the .pyc
files of a first import and reads the model's files into the page cache. --compare DIR runs every
ignis case again with the ignis package in DIR (another checkout: before and after a change, in
the same run), with an IGNIS_HOME of its own for the tables it derives (tokenizer, compiled step)
that links this one's models and conversions.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MESSAGES = [{"role": "user", "content": "Write a Python function that checks whether a string is a "
                                        "palindrome, ignoring case and punctuation."}]

RUNNER = r'''
import sys
case, model, threads, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
messages = %(messages)r
if case.startswith("ignis"):
    import ignis
    m = ignis.load(model, weight_format=case.split()[1], threads=threads, n_ctx=1024, progress=False)
    r = m.chat(messages, max_tokens=1, temperature=0)
    print(repr(r.text), flush=True)
else:
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                flash_attn=True, verbose=False)
    r = llm.create_chat_completion(messages, max_tokens=1, temperature=0)
    print(repr(r["choices"][0]["message"]["content"]), flush=True)
''' % {"messages": MESSAGES}

CASES = ["ignis q8", "ignis q4", "ignis gguf", "ignis f32", "llama.cpp shipped", "llama.cpp Q8_0"]


def mirror_home(dst: Path) -> Path:
    """dst as an IGNIS_HOME that shares this one's models, kept GGUF files and conversions (links)
    but not its tokenizer tables or compiled steps (model directories reached through the link
    have another path, so their tokenizer tables are separate files)."""
    from ignis.paths import ignis_home
    src = ignis_home()
    for sub in ("models", "gguf", "convert", "peers", "locks"):
        if (src / sub).exists():
            (dst / sub).symlink_to(src / sub, target_is_directory=True)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="also run every ignis case with the ignis package in DIR")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    from bench_generate import case_cwd, case_name, compare_cases, llama_file, machine

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    try:
        import llama_cpp  # noqa: F401 - only whether it is installed
    except ImportError:
        print("skipped (llama-cpp-python not installed): "
              + ", ".join(c for c in cases if c.startswith("llama.cpp")))
        cases = [c for c in cases if not c.startswith("llama.cpp")]
    import ignis
    ignis.pull(args.model)
    for c in cases:                     # convert once up front: the runs measure a warm cache
        if c.startswith("ignis"):
            ignis.load(args.model, weight_format=c.split()[1], n_ctx=64, progress=False)
    files = {c: llama_file(c, args.model) if c.startswith("llama.cpp") else "" for c in cases}
    # a user's install has bytecode caches: the children may write and read them
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = dict(base_env, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env_of = compare_cases(cases, args.compare, base_env)
    if env_of:
        # The other checkout's caches of derived tables (tokenizer, compiled step) are its own:
        # both versions keep one file per model directory and would replace each other's on every
        # run when their code differs. Its IGNIS_HOME links the models, imports and conversions.
        home = mirror_home(Path(tempfile.mkdtemp(prefix="bench-ttft-home-")))
        atexit.register(shutil.rmtree, home, True)     # the links and its own tables only
        for e in env_of.values():
            e["IGNIS_HOME"] = str(home)
    for c in env_of:
        files[c] = files[case_name(c)]
    times: dict[str, list[float]] = {c: [] for c in cases}
    answers: dict[str, str] = {}
    for run in range(args.runs + 1):
        for c in cases:
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", RUNNER, case_name(c), args.model, str(args.threads),
                                  files[c]], capture_output=True, text=True,
                                 env=env_of.get(c, env), cwd=case_cwd(c, env_of), timeout=600)
            dt = time.perf_counter() - t0
            if out.returncode != 0:
                raise SystemExit(f"case {c!r} failed:\n{out.stderr[-3000:]}")
            if run:                     # run 0 writes the .pyc files and warms the page cache
                times[c].append(dt)
            answers[c] = out.stdout.strip().splitlines()[-1]
    print(f"model {args.model}; {machine()}; {args.threads} threads; median of {args.runs} fresh "
          f"processes per case, interleaved")
    base = statistics.median(times["llama.cpp shipped"]) if "llama.cpp shipped" in times else None
    print(f"{'case':<30}{'TTFT s':>9}{'min':>8}{'max':>8}{'vs llama.cpp shipped':>22}   first token")
    for c in cases:
        med = statistics.median(times[c])
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"{c:<30}{med:>9.3f}{min(times[c]):>8.3f}{max(times[c]):>8.3f}{ratio:>22}   {answers[c]}")


if __name__ == "__main__":
    main()
