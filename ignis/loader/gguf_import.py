"""Import a GGUF file into a Hugging Face layout directory (config.json, F32 model.safetensors,
tokenizer files, generation_config.json, ignis_import.json provenance), atomically.

Dequantization is the `gguf` package's own (llama.cpp's reference Python); this module adds the name
mapping, the shape checks, the Llama Q/K row un-permutation and the all-or-nothing write. A file's
rope_freqs.weight (llama.cpp's per-frequency divisors, Llama 3's rope scaling as its converter
writes it) becomes the config's rope scaling, not a tensor.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError, GGUFError, IgnisError
from ..models import FAMILIES, Family
from .gguf_tensors import tensor_index
from .provenance import PROVENANCE_FILE, PROVENANCE_FORMAT
from .config import TENSORS_PER_LAYER_MIN, GenerationConfig, ModelConfig, RopeScaling

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFValueType as VT
except ImportError as e:  # pragma: no cover - gguf is a hard dependency of the package
    raise ImportError("ignis needs the 'gguf' package to import GGUF files: pip install gguf") from e


SUPPORTED_GGUF_ARCHS = tuple(sorted(FAMILIES))    # general.architecture = the family's name

# Every type the registry models use, and the types of llama.cpp's Q5_K_M, Q3_K_M and Q2_K files
# (Q5_1, Q5_K, Q3_K, Q2_K, and IQ4_NL, its fallback for Q3_K rows not made of 256-weight super-blocks:
# checked against the gguf package's dequantizers on its quantizer's Q5_1 blocks and random blocks of
# the others, not yet on a real file): formats.gguf_blocks has a layout for each quantized one.
SUPPORTED_TYPES = frozenset({QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_0, QT.Q5_1,
                             QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.IQ4_NL})
# Types no layout holds without loss, imported through f32 by the gguf package's own dequantizer
# (exact to it): they run on the f32 path, 4-16x their size in the file. BF16 widens exactly.
# (by name: an older gguf package lacks the newest of them, e.g. MXFP4)
F32_PATH_TYPES = frozenset(getattr(QT, n) for n in (
    "BF16", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0",
    "TQ2_0", "MXFP4") if hasattr(QT, n))
IMPORTABLE_TYPES = SUPPORTED_TYPES | F32_PATH_TYPES

_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
# llama.cpp divides the angle of rotary pair j by rope_freqs.weight[j] (its Llama 3 rope scaling)
ROPE_FREQS = "rope_freqs.weight"
GGUF_ROPE_SCALINGS = ("none", "linear")     # rope.scaling.type values ignis runs

_INT_TYPES = {VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}
_FLOAT_TYPES = {VT.FLOAT32, VT.FLOAT64}

# Rows dequantized per step: bounds the temporaries of gguf's vectorised dequantizers (~64 MB f32).
_CHUNK_ELEMENTS = 1 << 24


class ImportTargetExistsError(IgnisError, FileExistsError):
    """The import's destination directory already exists and overwriting was not asked for."""


@dataclass(frozen=True)
class TensorPlan:
    """One GGUF tensor and what it becomes in the Hugging Face layout."""
    gguf_name: str
    hf_name: str
    qtype: "QT"
    shape: tuple[int, ...]          # Hugging Face shape ([out, in] for matrices)
    unpermute_heads: int | None     # undo llama.cpp's rope row permutation over this many heads
    offset: float = 0.0             # subtracted (in f32): what llama.cpp added (Gemma norms: 1)

    @property
    def nbytes_f32(self) -> int:
        return 4 * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class GGUFModel:
    """A validated GGUF file: its reader, the ModelConfig it describes and the tensor plan."""
    path: Path
    reader: "gguf.GGUFReader"
    config: ModelConfig
    tensors: tuple[TensorPlan, ...]
    by_name: Mapping[str, Any] = field(repr=False, compare=False)    # GGUF name -> ReaderTensor


# --- reading and validating -------------------------------------------------------------------

def hf_tensor_name(gguf_name: str, family: Family) -> str | None:
    """The Hugging Face name of a GGUF tensor of `family`, or None when ignis does not know it."""
    if gguf_name in family.gguf_global_tensors:
        return family.gguf_global_tensors[gguf_name]
    layer = family.gguf_layer_tensors
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer:
        if parts[1] != str(int(parts[1])):      # "blk.01" is not a name llama.cpp writes
            return None
        return f"model.layers.{int(parts[1])}.{layer[parts[2]]}"
    return None


def open_gguf(path: str | Path) -> GGUFModel:
    """Parse and validate a GGUF file; raise GGUFError naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError("GGUF file not found", path=str(path))
    reader = _read(path)
    config = _config_from_metadata(reader, path)
    plans = _plan_tensors(reader, config, path)
    return GGUFModel(path=path, reader=reader, config=config, tensors=plans,
                     by_name={t.name: t for t in reader.tensors})


def _read(path: Path) -> "gguf.GGUFReader":
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise GGUFError(f"file is too short to be GGUF ({len(head)} bytes)", path=str(path))
    if head[:4] != b"GGUF":
        raise GGUFError(f"not a GGUF file: magic is {head[:4]!r}, expected b'GGUF'", path=str(path))
    # gguf's reader does not stop at the end of the file: past it every read is empty, so a corrupt
    # array count keeps it looping (up to 2**64 times, its lists growing until memory runs out).
    # ignis's own header walk is bounded by the file's size; it refuses such files first.
    tensor_index(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError) as e:
        # The reader walks the header with memmap views: a cut-off file surfaces as a short view
        # that cannot be reshaped, an out-of-range read, or an unknown enum value.
        raise GGUFError(f"malformed or truncated GGUF: {type(e).__name__}: {e}", path=str(path)) from None
    if reader.byte_order != "I":
        raise GGUFError("big-endian GGUF files are not supported", path=str(path))
    return reader


def _field(reader: "gguf.GGUFReader", key: str, path: Path, kind: str, *, required: bool = True) -> Any:
    f = reader.get_field(key)
    if f is None:
        if required:
            raise GGUFError(f"metadata key {key!r} is missing", path=str(path))
        return None
    t = f.types[0] if f.types else None
    ok = {"int": t in _INT_TYPES, "float": t in _FLOAT_TYPES or t in _INT_TYPES,
          "str": t == VT.STRING, "bool": t == VT.BOOL,
          "str_list": t == VT.ARRAY and f.types[-1] == VT.STRING}[kind]
    if not ok:
        raise GGUFError(f"metadata key {key!r} has type {[x.name for x in f.types]}, expected {kind}",
                        path=str(path))
    try:
        return f.contents()
    except UnicodeDecodeError:
        raise GGUFError(f"metadata key {key!r} is not valid UTF-8", path=str(path)) from None


def _config_from_metadata(reader: "gguf.GGUFReader", path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture", path, "str")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise GGUFError(f"architecture {arch!r} is not supported; ignis imports: "
                        f"{', '.join(SUPPORTED_GGUF_ARCHS)}", path=str(path))

    def pos_int(key: str) -> int:
        v = _field(reader, f"{arch}.{key}", path, "int")
        if v < 1:
            raise GGUFError(f"metadata key '{arch}.{key}' must be positive, got {v}", path=str(path))
        return int(v)

    def pos_float(key: str) -> float:
        v = float(_field(reader, f"{arch}.{key}", path, "float"))
        if not np.isfinite(v) or v <= 0:
            raise GGUFError(f"metadata key '{arch}.{key}' must be a positive number, got {v}",
                            path=str(path))
        # GGUF stores these as float32; the shortest decimal that round-trips the float32
        # (1e-06, not 9.99999997e-07) is what the original config.json said.
        return float(str(np.float32(v)))

    dim = pos_int("embedding_length")
    n_heads = pos_int("attention.head_count")
    n_kv_heads = pos_int("attention.head_count_kv")
    if n_heads % n_kv_heads:
        raise GGUFError(f"head_count ({n_heads}) is not a multiple of head_count_kv ({n_kv_heads})",
                        path=str(path))
    head_dim = _field(reader, f"{arch}.attention.key_length", path, "int", required=False)
    if head_dim is None:
        if dim % n_heads:
            raise GGUFError(f"embedding_length ({dim}) is not divisible by head_count ({n_heads}) "
                            f"and no attention.key_length is given", path=str(path))
        head_dim = dim // n_heads
    value_len = _field(reader, f"{arch}.attention.value_length", path, "int", required=False)
    if value_len is not None and value_len != head_dim:
        raise GGUFError(f"attention.value_length {value_len} != key_length {head_dim} is not supported",
                        path=str(path))
    rope_dims = _field(reader, f"{arch}.rope.dimension_count", path, "int", required=False)
    if rope_dims is not None and rope_dims != head_dim:
        raise GGUFError(f"partial rotary embedding (rope.dimension_count {rope_dims} < head dim "
                        f"{head_dim}) is not supported", path=str(path))
    tensors = {t.name: t for t in reader.tensors}
    rope_scaling = _rope_scaling(reader, arch, tensors, int(head_dim), path)
    if "token_embd.weight" not in tensors:
        raise GGUFError("tensor 'token_embd.weight' is missing", path=str(path))
    embd_shape = [int(x) for x in tensors["token_embd.weight"].shape]
    if len(embd_shape) != 2 or embd_shape[0] != dim:
        raise GGUFError(f"token_embd.weight has GGUF shape {embd_shape}, expected [{dim}, vocab]",
                        path=str(path), tensor="token_embd.weight")
    vocab_size = embd_shape[1]
    tokens = reader.get_field("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens.data) > vocab_size:
        raise GGUFError(f"the token list has {len(tokens.data)} entries but the embedding only "
                        f"{vocab_size} rows", path=str(path))

    bos = _field(reader, "tokenizer.ggml.bos_token_id", path, "int", required=False)
    eos = _field(reader, "tokenizer.ggml.eos_token_id", path, "int", required=False)
    n_layers = pos_int("block_count")
    if n_layers * TENSORS_PER_LAYER_MIN > len(tensors):     # before anything sized by it is built
        raise GGUFError(f"block_count {n_layers} needs at least {n_layers * TENSORS_PER_LAYER_MIN} "
                        f"tensors but the file has {len(tensors)}", path=str(path))
    has_bias = [f"blk.0.{b}" in tensors for b in _BIASES]
    fixed_bias = FAMILIES[arch].attention_bias      # None: the file's tensors say
    if fixed_bias is None and any(has_bias) and not all(has_bias):
        raise GGUFError("q/k/v biases must be all present or all absent", path=str(path))
    fields: dict[str, Any] = dict(
        arch=arch, dim=dim, hidden_dim=pos_int("feed_forward_length"),
        n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim=int(head_dim), vocab_size=vocab_size,
        rope_theta=pos_float("rope.freq_base"), rope_scaling=rope_scaling,
        rms_norm_eps=pos_float("attention.layer_norm_rms_epsilon"),
        tie_word_embeddings="output.weight" not in tensors,
        max_position_embeddings=pos_int("context_length"),
        attention_bias=all(has_bias) if fixed_bias is None else fixed_bias,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        torch_dtype="float32",
    )
    family = FAMILIES[arch]
    if family.gguf_config is not None:
        def get(key: str) -> Any:
            f = reader.get_field(f"{arch}.{key}")
            return None if f is None else f.contents()
        try:
            fields.update(family.gguf_config(get, fields))
        except ConfigError as e:
            raise GGUFError(str(e), path=str(path)) from None
    try:
        return ModelConfig(**fields)
    except ConfigError as e:    # pragma: no cover - ModelConfig() itself does not validate today
        raise GGUFError(str(e), path=str(path)) from None


def _rope_scaling(reader: "gguf.GGUFReader", arch: str, tensors: Mapping[str, Any], head_dim: int,
                  path: Path) -> RopeScaling | None:
    """The file's rope scaling: rope.scaling.type (none, linear) or a rope_freqs.weight tensor."""
    scaling = _field(reader, f"{arch}.rope.scaling.type", path, "str", required=False)
    if scaling not in (None, *GGUF_ROPE_SCALINGS):
        raise GGUFError(f"rope scaling {scaling!r} is not supported (ignis runs rope.scaling.type "
                        f"{', '.join(GGUF_ROPE_SCALINGS)}, and llama.cpp's {ROPE_FREQS})", path=str(path))
    t = tensors.get(ROPE_FREQS)
    if scaling == "linear":
        if t is not None:
            raise GGUFError(f"both rope.scaling.type 'linear' and {ROPE_FREQS}: two rope scalings "
                            f"at once are not supported", path=str(path), tensor=ROPE_FREQS)
        factor = float(_field(reader, f"{arch}.rope.scaling.factor", path, "float"))
        if not np.isfinite(factor) or factor <= 0:
            raise GGUFError(f"metadata key '{arch}.rope.scaling.factor' must be a positive number, "
                            f"got {factor}", path=str(path))
        return RopeScaling("linear", factor=float(str(np.float32(factor))))
    if t is None:
        return None
    shape = [int(x) for x in t.shape]
    if t.tensor_type != QT.F32 or shape != [head_dim // 2]:
        raise GGUFError(f"must be F32 of shape [{head_dim // 2}] (one factor per rotary frequency), "
                        f"got {t.tensor_type.name} {shape}", path=str(path), tensor=ROPE_FREQS)
    factors = np.asarray(t.data, np.float32)
    if not np.all(np.isfinite(factors) & (factors > 0)):
        raise GGUFError("rope frequency factors must be positive and finite", path=str(path),
                        tensor=ROPE_FREQS)
    return RopeScaling("freq_factors", freq_factors=tuple(float(x) for x in factors))


def _plan_tensors(reader: "gguf.GGUFReader", c: ModelConfig, path: Path) -> tuple[TensorPlan, ...]:
    family = FAMILIES[c.arch]
    expected = family.weight_shapes(c)
    plans: list[TensorPlan] = []
    seen: set[str] = set()
    for t in reader.tensors:
        if t.name == ROPE_FREQS:        # read into the config (_rope_scaling)
            continue
        hf = hf_tensor_name(t.name, family)
        if hf is None or hf not in expected:
            raise GGUFError("unknown tensor name (not part of a "
                            f"{c.n_layers}-layer {c.arch} model as ignis maps it)",
                            path=str(path), tensor=t.name)
        if t.tensor_type not in IMPORTABLE_TYPES:
            raise GGUFError(f"tensor type {t.tensor_type.name} is not supported (supported: "
                            f"{', '.join(sorted(q.name for q in IMPORTABLE_TYPES))})",
                            path=str(path), tensor=t.name)
        # GGUF lists dims innermost first (ggml ne[0] = row length); HF lists them outermost first.
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if shape != expected[hf]:
            raise GGUFError(f"shape {list(shape)} (GGUF dims {t.shape.tolist()}) does not match the "
                            f"config's {list(expected[hf])}", path=str(path), tensor=t.name)
        offset = family.gguf_offset(hf) if family.gguf_offset is not None else 0.0
        plans.append(TensorPlan(t.name, hf, t.tensor_type, shape, family.permuted_heads(c, hf),
                                offset))
        seen.add(hf)
    missing = [n for n in expected if n not in seen]
    if missing:
        raise GGUFError(f"{len(missing)} tensor(s) missing, first: {missing[0]!r}", path=str(path))
    return tuple(plans)


# --- tensors ----------------------------------------------------------------------------------

def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp convert's `permute`, which reorders each head's rows from HF's half-split
    rotary layout to interleaved pairs: rows (h, 2, d/2) -> (h, d/2, 2). The inverse reads the rows
    as (h, d/2, 2) and swaps the last two row axes back."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows cannot be split into {n_heads} heads of even size")
    half = rows // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def read_tensor(model: GGUFModel, plan: TensorPlan) -> np.ndarray:
    """One tensor as float32 in the Hugging Face layout (dequantized, un-permuted)."""
    return _read_tensor(model.by_name[plan.gguf_name], plan, model.path)


def _read_tensor(t: Any, plan: TensorPlan, path: Path) -> np.ndarray:
    data = t.data
    try:
        if plan.qtype == QT.F32:
            out = np.asarray(data, dtype=np.float32).reshape(plan.shape)
        elif plan.qtype == QT.F16:
            out = np.asarray(data, dtype=np.float16).astype(np.float32).reshape(plan.shape)
        else:
            rows = data.reshape(-1, data.shape[-1])
            out = np.empty((rows.shape[0], plan.shape[-1]), dtype=np.float32)
            step = max(1, _CHUNK_ELEMENTS // plan.shape[-1])
            for i in range(0, rows.shape[0], step):
                out[i:i + step] = gguf.quants.dequantize(rows[i:i + step], plan.qtype)
            out = out.reshape(plan.shape)
    except (ValueError, TypeError) as e:
        raise GGUFError(f"cannot dequantize {plan.qtype.name} data: {e}", path=str(path),
                        tensor=plan.gguf_name) from None
    if plan.unpermute_heads is not None:
        out = unpermute_rope_rows(out, plan.unpermute_heads)
    if plan.offset:
        out = out - np.float32(plan.offset)
    if not np.all(np.isfinite(out)):
        raise GGUFError("tensor holds NaN or infinite values after dequantization",
                        path=str(path), tensor=plan.gguf_name)
    return out


# --- the import -------------------------------------------------------------------------------

def import_gguf(gguf_path: str | Path, out_dir: str | Path, *, progress: bool = True,
                sha256: str | None = None, generation_defaults: Mapping[str, Any] | None = None,
                model_name: str | None = None, overwrite: bool = False) -> Path:
    """Convert `gguf_path` into a Hugging Face layout directory at `out_dir` and return its path.

    `sha256` is recorded in ignis_import.json (the caller has usually verified it already);
    `generation_defaults` are HF generation_config.json fields known for this model (the GGUF
    carries no sampling defaults). Everything is built in a temporary directory beside `out_dir` and
    renamed into place at the end, so an interrupted import leaves nothing behind.
    """
    from .progress import status
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ImportTargetExistsError(f"{out_dir} already exists; remove it or pass overwrite=True")
    # Parsing the header (a 150k-token vocabulary is 300k metadata strings) and converting the
    # tokenizer take seconds before the first weight is read: say so on a terminal.
    with status(f"reading {Path(gguf_path).name}: metadata, vocabulary", progress):
        model = open_gguf(gguf_path)
        gen = _generation_config(model, generation_defaults)
        tokenizer_files = _tokenizer_files(model)

    _warn_f32_path(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.importing-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        with status("writing the tokenizer and config files", progress):
            _write_json(tmp / "config.json", model.config.to_hf_dict())
            _write_json(tmp / "generation_config.json", gen)
            for fname, content in tokenizer_files.items():
                _write_json(tmp / fname, content)
        _write_weights(model, tmp / "model.safetensors", progress=progress, name=model_name)
        _write_json(tmp / PROVENANCE_FILE, _provenance(model, sha256, model_name, tokenizer_files,
                                                                generation_defaults))
        _install(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _warn_f32_path(model: GGUFModel) -> None:
    """Quantized tensors of a type no layout holds run as f32: say which, and what that costs."""
    slow = [p for p in model.tensors if p.qtype in F32_PATH_TYPES and p.qtype != QT.BF16]
    if not slow:
        return
    by_type = Counter(p.qtype.name for p in slow)
    stored = sum(int(model.by_name[p.gguf_name].n_bytes) for p in slow)
    as_f32 = sum(p.nbytes_f32 for p in slow)
    names = ", ".join(p.gguf_name for p in slow[:4]) + (f" and {len(slow) - 4} more" if len(slow) > 4 else "")
    warnings.warn(f"{model.path.name}: {len(slow)} tensors of type "
                  f"{', '.join(f'{t} ({n})' for t, n in sorted(by_type.items()))} have no block layout "
                  f"in ignis and run as f32 ({names}): {as_f32 / 2**20:.0f} MiB instead of "
                  f"{stored / 2**20:.0f} MiB in the file, and slower; a Q4_K_M, Q5_K_M or Q8_0 file of "
                  f"the model runs in its own blocks", RuntimeWarning, stacklevel=3)


def _generation_config(model: GGUFModel, defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    r, p = model.reader, model.path
    d: dict[str, Any] = {}
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = _field(r, f"tokenizer.ggml.{key}", p, "int", required=False)
        if v is not None:
            d[hf] = int(v)
    d.update(defaults or {})
    try:
        GenerationConfig.from_dict(d, path=str(p))
    except ConfigError as e:
        raise GGUFError(f"generation defaults are invalid: {e}", path=str(p)) from None
    return d


def _tokenizer_files(model: GGUFModel) -> dict[str, Any]:
    # The tokenizer package owns the GGUF vocabulary -> tokenizer.json conversion.
    from ..tokenizer.gguf_vocab import tokenizer_files_from_gguf

    # gguf.GGUFReader keeps no path of its own; the converter names `reader.path` in its errors.
    if getattr(model.reader, "path", None) is None:
        model.reader.path = str(model.path)
    files = tokenizer_files_from_gguf(model.reader)
    if set(files) != {"tokenizer.json", "tokenizer_config.json"}:
        raise GGUFError(f"tokenizer conversion returned {sorted(files)}, expected tokenizer.json and "
                        "tokenizer_config.json", path=str(model.path))
    return dict(files)


def _write_weights(model: GGUFModel, dest: Path, *, progress: bool, name: str | None) -> None:
    from .progress import bar as progress_bar
    from .safetensors import SafetensorsWriter

    specs = [(p.hf_name, "F32", list(p.shape)) for p in model.tensors]
    meta = {"format": "pt", "ignis.source": model.path.name}
    with progress_bar(sum(p.nbytes_f32 for p in model.tensors), f"importing {name or model.path.name}",
                      progress) as bar:
        with SafetensorsWriter(dest, specs, meta) as w:
            for p in model.tensors:
                w.write(p.hf_name, _read_tensor(model.by_name[p.gguf_name], p, model.path))
                bar.update(p.nbytes_f32)


def _provenance(model: GGUFModel, sha256: str | None, model_name: str | None,
                tokenizer_files: Mapping[str, Any],
                generation_defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    st = model.path.stat()
    return {
        "format": PROVENANCE_FORMAT,
        "model": model_name,
        "generation_defaults": dict(generation_defaults or {}),
        # path: where the original quantized blocks live (the runtime may read them directly)
        "source": {"file": model.path.name, "path": str(model.path.resolve()), "sha256": sha256,
                   "size": st.st_size},
        "ignis_version": _ignis_version(),
        "gguf_package_version": _dist_version("gguf"),
        "arch": model.config.arch,
        "tokenizer_files": sorted(tokenizer_files),
        "tensors": {p.hf_name: {"gguf_name": p.gguf_name, "gguf_type": p.qtype.name,
                                "shape": list(p.shape), "unpermuted": p.unpermute_heads is not None}
                    for p in model.tensors},
    }


def _install(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    if overwrite and out_dir.exists():
        # A directory cannot be renamed over a non-empty one: move the old one aside first.
        trash = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out_dir, trash)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            os.rename(trash, out_dir)       # keep the previous, complete import
            raise
        _fsync_dir(out_dir.parent)
        shutil.rmtree(trash, ignore_errors=True)
        return
    try:
        os.rename(tmp, out_dir)
    except OSError as e:
        if out_dir.exists():        # another process finished the same import first
            raise ImportTargetExistsError(f"{out_dir} appeared while importing") from e
        raise
    _fsync_dir(out_dir.parent)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes the rename durable; not every platform can open a directory, which only costs durability.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _ignis_version() -> str:
    try:
        from .._version import __version__
        return str(__version__)
    except ImportError:
        return _dist_version("ignis") or "unknown"


def _dist_version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None

