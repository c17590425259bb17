"""Turn what a user typed (a registry name, a Hugging Face directory, a .gguf file) into opened model
files: config, generation defaults and zero-copy weights. Behind `ignis.load`.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFormatError, ModelNotFoundError
from . import registry
from .config import TENSORS_PER_LAYER_MIN, GenerationConfig, ModelConfig, expected_tensor_shapes
from .provenance import file_sha256, read_provenance
from .safetensors import WeightStore, load_checkpoint


@dataclass(frozen=True)
class ModelFiles:
    path: Path                          # the Hugging Face layout directory
    config: ModelConfig
    generation_config: GenerationConfig
    weights: WeightStore                # name -> read-only mmap view; close() when done
    name: str


def open_model(name_or_path: str | Path, *, progress: bool = True) -> ModelFiles:
    """Resolve a registry name, a model directory or a .gguf file and open it.

    A .gguf file is imported once into IGNIS_HOME/models/gguf-<sha256[:16]>/ and reused afterwards.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in registry.REGISTRY:
        return open_dir(registry.pull(text, progress=progress), name=text)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return open_dir(path, name=path.name)
        raise ModelNotFoundError(f"{text!r} is a directory but has no config.json; a model directory "
                                 "needs config.json and model.safetensors (Hugging Face layout)")
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
            return open_dir(import_gguf_cached(path, progress=progress), name=path.stem)
        raise ModelNotFoundError(f"{text!r} is a file but not a .gguf model; pass a model directory "
                                 "(with config.json) or a .gguf file")
    raise ModelNotFoundError(
        f"cannot find model {text!r}: it is not a registry name (known: "
        f"{', '.join(sorted(registry.REGISTRY))}), not a directory with config.json, and not a "
        f".gguf file")


def open_dir(path: Path, *, name: str) -> ModelFiles:
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
    except BaseException:
        weights.close()
        raise
    return ModelFiles(path=path, config=config, generation_config=gen, weights=weights, name=name)


def check_weights(config: ModelConfig, weights: WeightStore, path: Path) -> None:
    """Refuse a checkpoint that does not hold every tensor the config implies, at the right shape,
    as a floating-point dtype. Extra tensors (e.g. rotary caches) are ignored."""
    if config.n_layers * TENSORS_PER_LAYER_MIN > len(weights):
        raise ModelFormatError(f"config.json says {config.n_layers} layers, but the checkpoint has only "
                               f"{len(weights)} tensors", path=str(path))
    missing = []
    for name, shape in expected_tensor_shapes(config).items():
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
        raise ModelFormatError(f"the checkpoint lacks tensors the config implies: "
                               f"{', '.join(missing[:3])}{more}", path=str(path))


def _with_eos(gen: GenerationConfig, config: ModelConfig) -> GenerationConfig:
    from dataclasses import replace
    return replace(gen, eos_token_ids=config.eos_token_ids,
                   bos_token_id=gen.bos_token_id if gen.bos_token_id is not None else config.bos_token_id)


def import_gguf_cached(path: Path, *, progress: bool = True) -> Path:
    """Import a user's .gguf into the cache, keyed by its sha256, unless already there.

    Hashing a large GGUF on every open would dominate load time, so the hash is remembered per
    (absolute path, size, mtime) in IGNIS_HOME/models/.gguf-index/; a changed file is re-hashed.
    """
    digest = _known_digest(path) or file_sha256(path)
    out = registry.ignis_home() / "models" / f"gguf-{digest[:16]}"
    if not _imported_from(out, digest):
        with registry.import_lock(out):
            if not _imported_from(out, digest):    # not done meanwhile by another process
                registry.remove_stale_leftovers(out)
                registry.import_gguf(path, out, progress=progress, sha256=digest,
                                     overwrite=out.exists())
    _remember_digest(path, digest)
    return out


def _imported_from(out: Path, digest: str) -> bool:
    prov = read_provenance(out)
    return (prov is not None and prov.get("source", {}).get("sha256") == digest
            and (out / "model.safetensors").is_file())


def _index_file(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return registry.ignis_home() / "models" / ".gguf-index" / f"{key}.json"


def _stat_key(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _known_digest(path: Path) -> str | None:
    try:
        rec = json.loads(_index_file(path).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or {k: rec.get(k) for k in ("path", "size", "mtime_ns")} != _stat_key(path):
        return None
    digest = rec.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def _remember_digest(path: Path, digest: str) -> None:
    f = _index_file(path)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f"{f.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps({**_stat_key(path), "sha256": digest}), "utf-8")
        os.replace(tmp, f)
    except OSError:
        pass        # only a speed-up: without it the next open hashes the file again


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
