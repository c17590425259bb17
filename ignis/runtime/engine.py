"""Engine: one model's compiled step handed to the C executor once, a KV cache, and `forward`.

    eng = Engine(ignis.load("qwen2.5-coder-0.5b-instruct"), n_ctx=2048)
    logits = eng.forward(np.array(ids, np.int32))          # [1, vocab]: the last position
    logits = eng.forward(np.array([next_id], np.int32))    # decode: T = 1
    hid = Engine(model, output="hidden").hidden_states(ids)  # [len(ids), dim]: embeddings

Prompts are prefilled in chunks of up to `max_batch_tokens` (T > 1, matrix-matrix); decode is T = 1
(matrix-vector). Inputs and outputs are buffers allocated once; a step allocates nothing.

With n_seq > 1 the KV cache has that many slots, each an independent sequence, and one step can
carry rows of several of them (one pass over the weights for all):

    eng = Engine(model, n_ctx=2048, n_seq=4)
    a, b = eng.forward_batch([(0, prompt_a), (1, prompt_b)])   # last-token logits of each
    a, b = eng.forward_batch([(0, [next_a]), (1, [next_b])])   # a batched decode step
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

import numpy as np

from .. import _core
from .cpus import available_cpus
from ..formats import FORMATS, WEIGHT_FORMATS, ConvertInput, WeightFormat
from ..formats.bf16 import bf16_to_f32
from ..loader.config import ModelConfig
from ..models import FAMILIES
from ..step_cache import load_or_compile
from .convert_cache import load_or_convert as _load_or_convert
from .errors import ContextOverflowError, RuntimeInputError, TokenIdError

if TYPE_CHECKING:
    from ..compiler import CompiledStep

DEFAULT_MAX_CTX = 4096          # default KV context: the model's maximum, capped here
DEFAULT_MAX_BATCH_TOKENS = 128  # prefill chunk
OUTPUTS = ("logits", "hidden")
AUTO = "auto"                   # weight_format / kv_dtype chosen per model and CPU
KV_DTYPES = (AUTO, "f32", "f16")
MAX_CTX = 2**31 - 1 - 128       # positions are int32 in the executor, which rounds rows up
                                # to whole KV blocks and looks a few blocks ahead (IG_MAX_CTX)
KV_BLOCK = 16                   # the executor keeps KV rows in whole blocks (IG_KV_BLOCK)


def kv_cache_rows(config: ModelConfig, n_ctx: int, *,
                  max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> list[int]:
    """Rows each layer's KV cache keeps per slot: n_ctx, except a sliding-window layer (Gemma 3),
    which keeps a ring of window + max_batch_tokens positions when that is fewer; both rounded up
    to whole blocks of KV_BLOCK rows (the executor's rule: ig_model_create in csrc/executor.c)."""
    step = min(max_batch_tokens, n_ctx)
    window = config.sliding_window
    ring = window + step if 0 < window and window + step < n_ctx else n_ctx
    kinds = config.layer_types or ("full_attention",) * config.n_layers
    return [-(-(ring if kind == "sliding_attention" else n_ctx) // KV_BLOCK) * KV_BLOCK
            for kind in kinds]


def kv_cache_bytes(config: ModelConfig, n_ctx: int, *, n_seq: int = 1, kv_dtype: str = "f32",
                   max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> int:
    """Bytes of a full KV cache: a key and a value row of n_kv_heads * head_dim per layer, per
    position kept (kv_cache_rows), per slot (the executor reserves it all; pages are only
    touched as it fills)."""
    rows = sum(kv_cache_rows(config, n_ctx, max_batch_tokens=max_batch_tokens))
    return n_seq * 2 * rows * config.kv_dim * (2 if kv_dtype == "f16" else 4)


def _largest_fitting_ctx(have: int, config: ModelConfig, **kw) -> int:
    """The largest n_ctx whose KV cache takes at most `have` bytes (0: not even one position)."""
    lo, hi = 0, MAX_CTX
    while lo < hi:                      # kv_cache_bytes grows with n_ctx
        mid = (lo + hi + 1) // 2
        if kv_cache_bytes(config, mid, **kw) <= have:
            lo = mid
        else:
            hi = mid - 1
    return lo


def machine_memory_bytes() -> int | None:
    """RAM plus swap: what a KV cache that fills up can at most occupy (None: unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kb = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[1:2]}
        return (kb["MemTotal"] + kb.get("SwapTotal", 0)) * 1024
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_n_ctx(n_ctx, config: ModelConfig | None = None, *, n_seq: int = 1,
                kv_dtype: str = "f32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> int:
    """The KV cache length to use: n_ctx checked, or the default (the model's maximum, capped at
    DEFAULT_MAX_CTX) for None. Raises RuntimeInputError unless n_ctx is a positive integer, at
    most the model's max_position_embeddings, and its KV cache (all n_seq slots full) fits in
    this machine's RAM plus swap.

    Why max_position_embeddings is a limit: it is the context the model was trained for. RoPE
    computes positions past it without complaint, but the model has never seen those distances
    and its output degrades without warning; transformers only logs a reminder and llama.cpp a
    warning ("n_ctx_per_seq > n_ctx_train") before running anyway. ignis refuses instead. A model
    whose long-context use is known to work can say so by a larger max_position_embeddings in
    its config.json."""
    if n_ctx is None and config is not None:
        n_ctx = min(config.max_position_embeddings, DEFAULT_MAX_CTX)
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or n_ctx < 1:
        raise RuntimeInputError(f"n_ctx must be a positive integer (the KV cache length in "
                                f"positions), got {n_ctx!r}")
    n_ctx = int(n_ctx)
    if config is None:
        return n_ctx
    limit = config.max_position_embeddings
    if n_ctx > limit:
        raise RuntimeInputError(
            f"n_ctx={n_ctx} exceeds the {limit} positions this model supports (max_position_embeddings "
            f"in its config.json: the context it was trained for; past it the output degrades "
            f"silently, so ignis refuses where transformers and llama.cpp only warn). Use n_ctx <= "
            f"{min(limit, MAX_CTX)}")
    if n_ctx > MAX_CTX:
        raise RuntimeInputError(f"n_ctx={n_ctx} is more positions than ignis can index (32-bit "
                                f"positions: at most {MAX_CTX})")
    kw = dict(n_seq=n_seq, kv_dtype=kv_dtype, max_batch_tokens=max_batch_tokens)
    need = kv_cache_bytes(config, n_ctx, **kw)
    have = machine_memory_bytes()
    if have is not None and need > have:
        fits = _largest_fitting_ctx(have, config, **kw)
        other = ", fewer parallel slots" if n_seq > 1 else ""
        other += " or kv_dtype='f16'" if kv_dtype != "f16" else ""
        rows = kv_cache_rows(config, n_ctx, max_batch_tokens=max_batch_tokens)
        ring = sum(r < n_ctx for r in rows)
        layers = (f"{len(rows)} layers" if not ring else
                  f"{len(rows) - ring} global layers x {n_ctx} positions and {ring} sliding-window "
                  f"layers x {min(rows)} positions")
        raise RuntimeInputError(
            f"a KV cache of n_ctx={n_ctx} positions x {n_seq} slot{'s' if n_seq > 1 else ''} needs "
            f"{need} bytes ({need / 2**30:.1f} GiB: {layers} x 2 x {config.kv_dim} x "
            f"{2 if kv_dtype == 'f16' else 4} bytes per position), more than this machine's "
            f"{have} bytes ({have / 2**30:.1f} GiB) of RAM and swap; use n_ctx <= {fits}{other}")
    return n_ctx


@dataclass(frozen=True)
class EngineOptions:
    n_ctx: int
    threads: int
    max_batch_tokens: int
    kernels: str                 # kernel table name
    kv_dtype: str                # KV cache storage: "f32" or "f16" (what "auto" chose)
    weight_format: str           # matmul weights: one of WEIGHT_FORMATS
    planned: bool                # False: one buffer per value (IGNIS_NO_PLAN)
    passes: tuple[str, ...] | None
    output: str = "logits"       # "hidden": final-norm hidden states instead of logits


def compile_engine_step(config: ModelConfig, *, n_ctx: int, max_batch_tokens: int,
                        passes: Sequence[str] | None = None, plan: bool | None = None,
                        output: str = "logits") -> "CompiledStep":
    """The step an Engine runs: up to max_batch_tokens tokens per call and logits for as many rows
    (so logits_for="all" needs no second compilation); output="hidden": hidden states instead."""
    from ..compiler import compile_step      # the passes are imported when a step is compiled
    return compile_step(config, max_batch_tokens=max_batch_tokens, n_ctx=n_ctx,
                        logit_rows=max_batch_tokens, passes=passes, plan=plan, output=output)


def _f32_weights(names: Sequence[str], weights: Mapping[str, np.ndarray],
                 shapes: Mapping[str, tuple[int, ...]],
                 constants: Mapping[str, np.ndarray] | None = None,
                 load_weight=None) -> list[np.ndarray]:
    """The f32 arrays the tape's weights point at; `load_weight` is the family's (name, tensor) ->
    array the graph reads (Gemma's 1 + w norms), or None."""
    out = []
    info = getattr(weights, "info", None)      # a WeightStore knows each tensor's file dtype
    for n in names:
        if constants and n in constants:        # computed from the config (rope frequencies)
            out.append(constants[n])
            continue
        if n not in weights:
            raise RuntimeInputError(f"the model has no weight {n!r}, which its graph reads; the "
                                    f"model directory is incomplete")
        w = weights[n]
        if tuple(w.shape) != tuple(shapes[n]):
            raise RuntimeInputError(f"weight {n!r} has shape {list(w.shape)}, the graph needs "
                                    f"{list(shapes[n])}")
        if info is not None and info(n).dtype == "BF16":
            w = bf16_to_f32(w)                  # handed out as raw uint16 bits
        elif not np.issubdtype(w.dtype, np.floating):
            raise RuntimeInputError(f"weight {n!r} is {w.dtype}; the runtime takes float weights "
                                    f"(F32, F16, BF16)")
        # f32 mmaps are used in place; other float formats are widened once, here
        if load_weight is not None:
            w = load_weight(n, w)
        out.append(np.ascontiguousarray(w, dtype=np.float32))
    return out


def _matmul_weights(tape, weights: list[np.ndarray]) -> set[int]:
    """Indices of the matrices a matmul reads (a tied embedding also keeps its f32 rows for the
    gather)."""
    out = set()
    for ins in tape.instrs:
        if ins.op != "embed":
            out.update(w for w in ins.weights if weights[w].ndim == 2)
    return out


# what runs fast, fastest first, when a kernel table has no fast kernel for a model's own pick
_FALLBACK = ("q8", "q4", "bf16", "f32")


def _fast_formats(table: str) -> list[str]:
    """The formats whose matmuls this kernel table has kernels of its own for (not only the plain
    C twin), fastest first. On a table with none (generic), q8: its portable twin decodes ~5x
    faster than gguf's and ~2.7x f32's (benchmarks/RESULTS.md)."""
    info = next((t for t in _core.kernel_tables() if t["name"] == table), None)
    portable = set(info["portable"]) if info is not None else set()
    fast = [f for f in (*_FALLBACK, "gguf") if not portable.intersection(FORMATS[f].matmuls)]
    return fast or ["q8"]


class WeightChoice(NamedTuple):
    name: str                   # one of WEIGHT_FORMATS
    reason: str                 # why, one line for a user (ignis show, --verbose, /health)
    fallback: bool = False      # the model's own pick has no fast kernel on this CPU


def _own_blocks(model) -> tuple[str | None, str | None]:
    """("gguf", why) when the model came from a GGUF file ignis can read blocks from: the file is
    where the import found it (a registry model's is brought back if pruned) and some matmul
    tensor is of a type with a block layout; else (None, why not, or None for a float checkpoint)."""
    from ..formats.gguf_blocks import BLOCK_BYTES
    from ..loader.provenance import read_provenance, source_record
    path = getattr(model, "path", None)
    prov = read_provenance(path) if path is not None else None
    src = source_record(prov)
    if not isinstance(src.get("path"), str):
        return None, None
    records = prov.get("tensors") if isinstance(prov.get("tensors"), dict) else {}
    types = {r.get("gguf_type") for r in records.values() if isinstance(r, dict)}
    if not types & set(BLOCK_BYTES):
        return None, "a GGUF file without block types ignis multiplies as stored: int8 blocks"
    from ..loader.provenance import source_sha256
    from ..loader.registry import entry_for_sha256
    gguf = Path(src["path"])
    present = gguf.is_file() and gguf.stat().st_size == src.get("size")
    # a registry model's file is assembled again from its packages when pruned
    if not present and entry_for_sha256(source_sha256(prov)) is None:
        return None, (f"the GGUF file it was imported from, {src['path']}, is gone: int8 blocks "
                      f"(import it again to run its own blocks)")
    return "gguf", "imported from a GGUF file: its own blocks"


def choose_weight_format(model, kernels: str | None = None) -> WeightChoice:
    """What weight_format="auto" runs `model` (ModelFiles) in, and why.

    A model imported from a GGUF file runs in the file's own blocks ("gguf": its exact weights at
    its size); a float checkpoint in "q8" (int8 blocks: 2-3x the decode speed of f32, greedy
    output almost always the same; weight_format="f32" is the bit-faithful choice). When this
    CPU's kernel table has only the portable C code for that format's matmul, the fastest format
    it does have a kernel for is taken instead."""
    pick, why = _own_blocks(model)
    if pick is None:
        pick = "q8"
        why = why or "a float checkpoint: int8 blocks (weight_format='f32' is bit-faithful)"
    table = kernels or _core.active_kernels()
    fast = _fast_formats(table)
    if pick not in fast:
        return WeightChoice(fast[0], f"{pick!r} has no {table} kernel on this CPU (its portable C "
                                     f"code is several times slower): {fast[0]!r} instead", True)
    return WeightChoice(pick, why)


# kernel tables whose decode attention reads an f16 cache in place (arch/attention_avx512.h,
# arch/attention_avx2.h): there f16 decodes at least as fast as f32 (benchmarks/bench_kv.py);
# elsewhere (the portable and NEON tables) every read adds a widening pass
_F16_KV_TABLES = ("avx512", "avx512_vnni", "avx2")


def choose_kv_dtype(weight_format: str, kernels: str) -> str:
    """What kv_dtype="auto" stores the cache as: f16 (half the memory) where the kernel table reads
    it at f32's speed, except under f32 weights (the bit-faithful configuration keeps f32)."""
    return "f16" if weight_format != "f32" and kernels in _F16_KV_TABLES else "f32"


def _warn_if_portable(fmt: WeightFormat, table: str) -> None:
    """A weight format whose matmul this CPU's kernel table only has as the plain C twin is several
    times slower than the other formats: say so once, with what to use instead (not for f32, the
    exact reference, taken for its bits rather than its speed)."""
    fast = _fast_formats(table)
    if fmt.name not in fast and fmt.name != "f32":
        warnings.warn(f"weight_format={fmt.name!r} has no {table} kernel on this CPU; it runs the "
                      f"portable C code, several times slower than {fast[0]!r} here",
                      RuntimeWarning, stacklevel=3)


def _shared_weights(src, names: Sequence[str], model, weight_format: str):
    """(f32 weights, converted forms) for `names`, taken from Engine `src` by weight name, or None
    when there is no src. src must have been built from this very weight store (two checkpoints of
    one config, a base and an instruct model, look alike to every other check), in the same weight
    format, and hold every weight asked for; anything else is a caller's mistake, refused."""
    if src is None:
        return None
    if not isinstance(src, Engine):
        raise RuntimeInputError(f"share_weights must be an Engine, got {type(src).__name__}")
    if not src.reads(model):
        raise RuntimeInputError("share_weights: that engine was built from other weights (another "
                                "checkpoint or another open of it); share only with an Engine "
                                "made from the same loaded model")
    if src.options.weight_format != weight_format:
        raise RuntimeInputError(
            f"share_weights: that engine runs its weights as {src.options.weight_format!r}; "
            f"this one needs them as {weight_format!r}")
    index = {n: i for i, n in enumerate(src._weight_names)}
    missing = [n for n in names if n not in index]
    if missing:
        raise RuntimeInputError(f"share_weights: that engine does not hold {', '.join(missing)}")
    pick = [index[n] for n in names]
    return [src._weights[i] for i in pick], [src._packed[i] for i in pick]


def huge_pages_wanted() -> bool:
    return os.environ.get("IGNIS_HUGEPAGES", "1") not in ("0", "")


def to_huge_pages(packed: list) -> list:
    """The packed weights copied into one anonymous mapping backed by 2 MB pages where the kernel
    grants them (madvise MADV_HUGEPAGE), each 64-byte aligned."""
    import mmap
    arrays = [e[2] for e in packed if e is not None]
    total = sum((a.nbytes + 63) // 64 * 64 for a in arrays)
    if total == 0 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return packed
    huge = 2 << 20
    # private: a shared anonymous mapping is shmem, whose huge pages are a separate setting
    buf = mmap.mmap(-1, (total + huge - 1) // huge * huge + huge,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(buf, np.uint8)
    skip = (-base.ctypes.data) % huge
    out, at = [], skip
    for e in packed:
        if e is None:
            out.append(None)
            continue
        c_id, layout, a = e
        dst = base[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
        dst[...] = a
        at += (a.nbytes + 63) // 64 * 64
        out.append((c_id, layout, dst))
    return out


def _merge_parts(fmt: WeightFormat, parts: Mapping[str, list], n_weights: int) -> list:
    """The Executor's `packed` list from a format's parts: per weight None (it stays f32) or
    (Packing.c_id, layout, array) from the one part that converted it."""
    packed: list = [None] * n_weights
    for p in fmt.parts:
        for i, entry in enumerate(parts[p.cache_name]):
            if entry is None:
                continue
            if packed[i] is not None:
                raise RuntimeInputError(f"weight_format={fmt.name!r}: weight {i} was converted by two "
                                        f"parts; a weight has one packing")
            packed[i] = (p.packing.c_id, *p.packing.unwrap(entry))
    return packed


def _packed_weights(fmt: WeightFormat, tape, weights: list[np.ndarray], model) -> list:
    """The Executor's `packed` list for a format (_merge_parts): each of its parts from the
    conversion cache, else converted (all parts in one pass, once) and stored there."""
    inp = ConvertInput(tape.weights, weights, frozenset(_matmul_weights(tape, weights)), model,
                       FAMILIES[model.config.arch])
    done: dict = {}

    def converted() -> dict:
        if not done:
            done.update(fmt.convert(inp))
        return done
    if fmt.zero_copy(inp):
        return _merge_parts(fmt, converted(), len(weights))
    # Conversions are cached beside the model's files (IGNIS_HOME/convert): later loads mmap them.
    # The first conversion to a format takes seconds: a status line on a terminal (ModelFiles
    # carries the loader's progress choice; -q and progress=False keep it quiet).
    # ModelFiles.source: the weights' identity read at open, so an Engine built after `ignis rm`
    # deleted the files (Model.embed's) still finds its key
    load_or_convert = functools.partial(_load_or_convert, progress=bool(getattr(model, "progress", True)),
                                        source=getattr(model, "source", None))
    shapes = [tuple(w.shape) for w in weights]
    return _merge_parts(fmt, {p.cache_name: load_or_convert(p, model.weights, tape.weights, shapes,
                                                           lambda p=p: converted()[p.cache_name])
                              for p in fmt.parts}, len(weights))


class Engine:
    """A model ready to run forward steps: executor, KV cache for `n_ctx` positions, buffers.

    One Engine is one sequence's state: calls must not overlap (use one Engine per thread)."""

    def __init__(self, model, *, n_ctx: int | None = None, threads: int | None = None,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, kernels: str | None = None,
                 passes: Sequence[str] | None = None, plan: bool | None = None,
                 kv_dtype: str = "f32", weight_format: str = "f32", output: str = "logits",
                 n_seq: int = 1, share_weights: "Engine | None" = None):
        """`model` is a ModelFiles (ignis.load) or anything with .config and .weights.
        kv_dtype="f16" stores the KV cache as IEEE half: half the memory, attention reads widen it
        (exactly; at least f32's decode speed with the AVX-512 and AVX2 tables, benchmarks/bench_kv.py).
        "auto": choose_kv_dtype (f16 there, f32 with f32 weights or other tables).
        weight_format="auto" picks per model and CPU (choose_weight_format: the GGUF file's own
        blocks, else q8); the default here stays "f32", the exact reference the tests compare.
        weight_format="q8" quantizes every matmul weight to int8 blocks at load (embedding gathers
        stay f32); activations are quantized per block for the integer dot products.
        weight_format="q4" stores matmul weights as 4-bit blocks (32 weights, one scale; the output
        projection stays q8), activations quantized as for q8.
        weight_format="gguf" (a model imported from a GGUF file) multiplies with the file's own
        blocks, never re-rounded (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K;
        IQ4_NL exactly as Q8_0; F32 and F16 take the f32 path), and activations quantized to 16 bits per block: the file's
        exact weights at about its size.
        weight_format="bf16" reads matmul weights as bfloat16 (a BF16 checkpoint's own bits, else
        rounded to nearest even once at load); products and sums stay f32.
        output="hidden" compiles the embedding step: forward() returns final-norm hidden states
        ([., dim], transformers' last_hidden_state) instead of logits, and lm_head is never read.
        n_seq: KV cache slots (independent sequences, each of n_ctx positions); the memory of a
        slot is only touched as it fills.
        share_weights: another Engine of the same model and weight_format whose weights (f32 views
        and converted forms) this one reads instead of loading or converting its own: the
        embedding step beside the generation step holds the weights once.
        n_ctx (default: max_position_embeddings capped at 4096) is refused with RuntimeInputError
        above the model's max_position_embeddings or when the full KV cache could not fit in RAM
        and swap (check_n_ctx says why)."""
        cfg: ModelConfig = model.config
        if threads is None:     # the CPUs this process may use: affinity mask, cgroup quota
            threads = available_cpus()
        for what, v in (("threads", threads), ("max_batch_tokens", max_batch_tokens),
                        ("n_seq", n_seq)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RuntimeInputError(f"{what} must be a positive integer, got {v!r}")
        if kv_dtype not in KV_DTYPES:
            raise RuntimeInputError(f"kv_dtype must be 'auto', 'f32' or 'f16', got {kv_dtype!r}")
        if weight_format == AUTO:
            choice = choose_weight_format(model, kernels)
            if choice.fallback:
                warnings.warn(f"weight_format='auto': {choice.reason}", RuntimeWarning, stacklevel=2)
        elif weight_format in WEIGHT_FORMATS:
            choice = WeightChoice(weight_format, "chosen by the caller")
        else:
            raise RuntimeInputError(f"weight_format must be 'auto' or one of "
                                    f"{', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
        if kv_dtype == AUTO:
            kv_dtype = choose_kv_dtype(choice.name, kernels or _core.active_kernels())
        n_ctx = check_n_ctx(n_ctx, cfg, n_seq=n_seq, kv_dtype=kv_dtype,
                            max_batch_tokens=max_batch_tokens)
        if output not in OUTPUTS:
            raise RuntimeInputError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        max_batch_tokens = min(max_batch_tokens, n_ctx)
        # the step compile_engine_step makes, read from the compiled-step cache when this config,
        # these options and this code compiled it before (IGNIS_HOME/steps; IGNIS_STEP_CACHE=0: off)
        step = load_or_compile(cfg, n_ctx=n_ctx, max_batch_tokens=max_batch_tokens,
                               logit_rows=max_batch_tokens, passes=passes, plan=plan, output=output)
        tape = step.tape
        shapes = step.weight_shapes
        self.weight_choice = choice
        weight_format = choice.name
        fmt = FORMATS[weight_format]
        shared = _shared_weights(share_weights, tape.weights, model, weight_format)
        if shared is not None:
            self._weights, self._packed = shared
        else:
            self._weights = _f32_weights(tape.weights, model.weights, shapes, tape.constants,
                                         FAMILIES[cfg.arch].load_weight)
            _warn_if_portable(fmt, kernels or _core.active_kernels())
            # per weight in the tape's order: None (f32) or (packing id, layout, array)
            self._packed = (_packed_weights(fmt, tape, self._weights, model) if fmt.parts
                            else [None] * len(self._weights))
            if huge_pages_wanted():
                self._packed = to_huge_pages(self._packed)
        self._weight_names = tuple(tape.weights)
        self._store = model.weights             # what share_weights compares (reads())
        widths = [0] * (max((layer for layer, _ in tape.kv_layers), default=-1) + 1)
        for layer, w in tape.kv_layers:
            widths[layer] = w
        kernels = kernels or _core.active_kernels()
        self._exec = _core.Executor(
            tape.to_records(), self._weights, max_batch_tokens=tape.bounds["T"],
            max_rows=tape.bounds["R"], n_ctx=tape.n_ctx, n_inputs=len(tape.inputs),
            n_outputs=len(tape.outputs), arena_bytes=tape.arena_bytes,
            scratch_bytes=tape.scratch_bytes, kv_widths=widths,
            names=[(i.op, i.name) for i in tape.instrs], kernels=kernels, kv_dtype=kv_dtype,
            n_seq=n_seq, packed=self._packed)
        self.config = cfg
        self.step_info = step
        self.options = EngineOptions(n_ctx, threads, max_batch_tokens, kernels, kv_dtype,
                                     weight_format, step.planned,
                                     tuple(passes) if passes is not None else None, output)
        T = tape.bounds["T"]
        self._tokens = np.zeros(T, np.int32)
        self._pos = np.zeros(T, np.int32)
        self._rows = np.zeros(T, np.int32)
        self._seq = np.zeros(T, np.int32)
        self._select = "rows" in tape.inputs      # select_logit_rows ran: logits only for `rows`
        out_rows = tape.bounds["R"] if self._select else T
        width = cfg.vocab_size if output == "logits" else cfg.dim
        self._out = np.zeros((out_rows, width), np.float32)
        bufs = {"tokens": self._tokens, "pos": self._pos, "rows": self._rows}
        unknown = [k for k in tape.inputs if k not in bufs]
        if unknown or tape.outputs != [output]:
            raise RuntimeInputError(f"the compiled step takes inputs {tape.inputs} and outputs "
                                    f"{tape.outputs}; the engine feeds tokens, pos, rows -> {output}")
        self._exec.bind([bufs[k] for k in tape.inputs], [self._out], self._seq)
        self._n_past = [0] * n_seq
        # the C executor keeps a ring, not every position, for a windowed attention whose window
        # and a step's tokens fit in fewer than n_ctx positions (executor.c, ig_model_create)
        self._ring = any(0 < w and w + tape.bounds["T"] < tape.n_ctx for w in step.windows)

    def reads(self, model) -> bool:
        """Whether this engine was built from `model`'s own weight store (the same loaded files,
        not merely the same config): the condition for share_weights."""
        return self._store is getattr(model, "weights", None)

    # ---- state ------------------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        """Positions held in slot 0 of the KV cache (the next token goes to this position)."""
        return self._n_past[0]

    @property
    def n_ctx(self) -> int:
        return self.options.n_ctx

    @property
    def max_batch_tokens(self) -> int:
        """Tokens one step runs at most (a longer forward is split into steps)."""
        return self.options.max_batch_tokens

    @property
    def n_seq(self) -> int:
        """KV cache slots (independent sequences)."""
        return len(self._n_past)

    @property
    def nbytes(self) -> int:
        """Bytes of the executor's one block (arena, scratch, KV cache)."""
        return self._exec.nbytes

    def _check_seq(self, seq) -> int:
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < self.n_seq:
            raise RuntimeInputError(f"KV slot {seq!r} does not exist; this engine has slots "
                                    f"0..{self.n_seq - 1}")
        return int(seq)

    def seq_n_past(self, seq: int) -> int:
        """Positions held in KV slot `seq`."""
        return self._n_past[self._check_seq(seq)]

    def reset(self, seq: int | None = None) -> None:
        """Forget every cached position (of one slot, or of all with seq=None)."""
        if seq is None:
            self._n_past = [0] * self.n_seq
        else:
            self._n_past[self._check_seq(seq)] = 0

    def truncate(self, n: int, seq: int = 0) -> None:
        """Keep the first n cached positions of a slot (a shared prefix), drop the rest. A model
        whose sliding-window layers keep a ring of window + max_batch_tokens positions (Gemma 3)
        has overwritten older rows: it can step back at most max_batch_tokens positions, and keeps
        nothing (n_past 0) when asked to step back further; read n_past after truncating."""
        seq = self._check_seq(seq)
        have = self._n_past[seq]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= have:
            raise RuntimeInputError(f"truncate({n!r}): keep between 0 and n_past={have} positions")
        if self._ring and have - n > self.options.max_batch_tokens:
            n = 0
        self._n_past[seq] = n

    def copy_slot(self, dst: int, src: int, n: int) -> None:
        """Give KV slot dst the first n cached positions of slot src (their keys and values are
        copied, nothing is run): dst then holds n positions, as if it had run src's first n
        tokens itself. n > 1 choices share their prompt so. n must be at most src's n_past;
        dst == src keeps the first n positions (truncate)."""
        dst, src = self._check_seq(dst), self._check_seq(src)
        have = self._n_past[src]
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= have:
            raise RuntimeInputError(f"copy_slot({dst}, {src}, {n!r}): copy between 0 and "
                                    f"n_past={have} positions of slot {src}")
        if dst == src:
            self.truncate(int(n), src)
            return
        if self._ring and have - n > self.options.max_batch_tokens:
            raise RuntimeInputError(f"copy_slot({dst}, {src}, {n}): slot {src} holds {have} "
                                    f"positions and its sliding-window layers keep a ring that "
                                    f"no longer has all of the first {n}")
        self._exec.kv_copy(dst, src, int(n))
        self._n_past[dst] = int(n)

    def slot(self, seq: int) -> "EngineSlot":
        """One KV slot seen as an engine of its own (forward / truncate / reset / n_past)."""
        return EngineSlot(self, self._check_seq(seq))

    # ---- running ----------------------------------------------------------------------------
    def _check_tokens(self, tokens, n_past: int = 0) -> np.ndarray:
        a = np.asarray(tokens)
        if a.ndim != 1:
            raise RuntimeInputError(f"tokens must be a 1-D array of token ids, got shape {list(a.shape)}")
        if a.size == 0:
            raise RuntimeInputError("tokens is empty: a forward step needs at least one token")
        if a.dtype.kind not in "iu" and not np.issubdtype(a.dtype, np.integer):
            raise RuntimeInputError(f"tokens must be integers, got dtype {a.dtype}")
        vocab = self.config.vocab_size
        if a.size == 1:         # a decode step: one Python comparison, not three array ops
            i, bad = 0, not 0 <= int(a[0]) < vocab
        else:
            mask = (a < 0) | (a >= vocab)
            bad = bool(mask.any())
            i = int(np.argmax(mask)) if bad else 0
        if bad:
            raise TokenIdError(f"token id {int(a[i])} at index {i} is outside the vocabulary "
                               f"0..{vocab - 1}")
        if n_past + a.size > self.n_ctx:
            raise ContextOverflowError(
                f"{a.size} tokens after {n_past} cached positions need {n_past + a.size} "
                f"positions; the context holds {self.n_ctx}. Use a shorter prompt, reset() or "
                f"truncate(), or create the Engine with a larger n_ctx")
        return a.astype(np.int32, copy=False)

    def check_tokens(self, tokens, seq: int = 0) -> np.ndarray:
        """tokens as int32 ids, checked as forward(..., seq=seq) would check them (raises the same
        typed errors)."""
        return self._check_tokens(tokens, self._n_past[self._check_seq(seq)])

    def forward(self, tokens, *, logits_for: str = "last", seq: int = 0) -> np.ndarray:
        """Run tokens at positions n_past.. of KV slot `seq` and append them to it. Returns f32
        logits: [1, vocab] for logits_for="last", [len(tokens), vocab] for "all" (with
        output="hidden", hidden states: [1, dim] / [len(tokens), dim])."""
        if logits_for not in ("last", "all"):
            raise RuntimeInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        seq = self._check_seq(seq)
        ids = self._check_tokens(tokens, self._n_past[seq])
        if ids.size == 1:
            # a decode step: its one row of logits written by the executor straight into the
            # array returned (no copy of a vocabulary-wide row out of the bound buffer)
            n_past = self._n_past[seq]
            self._tokens[0] = ids[0]
            self._pos[0] = n_past
            self._seq[0] = seq
            self._rows[0] = 0
            out = np.empty((1, self._out.shape[1]), np.float32)
            self._exec.step_into(out, 1, 1 if self._select else 0, self.options.threads, seq != 0)
            self._n_past[seq] = n_past + 1
            return out
        chunk = self.options.max_batch_tokens
        out = []
        for s in range(0, ids.size, chunk):
            part = ids[s:s + chunk]
            T = part.size
            last_chunk = s + chunk >= ids.size
            n_past = self._n_past[seq]
            self._tokens[:T] = part
            self._pos[:T] = np.arange(n_past, n_past + T, dtype=np.int32)
            self._seq[:T] = seq
            if logits_for == "all":
                R = T
                self._rows[:T] = np.arange(T, dtype=np.int32)
            else:
                R = 1
                self._rows[0] = T - 1
            # a failing step raises before n_past moves: rows it wrote past n_past are never read
            self._exec.step(T, R if self._select else 0, self.options.threads, seq != 0)
            self._n_past[seq] += T
            if logits_for == "all":
                out.append(self._out[:T].copy())
            elif last_chunk:
                out.append(self._out[R - 1 if self._select else T - 1][None].copy())
        return out[0] if len(out) == 1 else np.concatenate(out)

    def forward_batch(self, parts: Sequence[tuple[int, Sequence[int]]], *,
                      all_rows: Sequence[bool] | None = None) -> list[np.ndarray]:
        """One step over the rows of several KV slots: parts are (slot, token ids), each slot at
        most once, at most max_batch_tokens ids in all. Each part's ids run at its slot's positions
        n_past.. and are appended to it; returns each part's last-token logits ([1, vocab]), or
        every row's ([len(ids), vocab]) for the parts whose all_rows entry is true (a speculative
        step verifying guesses). Everything is checked before the step runs; a failed step moves
        no slot."""
        if not parts:
            raise RuntimeInputError("forward_batch needs at least one (slot, tokens) part")
        seqs, arrays, total = [], [], 0
        for seq, tokens in parts:
            seq = self._check_seq(seq)
            if seq in seqs:
                raise RuntimeInputError(f"KV slot {seq} appears twice in one batch; give its tokens "
                                        f"as one part")
            ids = self._check_tokens(tokens, self._n_past[seq])
            seqs.append(seq)
            arrays.append(ids)
            total += ids.size
        if total > self.options.max_batch_tokens:
            raise RuntimeInputError(f"a batch of {total} tokens exceeds max_batch_tokens="
                                    f"{self.options.max_batch_tokens}; split it into several steps")
        if not self._select and len(parts) > 1:
            raise RuntimeInputError("this compiled step computes logits for every row; batching "
                                    "needs the select_logit_rows pass")
        wide = [bool(w) for w in all_rows] if all_rows is not None else [False] * len(parts)
        if len(wide) != len(parts):
            raise RuntimeInputError(f"all_rows has {len(wide)} entries for {len(parts)} parts")
        if any(wide) and not self._select and len(parts) > 1:
            raise RuntimeInputError("every row's logits of one part of a batch needs the "
                                    "select_logit_rows pass")
        at, R = 0, 0
        spans = []                                  # each part's rows of the output
        for seq, ids, w in zip(seqs, arrays, wide):
            n, n_past = ids.size, self._n_past[seq]
            self._tokens[at:at + n] = ids
            self._pos[at:at + n] = np.arange(n_past, n_past + n, dtype=np.int32)
            self._seq[at:at + n] = seq
            take = np.arange(at, at + n, dtype=np.int32) if w else np.array([at + n - 1], np.int32)
            self._rows[R:R + take.size] = take
            spans.append((R, R + take.size))
            R += take.size
            at += n
        self._exec.step(total, R if self._select else 0, self.options.threads, True)
        for seq, ids in zip(seqs, arrays):
            self._n_past[seq] += ids.size
        if not self._select:
            return [self._out[:total].copy() if wide[0] else self._out[total - 1][None].copy()]
        return [self._out[a:b].copy() for a, b in spans]

    def hidden_states(self, tokens) -> np.ndarray:
        """Final-norm hidden states [len(tokens), dim] of tokens run at positions n_past.. (appended
        to the cache), as transformers' last_hidden_state. Needs an Engine made with output="hidden"."""
        if self.options.output != "hidden":
            raise RuntimeInputError("hidden_states() needs an Engine created with output='hidden'; "
                                    "this one computes logits")
        return self.forward(tokens, logits_for="all")


class EngineSlot:
    """One KV slot of an Engine with the single-sequence API (what KVSession and the generation
    loop drive): forward / truncate / reset act on this slot only."""

    def __init__(self, engine: Engine, seq: int):
        self.engine = engine
        self.seq = seq

    @property
    def n_past(self) -> int:
        return self.engine.seq_n_past(self.seq)

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def max_batch_tokens(self) -> int:
        return self.engine.max_batch_tokens

    def forward(self, tokens, *, logits_for: str = "last") -> np.ndarray:
        return self.engine.forward(tokens, logits_for=logits_for, seq=self.seq)

    def truncate(self, n: int) -> None:
        self.engine.truncate(n, self.seq)

    def reset(self) -> None:
        self.engine.reset(self.seq)
