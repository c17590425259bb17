"""`ignis compile` / ignis.compile: a model's compiled step, converted weights and the C runtime as
one directory a C program (or any FFI) uses without Python:

  DIR/libignis_<name>.so   the C core, the kernel tables, csrc/native and the blob (blob.py):
                           MODL (modl.py), EMBD (the embedding step, MODL's format over the
                           same weights), CONF (JSON), TOKN (tokenizer_blob.py) and CHAT
                           (chat_blob.py) when the C side reproduces the tokenizer and template
  DIR/ignis_model.h        the C ABI
  DIR/weights.bin          the weights in the chosen format, laid out for mmap (weights_file.py);
                           with embed_weights the same bytes inside the library instead (link.py)
  DIR/manifest.json        model, architecture, format, sha256 and size of weights.bin, context,
                           ignis version, ABI and weights format versions

The step is the one an Engine runs (compile_engine_step: prefill chunks of up to 128 tokens), the
weights the ones it reads (the same converters and conversion cache), so greedy ids from the
library equal the in-process engine's on the same kernel table.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .._version import __version__
from ..formats import FORMATS, WEIGHT_FORMATS
from . import link
from .blob import pack_blob
from .errors import NativeCompileError
from .modl import KV_AUTO, WeightEntry, modl_section
from .weights_file import WEIGHTS_FORMAT_VERSION, WeightsWriter

ABI_VERSION = 1                   # = IGNIS_ABI_VERSION in ignis_model.h
MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
MAX_BATCH_TOKENS = 128            # the Engine's default prefill chunk
_SWIGLU_OPS = {"linear_swiglu": (0, 1), "rms_linear_swiglu": (1, 2)}


@dataclass(frozen=True)
class CompileResult:
    directory: Path
    library: Path
    library_bytes: int            # the .so: code and model data (and the weights when embedded)
    weights_bytes: int
    weight_format: str
    n_ctx: int
    seconds: float
    embedded_weights: bool = False


def _ours(name: str) -> bool:
    return name in (link.HEADER, WEIGHTS, MANIFEST) or (name.startswith("libignis_")
                                                         and name.endswith((".so", ".dylib")))


def _check_out_dir(out_dir: Path) -> None:
    """out_dir may be missing, empty, or hold only what a previous compile wrote."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NativeCompileError(f"output {str(out_dir)!r} exists and is not a directory")
    if out_dir.is_dir():
        others = sorted(p.name for p in out_dir.iterdir() if not _ours(p.name))
        if others:
            raise NativeCompileError(
                f"output directory {str(out_dir)!r} holds other files ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}); give an empty or new directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".ignis-probe-")
        probe.close()
    except OSError as e:
        raise NativeCompileError(f"cannot write to the output directory {str(out_dir)!r}: "
                                 f"{e.strerror or e}") from None


def _open(model, progress: bool):
    """ModelFiles from a registry name, directory, .gguf path, ModelFiles or ignis.Model."""
    from ..loader.resolve import open_model
    if hasattr(model, "files") and hasattr(model.files, "weights"):     # ignis.Model
        return model.files, False
    if hasattr(model, "config") and hasattr(model, "weights"):          # ModelFiles
        return model, False
    if not isinstance(model, (str, Path)):
        raise NativeCompileError(f"model must be a registry name, a model directory, a .gguf file "
                                 f"or a loaded model, got {type(model).__name__}")
    return open_model(model, progress=progress), True


def _f32_needed(tape, packed: list) -> set[int]:
    """Weights whose f32 rows the executor reads although they have a packing: gathers (a tied
    embedding is also the output projection) and both weights of a SwiGLU pair packed
    differently (executor.c linear_x runs such a pair on f32 rows)."""
    need = set()
    for ins in tape.instrs:
        if ins.op == "embed":
            need.update(ins.weights)
        elif ins.op in _SWIGLU_OPS:
            a, b = (ins.weights[i] for i in _SWIGLU_OPS[ins.op])
            pa = packed[a][0] if packed[a] is not None else 0
            pb = packed[b][0] if packed[b] is not None else 0
            if pa != pb:
                need.update((a, b))
    return need


def _conf(files, tokenizer, *, weight_format: str, n_ctx: int, eos: tuple[int, ...],
          chat_spellings: list[str] | None = None) -> bytes:
    g = files.generation_config
    cfg = files.config
    conf = {
        "model": files.name, "architecture": cfg.arch, "weight_format": weight_format,
        "n_ctx": n_ctx, "vocab_size": cfg.vocab_size, "max_batch_tokens": min(MAX_BATCH_TOKENS, n_ctx),
        "eos_token_ids": list(eos),
        "bos_token_id": getattr(tokenizer, "bos_token_id", None), "tokenizer": tokenizer is not None,
        "generation": {"do_sample": g.do_sample, "temperature": g.temperature, "top_k": g.top_k,
                       "top_p": g.top_p, "min_p": g.min_p,
                       "repetition_penalty": g.repetition_penalty,
                       "max_new_tokens": g.max_new_tokens},
        "ignis_version": __version__, "abi_version": ABI_VERSION,
        # the spellings the runtime masks in chat messages' text (chat_blob.masker_spellings)
        "chat_added_tokens": chat_spellings,
    }
    return json.dumps(conf, sort_keys=True).encode()


def _tokenizer(files):
    """(tokenizer, None), or (None, why) for a model whose tokenizer ignis cannot read (a test
    GGUF's made-up vocabulary): the library is then usable with token ids only."""
    from ..tokenizer.errors import TokenizerError
    from ..tokenizer.tokenizer import load_tokenizer
    try:
        return load_tokenizer(files.path), None
    except TokenizerError as e:
        return None, str(e)


def _tokenizer_section(tokenizer, eos: tuple[int, ...]) -> bytes | None:
    """TOKN from ignis.native.tokenizer_blob, or None with a warning for a tokenizer the C side
    cannot reproduce exactly."""
    from ..tokenizer.errors import TokenizerError
    from . import tokenizer_blob
    try:
        return tokenizer_blob.tokenizer_section(tokenizer, eos_token_ids=list(eos))
    except TokenizerError as e:
        warnings.warn(f"the tokenizer is not compiled into the library ({e}); it takes token ids "
                      f"only", RuntimeWarning, stacklevel=3)
        return None


def _chat_section(tokenizer) -> tuple[bytes | None, list[str]]:
    """CHAT (ignis.native.chat_blob: which C renderer reproduces the model's chat template) and the
    added-token spellings the runtime masks in a conversation's strings; (None, []) with a warning
    for a template no renderer reproduces exactly (the library then answers chat requests with
    an error saying so)."""
    from ..tokenizer.errors import ChatTemplateError
    from . import chat_blob
    config = getattr(tokenizer, "config", {}) or {}
    specials = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                if isinstance(config.get(k), str)}
    spellings = chat_blob.masker_spellings(tokenizer)
    try:
        return (chat_blob.chat_section(tokenizer.chat_template, special_tokens=specials,
                                       added_tokens=spellings), spellings)
    except ChatTemplateError as e:
        warnings.warn(f"the chat template is not compiled into the library ({e}); it answers "
                      f"completions only", RuntimeWarning, stacklevel=3)
        return None, []


def compile_model(model, out_dir, *, weights: str = "auto", ctx: int | None = None,
                  embed_weights: bool = False, progress: bool = True,
                  log: Callable[[str], None] | None = None) -> CompileResult:
    """Compile `model` (registry name, model directory, .gguf file, or a loaded model) into
    out_dir. weights: "auto" (as ignis.load chooses) or one of WEIGHT_FORMATS; ctx: the KV context
    (default: the model's maximum, capped at 4096); embed_weights: put the weights inside the
    library instead of DIR/weights.bin (one file to ship; ignis_open(NULL, ...) then opens it
    without its directory). `log` receives progress lines."""
    from ..api.model import stop_token_ids
    from ..models import FAMILIES
    from ..runtime.engine import (AUTO, WeightChoice, _f32_weights, _packed_weights,
                                  _warn_if_portable, check_n_ctx, choose_weight_format,
                                  compile_engine_step)
    from .. import _core

    t0 = time.perf_counter()
    say = log or (lambda s: None)
    if weights != AUTO and weights not in WEIGHT_FORMATS:
        raise NativeCompileError(f"weights must be 'auto' or one of {', '.join(WEIGHT_FORMATS)}, "
                                 f"got {weights!r}")
    if ctx is not None:
        check_n_ctx(ctx)
    link.find_cc()                            # fail before the slow part
    link.core_file(link.ARCHIVE)
    link.core_file(link.HEADER)
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir)
    files, opened = _open(model, progress)
    try:
        lib_name = link.library_name(files.name)
        for old in out_dir.iterdir():          # an earlier compile's files: its manifest first
            if old.name == MANIFEST:
                old.unlink()
        for old in out_dir.iterdir():
            old.unlink()
        cfg = files.config
        n_ctx = check_n_ctx(ctx, cfg, kv_dtype="f16")
        choice = (choose_weight_format(files) if weights == AUTO
                  else WeightChoice(weights, "chosen by the caller"))
        fmt = FORMATS[choice.name]
        say(f"compiling {files.name}: {choice.name} weights ({choice.reason}), context {n_ctx}")
        step = compile_engine_step(cfg, n_ctx=n_ctx, max_batch_tokens=min(MAX_BATCH_TOKENS, n_ctx))
        tape = step.tape
        shapes = {k: v.type.shape for k, v in step.graph.weights.items()}
        f32 = _f32_weights(tape.weights, files.weights, shapes, tape.constants,
                           FAMILIES[cfg.arch].load_weight)
        _warn_if_portable(fmt, _core.active_kernels())
        packed = (_packed_weights(fmt, tape, f32, files) if fmt.parts else [None] * len(f32))
        need = _f32_needed(tape, packed)
        tokenizer, why = _tokenizer(files)
        if tokenizer is None:
            warnings.warn(f"{files.name}: its tokenizer cannot be read ({why}); the library takes "
                          f"token ids only", RuntimeWarning, stacklevel=2)
        eos = stop_token_ids(files.generation_config, tokenizer)
        mask = getattr(tokenizer, "token_mask", None)
        valid = (None if tokenizer is None else list(mask(cfg.vocab_size)) if mask is not None
                 else [tokenizer.has_token(i) for i in range(cfg.vocab_size)])

        say(f"writing {WEIGHTS}")
        entries = []
        writer = WeightsWriter(out_dir / WEIGHTS)     # embedded: linked in, then deleted
        try:
            for i, w in enumerate(f32):
                rows = w.shape[0] if w.ndim else 1
                f_off, f_bytes = writer.add(w) if packed[i] is None or i in need else (-1, 0)
                if packed[i] is None:
                    entries.append(WeightEntry(rows, w.size, 0, 0, f_off, f_bytes, -1, 0))
                else:
                    c_id, layout, arr = packed[i]
                    p_off, p_bytes = writer.add(arr)
                    entries.append(WeightEntry(rows, w.size, int(c_id), int(layout), f_off, f_bytes,
                                               p_off, p_bytes))
        finally:
            identity = writer.close()

        tok = _tokenizer_section(tokenizer, eos) if tokenizer is not None else None
        chat, spellings = _chat_section(tokenizer) if tok is not None else (None, [])
        sections = {
            "MODL": modl_section(tape=tape, records=tape.to_records(), weights=entries,
                                 kv_dtype=KV_AUTO, vocab_size=cfg.vocab_size, out_width=cfg.vocab_size,
                                 eos=list(eos), valid=valid, identity=identity,
                                 f32_weights=choice.name == "f32"),
            "CONF": _conf(files, tokenizer, weight_format=choice.name, n_ctx=n_ctx, eos=eos,
                          chat_spellings=spellings if chat is not None else None),
        }
        # the embedding step (Engine(output="hidden"), as Model.embed builds it): its own tape over
        # the same weights.bin entries, looked up by name as share_weights does: no second copy
        hid = compile_engine_step(cfg, n_ctx=n_ctx, max_batch_tokens=min(MAX_BATCH_TOKENS, n_ctx),
                                  output="hidden").tape
        by_name = dict(zip(tape.weights, entries))
        missing = [n for n in hid.weights if n not in by_name]
        if missing:
            raise NativeCompileError(f"the embedding step reads weights the generation step does not "
                                     f"({', '.join(missing[:5])}); ignis compile cannot share them")
        sections["EMBD"] = modl_section(tape=hid, records=hid.to_records(),
                                        weights=[by_name[n] for n in hid.weights], kv_dtype=KV_AUTO,
                                        vocab_size=cfg.vocab_size, out_width=cfg.dim, eos=list(eos),
                                        valid=None, identity=identity,
                                        f32_weights=choice.name == "f32")
        if tok is not None:
            sections["TOKN"] = tok
        if chat is not None:
            sections["CHAT"] = chat
        say(f"linking {lib_name}")
        with tempfile.TemporaryDirectory(prefix="ignis-compile-") as tmp:
            blob = Path(tmp) / "blob.bin"
            blob.write_bytes(pack_blob(sections))
            link.link_library(blob, out_dir / lib_name, Path(tmp),
                              weights=out_dir / WEIGHTS if embed_weights else None)
        if embed_weights:
            (out_dir / WEIGHTS).unlink()
        shutil.copyfile(link.core_file(link.HEADER), out_dir / link.HEADER)
        manifest = {
            "model": files.name, "architecture": cfg.arch, "weight_format": choice.name,
            "weights": None if embed_weights else WEIGHTS, "embedded_weights": embed_weights,
            "sha256": identity.sha256.hex(), "size": identity.size,
            "n_ctx": n_ctx, "library": lib_name, "ignis_version": __version__,
            "abi_version": ABI_VERSION, "weights_format_version": WEIGHTS_FORMAT_VERSION,
        }
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        lib = out_dir / lib_name
        return CompileResult(out_dir, lib, lib.stat().st_size, identity.size, choice.name, n_ctx,
                             time.perf_counter() - t0, embed_weights)
    finally:
        if opened:
            files.weights.close()
