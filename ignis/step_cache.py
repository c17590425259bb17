"""The compiled-step cache: the tape a compile_step made (graph, passes with the verifier after each,
memory plan, lowering: ~0.05 s for Qwen2.5-0.5B), stored so that a later process loading the same
model with the same options reads it back in about a millisecond instead.

A cache file lives at IGNIS_HOME/steps/<what>-<code>.bin. <what> hashes what the step is compiled
from: the ModelConfig (its repr: every field, floats exactly) and the options that change the graph
(max_batch_tokens, n_ctx, logit_rows, the pass list, whether the planner runs, the output).
<code> hashes the ignis version, FORMAT_VERSION and the text of every module that builds, rewrites,
plans or lowers the graph (SOURCES), so an edited pass or op table never meets an old tape. The
weight format and the kernel table are not in the key: the step is compiled before either is
chosen, and the tape is the same for all of them (the Executor checks every instruction against
the weights it is given). Writing a file for <what> removes that <what>'s files of other code
(an older ignis, an edited checkout) that nothing has used for a day; a file another user owns
is neither read nor replaced (a shared IGNIS_HOME: the checksum guards against accidents, not
against a writer).

File layout (integers little-endian):

    8s  magic b"IGNISSTP"   u32 FORMAT_VERSION   u32 header length   u32 CRC-32 of the rest
    header (UTF-8 JSON): the key, the tape (instructions as lists), the graph facts the Engine
        reads (weight shapes, attention windows, whether the plan ran), and per constant its
        dtype, shape and place in the payload
    payload: the constants' bytes (rope frequencies computed from the config)

The cache is an optimisation: a missing file is a miss; a damaged one (bad magic, CRC, truncated,
a header that does not fit together) or one whose header names another key is compiled again
with a RuntimeWarning and replaced; a step whose code changed has another file name, so it is a
plain miss. Writes are atomic (a temp file in the same directory, then rename);
a failed write is a warning. No pickle: reading a cache file never runs code from it.
IGNIS_STEP_CACHE=0 turns the cache off (every load compiles).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._version import __version__
from .loader.config import ModelConfig
from .paths import CACHE_PREFIX, ignis_home, open_cache_file, pack_cache_file, write_atomic
from .plan.arena import planner_disabled
from .plan.tape import Instr, Operand, Space, Tape

FORMAT_VERSION = 1
MAGIC = b"IGNISSTP"
_PREFIX = CACHE_PREFIX                  # magic, format version, header length, CRC-32
ENV = "IGNIS_STEP_CACHE"
_ROOT = Path(__file__).resolve().parent
# What shapes a tape: the IR and op table, the passes, the planner and lowering, the model
# builders, the config record, the compile driver, this file's own reading and writing.
SOURCES = ("ir", "passes", "plan", "models", "compiler.py", "loader/config.py", "step_cache.py",
           "_version.py")


class StepCacheError(ValueError):
    """A cache file that cannot be used (internal: it is reported as a warning, never raised)."""


@dataclass
class LoweredStep:
    """What the runtime reads of a compiled step: the tape and three facts of the graph it came
    from. From compile_step or from the cache; both give equal tapes."""
    tape: Tape
    weight_shapes: dict[str, tuple[int, ...]]     # every graph weight's shape, by name
    windows: tuple[int, ...]                      # attention_window nodes' windows, in order
    planned: bool                                 # False: one buffer per value (IGNIS_NO_PLAN)
    cached: bool = False                          # read from the cache (not compiled now)


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "")


def cache_dir() -> Path:
    return ignis_home() / "steps"


@lru_cache(maxsize=1)
def code_hash() -> str:
    """Hash of the ignis version and every source file in SOURCES (contents, not dates)."""
    h = hashlib.sha256(f"{__version__}\0{FORMAT_VERSION}\0".encode())
    files: list[Path] = []
    for s in SOURCES:
        p = _ROOT / s
        files += sorted(p.glob("*.py")) if p.is_dir() else [p]
    for f in files:
        h.update(f.relative_to(_ROOT).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:32]


def step_key(config: ModelConfig, *, max_batch_tokens: int, n_ctx: int, logit_rows: int,
             passes: Sequence[str] | None, planned: bool, output: str) -> str:
    """<what>: the hash of the config and of every option that changes the compiled step."""
    what = repr((repr(config), max_batch_tokens, n_ctx, logit_rows,
                 None if passes is None else tuple(passes), planned, output))
    return hashlib.sha256(what.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def lowered(step) -> LoweredStep:
    """A CompiledStep's runtime part."""
    g = step.graph
    return LoweredStep(step.tape, {k: tuple(v.type.shape) for k, v in g.weights.items()},
                       tuple(int(n.attrs["window"]) for n in g.nodes if n.op == "attention_window"),
                       bool(step.plan.planned))


def load_or_compile(config: ModelConfig, *, max_batch_tokens: int, n_ctx: int, logit_rows: int,
                    passes: Sequence[str] | None = None, plan: bool | None = None,
                    output: str = "logits", cache: bool | None = None) -> LoweredStep:
    """compile_step's tape for these arguments: from the cache when a file for exactly them (and
    this code) is there, else compiled now and stored. cache=None follows IGNIS_STEP_CACHE."""
    if cache is None:
        cache = enabled()
    planned = (not planner_disabled()) if plan is None else bool(plan)

    def compile_now() -> LoweredStep:
        from .compiler import compile_step      # the passes and verifier: only when compiling
        return lowered(compile_step(config, max_batch_tokens=max_batch_tokens, n_ctx=n_ctx,
                                    logit_rows=logit_rows, passes=passes, plan=planned,
                                    output=output))
    if not cache:
        return compile_now()
    try:
        what = step_key(config, max_batch_tokens=max_batch_tokens, n_ctx=n_ctx,
                        logit_rows=logit_rows, passes=passes, planned=planned, output=output)
        code = code_hash()
    except OSError as exc:          # a source file cannot be read: compile, never cache
        _warn(f"not caching the compiled step ({exc})")
        return compile_now()
    path = cache_dir() / f"{what}-{code}.bin"
    if not _own(path):      # another user's file in a shared IGNIS_HOME: neither read nor replaced
        return compile_now()
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        data = None
    except OSError as exc:
        _warn(f"ignoring unreadable step cache {path} ({exc.strerror or exc}); compiling")
        data = None
    if data is not None:
        try:
            step = parse(data, f"{what}-{code}")
            try:
                os.utime(path)      # last use, as `ignis models` / `ignis prune --days` read it
            except OSError:
                pass                # a read-only cache
            return step
        except (StepCacheError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                RecursionError, struct.error) as exc:
            _warn(f"ignoring damaged step cache {path} ({exc}); compiling the step again")
    step = compile_now()
    try:
        data = serialize(step, f"{what}-{code}")
    except (TypeError, ValueError, OverflowError) as exc:    # a value JSON cannot hold
        _warn(f"cannot cache this compiled step ({exc}); it will be compiled again next time")
        return step
    write(path, data, what)
    return step


# ---------------------------------------------------------------- file format

def _operand(o: Operand) -> list:
    return [int(o.space), o.where, o.rows, o.cols, o.dtype]


def serialize(step: LoweredStep, key: str) -> bytes:
    t = step.tape
    consts: dict[str, Any] = {}
    blobs: list[bytes] = []
    at = 0
    for name, a in t.constants.items():
        a = np.ascontiguousarray(a)
        raw = a.tobytes()
        consts[name] = [a.dtype.str, list(a.shape), at, len(raw)]
        blobs.append(raw)
        at += len(raw)
    header = {
        "key": key,
        "instrs": [[i.opcode, i.op, i.name, _operand(i.out), [_operand(a) for a in i.args],
                    list(i.weights), list(i.ints), list(i.floats), i.scratch_bytes]
                   for i in t.instrs],
        "weights": t.weights, "inputs": t.inputs, "outputs": t.outputs,
        "output_bytes": t.output_bytes, "arena_bytes": t.arena_bytes,
        "scratch_offset": t.scratch_offset, "scratch_bytes": t.scratch_bytes, "bounds": t.bounds,
        "n_ctx": t.n_ctx, "kv_layers": [list(k) for k in t.kv_layers], "constants": consts,
        "weight_shapes": {k: list(v) for k, v in step.weight_shapes.items()},
        "windows": list(step.windows), "planned": step.planned,
    }
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return pack_cache_file(MAGIC, FORMAT_VERSION, head, b"".join(blobs))


def _int(v: Any, what: str) -> int:
    if type(v) is not int:
        raise StepCacheError(f"{what} is not an integer")
    return v


def _read_operand(o: Any) -> Operand:
    space, where, rows, cols, dtype = o
    if not (isinstance(rows, int) or rows in ("T", "R")) or not isinstance(dtype, str):
        raise StepCacheError(f"bad operand {o!r}")
    return Operand(Space(space), _int(where, "an operand offset"), rows, _int(cols, "columns"), dtype)


def parse(data: bytes, key: str) -> LoweredStep:
    """The step stored in `data`; StepCacheError (or the ValueError/KeyError/... of a header that
    does not fit together) when it is damaged or was written for another key."""
    h, payload = open_cache_file(data, MAGIC, FORMAT_VERSION, StepCacheError, "step cache")
    if h["key"] != key:
        raise StepCacheError("written for another model, options or code")
    instrs = []
    for opcode, op, name, out, args, weights, ints, floats, scratch in h["instrs"]:
        instrs.append(Instr(_int(opcode, "an opcode"), str(op), str(name), _read_operand(out),
                            tuple(map(_read_operand, args)),
                            tuple(_int(w, "a weight index") for w in weights),
                            tuple(_int(i, "an int scalar") for i in ints),
                            tuple(float(f) for f in floats), _int(scratch, "scratch bytes")))
    weights = [str(w) for w in h["weights"]]
    constants: dict[str, np.ndarray] = {}
    for name, (dtype, shape, start, size) in h["constants"].items():
        if name not in weights or not (0 <= start and start + size <= len(payload)):
            raise StepCacheError(f"constant {name!r} lies outside the file")
        a = np.frombuffer(payload[start:start + size], dtype=np.dtype(dtype)).reshape(shape)
        constants[name] = a.copy()      # owned and writable, as a compiled tape's are
    tape = Tape(instrs, weights, list(h["inputs"]), list(h["outputs"]), list(h["output_bytes"]),
                _int(h["arena_bytes"], "arena_bytes"), _int(h["scratch_offset"], "scratch_offset"),
                _int(h["scratch_bytes"], "scratch_bytes"),
                {str(k): _int(v, "a bound") for k, v in h["bounds"].items()},
                _int(h["n_ctx"], "n_ctx"), [(int(a), int(b)) for a, b in h["kv_layers"]], constants)
    shapes = {str(k): tuple(_int(d, "a dimension") for d in v) for k, v in h["weight_shapes"].items()}
    missing = [w for w in weights if w not in shapes]
    if missing:
        raise StepCacheError(f"no shape stored for weight {missing[0]!r}")
    return LoweredStep(tape, shapes, tuple(_int(w, "a window") for w in h["windows"]),
                       h["planned"] is True, cached=True)


def write(path: Path, data: bytes, what: str) -> None:
    """Store data at path atomically, then remove the files of `what` made by other code."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        _warn(f"could not store the compiled step in {path.parent} ({exc.strerror or exc}); it "
              f"will be compiled again on the next load")
        return
    # Files of the same step from other code: an edited checkout's old tapes, or another ignis
    # install sharing this IGNIS_HOME, which still reads its own (a read sets the mtime). Those
    # unused for a day go, so two installs in use do not remove each other's file on every load.
    stale = time.time() - OTHER_CODE_KEPT_S
    for old in path.parent.glob(f"{what}-*.bin"):
        try:
            if old.name != path.name and old.stat().st_mtime < stale and _own(old):
                old.unlink()
        except OSError:
            pass


OTHER_CODE_KEPT_S = 24 * 3600


def _own(path: Path) -> bool:
    """Whether path is missing or this user's: a cache file someone else wrote is not trusted
    (its checksum and key guard against accidents, not against a writer)."""
    try:
        return not hasattr(os, "getuid") or path.stat().st_uid == os.getuid()
    except OSError:
        return True


def _warn(message: str) -> None:
    warnings.warn(f"ignis: {message}", RuntimeWarning, stacklevel=4)
