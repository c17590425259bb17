"""Turn what a user typed (a registry name, a Hugging Face directory, a .gguf file) into opened model
files: config, generation defaults and zero-copy weights. Behind `ignis.load`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError, ModelNotFoundError
from ..models import FAMILIES
from . import registry
from .config import TENSORS_PER_LAYER_MIN, GenerationConfig, ModelConfig
from .provenance import WeightsSource, gguf_digest, weights_source
from .safetensors import WeightStore, load_checkpoint


@dataclass(frozen=True)
class ModelFiles:
    path: Path                          # the Hugging Face layout directory
    config: ModelConfig
    generation_config: GenerationConfig
    weights: WeightStore                # name -> read-only mmap view; close() when done
    name: str
    progress: bool = True               # show the first conversion of the weights (on a terminal)
    source: WeightsSource | None = None  # what identifies the weights (read once, at open)


def open_model(name_or_path: str | Path, *, progress: bool = True) -> ModelFiles:
    """Resolve a registry name, a model directory or a .gguf file and open it.

    A .gguf file is imported once into IGNIS_HOME/models/gguf-<sha256[:32]>/ and reused afterwards.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in registry.REGISTRY:
        return open_dir(registry.pull(text, progress=progress), name=text, progress=progress)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return open_dir(path, name=path.name, progress=progress)
        raise ModelNotFoundError(f"{text!r} is a directory but has no config.json; a model directory "
                                 "needs config.json and model.safetensors (Hugging Face layout)")
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
            return open_dir(import_gguf_cached(path, progress=progress), name=path.stem,
                            progress=progress)
        raise ModelNotFoundError(f"{text!r} is a file but not a .gguf model; pass a model directory "
                                 "(with config.json) or a .gguf file")
    if path.suffix.lower() == ".gguf":
        raise ModelNotFoundError(f"the .gguf file {text!r} does not exist")
    raise ModelNotFoundError(
        f"cannot find model {text!r}: it is not a registry name (known: "
        f"{', '.join(sorted(registry.REGISTRY))}), not a directory with config.json, and not a "
        f".gguf file")


def open_dir(path: Path, *, name: str, progress: bool = True) -> ModelFiles:
    from .cache import mark_used
    mark_used(path)
    config = ModelConfig.from_file(path / "config.json")
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen = GenerationConfig.from_file(gen_path)
        if not gen.eos_token_ids and config.eos_token_ids:
            gen = _with_eos(gen, config)
    else:
        gen = GenerationConfig(eos_token_ids=config.eos_token_ids, bos_token_id=config.bos_token_id)
    weights = load_checkpoint(path)
    try:
        check_weights(config, weights, path)
        source = weights_source(weights)
    except BaseException:
        weights.close()
        raise
    return ModelFiles(path=path, config=config, generation_config=gen, weights=weights, name=name,
                      progress=progress, source=source)


def check_weights(config: ModelConfig, weights: WeightStore, path: Path) -> None:
    """Refuse a checkpoint that does not hold exactly the tensors the config implies: every one at
    the right shape, as a floating-point dtype, and none that the architecture would not read
    (a config.json that does not describe these weights: fewer layers, biases ignis does not
    apply, an lm_head beside tied embeddings that differs from them). Rotary caches
    (`rotary_emb.inv_freq`, derived from rope_theta) are the one extra allowed."""
    if config.n_layers * TENSORS_PER_LAYER_MIN > len(weights):
        raise ModelFormatError(f"config.json says {config.n_layers} layers, but the checkpoint has only "
                               f"{len(weights)} tensors", path=str(path))
    expected = FAMILIES[config.arch].weight_shapes(config)
    missing = []
    for name, shape in expected.items():
        if name not in weights:
            missing.append(name)
            continue
        info = weights.info(name)
        if tuple(info.shape) != shape:
            raise ModelFormatError(f"shape {list(info.shape)} does not match config.json, which "
                                   f"implies {list(shape)}", path=str(path), tensor=name)
        if info.dtype not in ("F32", "F16", "BF16"):
            raise ModelFormatError(f"dtype {info.dtype} is not a weight dtype ignis reads "
                                   f"(F32, F16, BF16)", path=str(path), tensor=name)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        hint = ("; config.json says tie_word_embeddings: false, so the output projection is a tensor "
                "of its own (if it is the embedding, set tie_word_embeddings to true)"
                if "lm_head.weight" in missing else "")
        raise ModelFormatError(f"the checkpoint lacks tensors the config implies: "
                               f"{', '.join(missing[:3])}{more}{hint}", path=str(path))
    unused = sorted((n for n in weights if n not in expected and not _ROTARY_CACHE.fullmatch(n)),
                    key=_natural)
    if config.tie_word_embeddings and "lm_head.weight" in unused:
        if not _same_tensor(weights, "lm_head.weight", "model.embed_tokens.weight"):
            raise ModelFormatError(
                "config.json says tie_word_embeddings: true, but the checkpoint has an lm_head.weight "
                "that differs from the embedding (transformers then uses lm_head.weight, untied); set "
                "tie_word_embeddings to false if it is the model's output projection",
                path=str(path), tensor="lm_head.weight")
        unused.remove("lm_head.weight")         # a copy of the tied embedding: nothing to refuse
    if unused:
        raise ModelFormatError(
            f"the checkpoint has {len(unused)} tensor{'s' if len(unused) > 1 else ''} that a "
            f"{config.arch} model with this config.json does not use: {', '.join(unused[:4])}"
            f"{f' and {len(unused) - 4} more' if len(unused) > 4 else ''}; {_unused_hint(config, unused)}",
            path=str(path))


_ROTARY_CACHE = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _natural(name: str) -> tuple:
    """Sort key putting model.layers.10 after model.layers.9."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _same_tensor(weights: WeightStore, a: str, b: str) -> bool:
    ia, ib = weights.info(a), weights.info(b)
    return (ia.dtype == ib.dtype and tuple(ia.shape) == tuple(ib.shape)
            and np.array_equal(weights[a], weights[b]))


def _unused_hint(config: ModelConfig, unused: list[str]) -> str:
    """What the unused tensors most likely mean, and what to do."""
    layers = [int(m.group(1)) for n in unused if (m := _LAYER.match(n))]
    if layers and max(layers) >= config.n_layers:
        return (f"config.json says num_hidden_layers={config.n_layers}, but the checkpoint has "
                f"layers up to {max(layers)}: the config does not describe these weights (running "
                f"them with it would generate garbage); correct num_hidden_layers")
    if any(n.endswith("self_attn.o_proj.bias") for n in unused):
        return ("attention_bias: true puts a bias on o_proj as well as on q/k/v in a Llama model, and "
                "ignis does not implement the o_proj bias")
    if any(".mlp." in n and n.endswith(".bias") for n in unused):
        return "biases on the MLP projections are not implemented"
    if any(n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")) for n in unused):
        return "the q/k/v biases are not applied unless config.json says attention_bias: true"
    return ("the weights belong to another architecture or configuration than config.json "
            "describes; running without them would compute something else")


def _with_eos(gen: GenerationConfig, config: ModelConfig) -> GenerationConfig:
    from dataclasses import replace
    return replace(gen, eos_token_ids=config.eos_token_ids,
                   bos_token_id=gen.bos_token_id if gen.bos_token_id is not None else config.bos_token_id)


def import_gguf_cached(path: Path, *, progress: bool = True) -> Path:
    """Import a user's .gguf into the cache, keyed by its sha256, unless already there.

    The import is shared by every byte-identical file (other names, other places, the registry
    model it may be a copy of, whose generation defaults it then gets). Hashing a large GGUF on
    every open would dominate load time, so the hash is remembered per (absolute path, size, mtime)
    in IGNIS_HOME/models/.gguf-index/; a changed file is re-hashed.
    """
    digest = gguf_digest(path, progress=progress)
    found = registry.find_import(digest)
    if found is None:
        entry = registry.entry_for_sha256(digest)
        out = registry.import_dir(digest)
        with registry.import_lock(out):
            found = registry.find_import(digest)     # done meanwhile by another process?
            if found is None:
                registry.refuse_collision(out, digest)
                registry.remove_stale_leftovers(out)
                registry.import_gguf(path, out, progress=progress, sha256=digest,
                                     generation_defaults=entry.generation_config if entry else None,
                                     model_name=entry.name if entry else None,
                                     overwrite=out.exists())
                found = out
    registry.ensure_source(found, candidate=path)   # the recorded source may be a deleted copy
    return found


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
