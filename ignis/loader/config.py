"""config.json and generation_config.json -> frozen ModelConfig / GenerationConfig.

Hugging Face field names appear only in this file; the rest of ignis speaks one size vocabulary:
dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UnsupportedArchitectureError
from ..models import FAMILIES

# HF `architectures` class / `model_type` -> ignis family (models/<family>.py says the rest).
SUPPORTED_ARCHITECTURES = {f.hf_architecture: f.name for f in FAMILIES.values()}
_MODEL_TYPES = {f.model_type: f.name for f in FAMILIES.values()}

# Every config.json key ignis knows, by what it does to the arithmetic. The sets cover every field of
# transformers 5's Qwen2Config, Qwen3Config and LlamaConfig and their PreTrainedConfig base, the
# spellings transformers 4 wrote, and keys of neighbouring families that would change the arithmetic
# (tests/test_loader_hardening.py checks the installed transformers against these sets).
#
# Read and honoured (some only with the values ignis implements; other values are refused by name):
CONFIG_KEYS_IMPLEMENTED = frozenset({
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings",              # the longest n_ctx ignis accepts
    "rms_norm_eps", "hidden_act",           # silu (swish) only
    "rope_parameters", "rope_scaling",      # rope types in ROPE_TYPES; transformers 5 / 4 spellings
    "rope_theta",
    "original_max_position_embeddings",     # llama3 rope: transformers prefers it to the rope object's
    "tie_word_embeddings",                  # checked against the checkpoint's lm_head.weight
    "attention_bias",                       # Llama: q/k/v biases (an o_proj bias is refused)
    "use_sliding_window", "sliding_window", "max_window_layers", "layer_types",  # windows: Gemma 3
    "bos_token_id", "eos_token_id",
})
# Known not to change what a forward pass computes at inference (training, metadata, generation
# defaults transformers keeps in config.json, tensor-parallel hints):
CONFIG_KEYS_HARMLESS = frozenset({
    "transformers_version", "initializer_range", "use_cache", "attention_dropout", "pad_token_id",
    "pretraining_tp", "dtype", "torch_dtype", "output_hidden_states", "output_attentions",
    "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder", "id2label",
    "label2id", "num_labels", "problem_type", "finetuning_task", "_name_or_path", "name_or_path",
    "_commit_hash", "attn_implementation", "_attn_implementation", "_attn_implementation_autoset",
    "experts_implementation", "tokenizer_class", "prefix", "task_specific_params", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "sep_token_id", "decoder_start_token_id", "auto_map",
    "is_llama_config",
    # generation defaults (transformers moves them to the generation config)
    "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids",
    "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff",
    "exponential_decay_length_penalty", "forced_bos_token_id", "forced_eos_token_id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "num_beam_groups", "num_beams", "num_return_sequences",
    "output_scores", "remove_invalid_values", "repetition_penalty", "return_dict_in_generate",
    "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p", "typical_p",
})
# Arithmetic ignis does not implement: refused by name unless the value is one of the neutral ones.
CONFIG_KEYS_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "mlp_bias": ((None, False), "biases on the MLP projections"),
    "partial_rotary_factor": ((None, 1.0), "rotary embedding on only part of each head"),
    "rope_interleaved": ((None, False), "interleaved (GPT-J style) rotary pairs"),
    "attn_logit_softcapping": ((None,), "attention logit softcapping (Gemma 2)"),
    "final_logit_softcapping": ((None,), "final logit softcapping (Gemma 2)"),
    "use_bidirectional_attention": ((None, False), "bidirectional attention (EmbeddingGemma)"),
    "query_pre_attn_scalar": ((None,), "attention scaled by query_pre_attn_scalar (Gemma)"),
    "embedding_multiplier": ((None, 1.0), "scaled embeddings (Granite)"),
    "residual_multiplier": ((None, 1.0), "scaled residual branches (Granite)"),
    "attention_multiplier": ((None,), "a custom attention scale (Granite)"),
    "logits_scaling": ((None, 1.0), "scaled logits (Granite)"),
    "logit_scale": ((None, 1.0), "scaled logits (Cohere)"),
    "use_qk_norm": ((None, False), "RMSNorm on queries and keys"),
    "qk_layernorm": ((None, False), "LayerNorm on queries and keys"),
    "use_parallel_residual": ((None, False), "attention and MLP in parallel branches"),
    "num_experts": ((None, 0, 1), "mixture-of-experts layers"),
    "num_local_experts": ((None, 0, 1), "mixture-of-experts layers"),
    "pruned_heads": ((None, {}), "pruned attention heads"),
    "quantization_config": ((None, {}), "pre-quantized weights (GPTQ, AWQ, bitsandbytes, ...)"),
}
# The rope types ignis runs (models/rope.py computes each one's inverse frequencies) and the keys each
# reads inside a rope_parameters / rope_scaling object besides rope_type, type, rope_theta and
# partial_rotary_factor. "freq_factors" is ignis's own: llama.cpp's per-frequency divisors (GGUF
# rope_freqs.weight) as an imported GGUF's config.json carries them.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "freq_factors": ("freq_factors",),
}
_ROPE_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
_LAYER_TYPES = ("full_attention", "sliding_attention")


class UnknownConfigKeyWarning(UserWarning):
    """config.json has a key ignis has not classified; like transformers, it is not read."""


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary inverse frequencies depart from plain RoPE's theta^(-2j/d): the data
    models/rope.py turns into the table the rope kernels read. Unused fields keep their defaults."""
    type: str                                   # a key of ROPE_TYPES other than "default"
    factor: float = 1.0                         # linear, llama3
    low_freq_factor: float = 1.0                # llama3
    high_freq_factor: float = 4.0               # llama3
    original_max_position_embeddings: int = 8192    # llama3
    freq_factors: tuple[float, ...] = ()        # freq_factors: one divisor per inverse frequency

    def to_hf_dict(self) -> dict[str, Any]:
        keys = ROPE_TYPES[self.type]
        return {"rope_type": self.type,
                **{k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in ((k, getattr(self, k)) for k in keys)}}


@dataclass(frozen=True)
class ModelConfig:
    arch: str                       # a key of ignis.models.FAMILIES: "qwen2" | "llama" | "qwen3" | ...
    dim: int                        # hidden_size
    hidden_dim: int                 # intermediate_size (FFN)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool            # q/k/v projections carry a bias (Qwen2: yes, Llama: no)
    rope_scaling: RopeScaling | None = None     # None: plain RoPE (inverse frequencies theta^(-2j/d))
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    # Gemma 3 (the defaults elsewhere): per-layer attention kinds, the sliding layers' window, their
    # rope base, and the attention scale's query_pre_attn_scalar
    layer_types: tuple[str, ...] = ()       # "full_attention" | "sliding_attention"; (): all full
    sliding_window: int = 0                 # positions a sliding layer attends to, its own included
    rope_local_theta: float | None = None   # rope base of the sliding layers (plain RoPE)
    query_pre_attn_scalar: float | None = None  # scores scaled by its ^-0.5 (None: head_dim's)

    @property
    def kv_group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str | None = None) -> "ModelConfig":
        if not isinstance(d, dict):
            raise ConfigError("config.json must hold a JSON object", path=path)
        arch = _architecture(d, path)

        def req_int(name: str, *, minimum: int = 1) -> int:
            if name not in d:
                raise ConfigError(f"config field {name!r} is missing", path=path, field=name)
            v = d[name]
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"config field {name!r} must be an integer, got {v!r}",
                                  path=path, field=name)
            if v < minimum:
                raise ConfigError(f"config field {name!r} must be >= {minimum}, got {v}",
                                  path=path, field=name)
            return v

        def opt_float(name: str, default: float) -> float:
            v = d.get(name, default)
            if v is None:
                v = default
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"config field {name!r} must be a positive number, got {v!r}",
                                  path=path, field=name)
            return float(v)

        def opt_bool(name: str, default: bool) -> bool:
            v = d.get(name, default)
            if v is None:
                v = default
            if not isinstance(v, bool):
                raise ConfigError(f"config field {name!r} must be true or false, got {v!r}",
                                  path=path, field=name)
            return v

        dim = req_int("hidden_size")
        hidden_dim = req_int("intermediate_size")
        n_layers = req_int("num_hidden_layers")
        n_heads = req_int("num_attention_heads")
        n_kv_heads = d.get("num_key_value_heads", n_heads)
        if n_kv_heads is None:
            n_kv_heads = n_heads
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1:
            raise ConfigError(f"config field 'num_key_value_heads' must be a positive integer, "
                              f"got {n_kv_heads!r}", path=path, field="num_key_value_heads")
        vocab_size = req_int("vocab_size")
        if n_heads % n_kv_heads:
            raise ConfigError(f"num_attention_heads ({n_heads}) must be a multiple of "
                              f"num_key_value_heads ({n_kv_heads})", path=path,
                              field="num_key_value_heads")
        head_dim = d.get("head_dim")
        if head_dim is None:
            if dim % n_heads:
                raise ConfigError(f"hidden_size ({dim}) is not divisible by num_attention_heads "
                                  f"({n_heads}) and no head_dim is given", path=path, field="head_dim")
            head_dim = dim // n_heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ConfigError(f"config field 'head_dim' must be a positive even integer, got {head_dim!r}",
                              path=path, field="head_dim")
        max_pos = req_int("max_position_embeddings")

        family = FAMILIES[arch]
        act = d.get(family.hidden_act_key, family.hidden_acts[0])
        if act not in family.hidden_acts:
            raise ConfigError(f"{family.hidden_act_key} {act!r} is not supported on a {arch} model "
                              f"(ignis runs {', '.join(map(repr, family.hidden_acts))})",
                              path=path, field=family.hidden_act_key)
        extra: dict[str, Any] = {}
        if family.rope_per_layer_type:
            rope_theta, rope_scaling, extra["rope_local_theta"] = _rope_by_layer_type(
                d, max_pos, head_dim, path)
        else:
            rope_theta, rope_scaling = _rope(d, max_pos, head_dim, path)
        _check_full_attention(d, arch, n_layers, max_pos, path)
        _check_refused_keys(d, path, family.config_keys)
        if family.read_config is not None:
            extra.update(family.read_config(d, n_layers, path))

        attention_bias = FAMILIES[arch].attention_bias      # fixed by the family, or read
        if attention_bias is None:
            attention_bias = opt_bool("attention_bias", False)
        _warn_unknown_keys(d, arch, path)

        fields: dict[str, Any] = dict(
            arch=arch, dim=dim, hidden_dim=hidden_dim, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
            rope_theta=rope_theta, rope_scaling=rope_scaling,
            rms_norm_eps=opt_float("rms_norm_eps", 1e-6),
            tie_word_embeddings=opt_bool("tie_word_embeddings", False),
            max_position_embeddings=max_pos,
            attention_bias=attention_bias,
            bos_token_id=_opt_token_id(d, "bos_token_id", path),
            eos_token_ids=_token_ids(d.get("eos_token_id"), "eos_token_id", path),
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )
        fields.update(extra)        # the family's own reading wins (Gemma 3's tied default)
        return cls(**fields)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(read_json(path), path=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json a Hugging Face model of this family would carry."""
        family = FAMILIES[self.arch]
        d: dict[str, Any] = {
            "architectures": [family.hf_architecture],
            "model_type": family.model_type,
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            family.hidden_act_key: family.hidden_acts[0],
            "torch_dtype": self.torch_dtype or "float32",
        }
        d.update(FAMILIES[self.arch].hf_config_extra(self))
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = (self.eos_token_ids[0] if len(self.eos_token_ids) == 1
                                 else list(self.eos_token_ids))
        return d


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling defaults a model ships with; every field may be overridden per call."""
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0                  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str | None = None) -> "GenerationConfig":
        if not isinstance(d, dict):
            raise ConfigError("generation_config.json must hold a JSON object", path=path)

        def num(name: str, default: float, lo: float, hi: float = math.inf, *,
                lo_open: bool = False) -> float:
            v = d.get(name, default)
            if v is None:
                return default
            f = _finite(v)
            if f is None or not (lo <= f <= hi) or (lo_open and f == lo):
                raise ConfigError(f"generation config field {name!r} must be a number in "
                                  f"{'(' if lo_open else '['}{lo}, {hi}], got {v!r:.40}",
                                  path=path, field=name)
            return f

        top_k = d.get("top_k", 0)
        if top_k is None:
            top_k = 0
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ConfigError(f"generation config field 'top_k' must be a non-negative integer, "
                              f"got {top_k!r}", path=path, field="top_k")
        max_new = d.get("max_new_tokens")
        if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int)
                                    or max_new < 1):
            raise ConfigError(f"generation config field 'max_new_tokens' must be a positive integer, "
                              f"got {max_new!r}", path=path, field="max_new_tokens")
        do_sample = d.get("do_sample", False)
        if not isinstance(do_sample, bool):
            raise ConfigError(f"generation config field 'do_sample' must be true or false, "
                              f"got {do_sample!r}", path=path, field="do_sample")
        known = {"eos_token_id", "bos_token_id", "pad_token_id", "do_sample", "temperature", "top_k",
                 "top_p", "min_p", "repetition_penalty", "max_new_tokens"}
        return cls(
            eos_token_ids=_token_ids(d.get("eos_token_id"), "eos_token_id", path),
            bos_token_id=_opt_token_id(d, "bos_token_id", path),
            pad_token_id=_opt_token_id(d, "pad_token_id", path),
            do_sample=do_sample,
            temperature=num("temperature", 1.0, 0.0),
            top_k=top_k,
            top_p=num("top_p", 1.0, 0.0, 1.0),
            min_p=num("min_p", 0.0, 0.0, 1.0),
            repetition_penalty=num("repetition_penalty", 1.0, 0.0, lo_open=True),   # divides
            max_new_tokens=max_new,
            extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "GenerationConfig":
        return cls.from_dict(read_json(path), path=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = (self.eos_token_ids[0] if len(self.eos_token_ids) == 1
                                 else list(self.eos_token_ids))
        if self.pad_token_id is not None:
            d["pad_token_id"] = self.pad_token_id
        d["do_sample"] = self.do_sample
        if self.do_sample:
            d.update(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        if self.repetition_penalty != 1.0:
            d["repetition_penalty"] = self.repetition_penalty
        if self.max_new_tokens is not None:
            d["max_new_tokens"] = self.max_new_tokens
        return d


# Every layer has at least q/k/v/o, two norms and gate/up/down: a cheap bound that refuses an
# absurd layer count before anything sized by it is built.
TENSORS_PER_LAYER_MIN = 9


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path.name} not found", path=str(path)) from None
    except OSError as e:
        raise ConfigError(f"{path.name} cannot be read: {e.strerror or e}", path=str(path)) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path.name} is not valid UTF-8 JSON: {e}", path=str(path)) from None
    except RecursionError:
        raise ConfigError(f"{path.name} is nested too deeply to be a configuration",
                          path=str(path)) from None


def _architecture(d: dict[str, Any], path: str | None) -> str:
    archs = d.get("architectures")
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    if archs is not None:
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"config field 'architectures' must be a non-empty list of names, "
                              f"got {archs!r}", path=path, field="architectures")
        found = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if found is None:
            raise UnsupportedArchitectureError(
                f"architecture {archs[0]!r} is not supported; ignis supports: {supported}",
                path=path, field="architectures")
        arch = SUPPORTED_ARCHITECTURES[found]
        mt = d.get("model_type")
        # transformers builds the model class model_type names: a config whose two names disagree
        # describes two different models, and nothing says which one the weights belong to
        if mt is not None and (not isinstance(mt, str) or _MODEL_TYPES.get(mt) != arch):
            raise ConfigError(f"config.json contradicts itself: architectures names {found} (a "
                              f"{arch!r} model) but model_type is {mt!r}; correct whichever does not "
                              f"describe these weights", path=path, field="model_type")
        return arch
    mt = d.get("model_type")
    if mt is None:
        raise ConfigError("config has neither 'architectures' nor 'model_type'; cannot tell "
                          f"which model this is (supported: {supported})", path=path,
                          field="architectures")
    if not isinstance(mt, str) or mt not in _MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"model_type {mt!r} is not supported; ignis supports: {supported}",
            path=path, field="model_type")
    return _MODEL_TYPES[mt]


def _finite(v: Any) -> float | None:
    """v as a finite float, or None when it is not a number (bools are not) or does not fit one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:            # an integer past 1.8e308
        return None
    return f if math.isfinite(f) else None


def _rope(d: dict[str, Any], max_pos: int, head_dim: int, path: str | None
          ) -> tuple[float, RopeScaling | None]:
    """rope_theta and the rope scaling, from either spelling: transformers 5 writes
    `rope_parameters` ({rope_type, rope_theta, scaling parameters}), transformers 4 a top-level
    `rope_theta` and `rope_scaling`. transformers 5 reads rope_scaling when it is set, else
    rope_parameters, and takes rope_theta from that object before the top-level one. Every spelling
    present must agree; a rope type ignis does not run (ROPE_TYPES) is refused by name, and so is a
    parameter its type does not read."""
    thetas: list[tuple[str, Any]] = []
    scalings: list[tuple[str, RopeScaling | None]] = []
    if d.get("rope_theta") is not None:
        thetas.append(("rope_theta", d["rope_theta"]))
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ConfigError(f"config field {key!r} must be an object or null, got {rope!r}",
                              path=path, field=key)
        # transformers 5 may nest the object by layer type ({"full_attention": {...}, ...})
        nested = bool(rope) and set(rope) <= set(_LAYER_TYPES)
        for where, params in ([(f"{key}.{k}", v) for k, v in rope.items()] if nested else [(key, rope)]):
            if params is None:
                continue
            if not isinstance(params, dict):
                raise ConfigError(f"config field {where!r} must be an object, got {params!r}",
                                  path=path, field=key)
            scalings.append((where, _rope_scaling(d, params, where, key, max_pos, head_dim, path)))
            if "rope_theta" in params:
                thetas.append((f"{where}.rope_theta", params["rope_theta"]))
    for name, v in thetas:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"config field {name!r} must be a positive number, got {v!r}",
                              path=path, field=name.split(".")[0])
    if len({float(v) for _, v in thetas}) > 1:
        said = ", ".join(f"{n}={v!r}" for n, v in thetas)
        raise ConfigError(f"config.json gives rope_theta more than once with different values "
                          f"({said}); transformers versions disagree on which one wins: keep one",
                          path=path, field=thetas[-1][0].split(".")[0])
    if len({s for _, s in scalings}) > 1:
        said = ", ".join(f"{n} ({s.type if s else 'default'})" for n, s in scalings)
        raise ConfigError(f"config.json describes the rope scaling more than once, differently: "
                          f"{said}; keep one", path=path, field=scalings[-1][0].split(".")[0])
    return (float(thetas[0][1]) if thetas else 10000.0), (scalings[0][1] if scalings else None)


def _rope_by_layer_type(d: dict[str, Any], max_pos: int, head_dim: int, path: str | None
                        ) -> tuple[float, RopeScaling | None, float]:
    """Gemma 3's two ropes: (rope_theta and scaling of the full-attention layers, rope base of the
    sliding ones), as transformers 5 reads them: rope_parameters.{full,sliding}_attention, a
    transformers 4 rope_scaling updating the full-attention one, rope_theta and rope_local_base_freq
    filling the bases they do not give (defaults 1e6 and 1e4). The sliding layers run plain RoPE;
    a scaling there is refused."""
    params = d.get("rope_parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"config field 'rope_parameters' must be an object or null, got {params!r}",
                          path=path, field="rope_parameters")
    kinds = set(params) & set(_LAYER_TYPES)
    if params and not kinds:                                 # one flat object: the global layers'
        params = {"full_attention": params}
    elif set(params) - kinds:
        raise ConfigError(f"rope_parameters mixes layer types ({', '.join(sorted(kinds))}) with "
                          f"other keys ({', '.join(sorted(set(params) - kinds))}); per-layer-type "
                          f"rope_parameters take only {', '.join(_LAYER_TYPES)}", path=path,
                          field="rope_parameters")
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    scaling = d.get("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise ConfigError(f"config field 'rope_scaling' must be an object or null, got "
                              f"{scaling!r}", path=path, field="rope_scaling")
        full.update(scaling)
    for key, p, where in (("rope_theta", full, "full_attention"),
                          ("rope_local_base_freq", local, "sliding_attention")):
        if d.get(key) is None:
            continue
        if p.get("rope_theta") is not None and _finite(p["rope_theta"]) != _finite(d[key]):
            raise ConfigError(
                f"config.json gives the {where} layers' rope base twice with different values "
                f"({key}={d[key]!r}, rope_parameters.{where}.rope_theta={p['rope_theta']!r}); "
                f"transformers versions disagree on which one wins: keep one", path=path, field=key)
        p.setdefault("rope_theta", d[key])
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_theta", 10_000.0)
    thetas = []
    for where, p in (("rope_parameters.full_attention", full),
                     ("rope_parameters.sliding_attention", local)):
        v = _finite(p["rope_theta"])
        if v is None or v <= 0:
            raise ConfigError(f"{where}.rope_theta must be a positive number, got "
                              f"{p['rope_theta']!r}", path=path, field="rope_parameters")
        thetas.append(v)
    full_scaling = _rope_scaling(d, full, "rope_parameters.full_attention", "rope_parameters",
                                 max_pos, head_dim, path)
    if _rope_scaling(d, local, "rope_parameters.sliding_attention", "rope_parameters", max_pos,
                     head_dim, path) is not None:
        raise ConfigError(f"rope_parameters.sliding_attention asks for rope_type "
                          f"{local.get('rope_type', local.get('type'))!r}: a rope scaling on the "
                          f"sliding-window layers is not implemented (only on the global ones)",
                          path=path, field="rope_parameters")
    return thetas[0], full_scaling, thetas[1]


def _rope_scaling(d: dict[str, Any], params: dict[str, Any], where: str, key: str, max_pos: int,
                  head_dim: int, path: str | None) -> RopeScaling | None:
    """One rope_parameters / rope_scaling object as a RopeScaling (None: plain RoPE)."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "type" in params and "rope_type" in params and params["type"] != params["rope_type"]:
        raise ConfigError(f"{where} gives two rope types, type {params['type']!r} and "
                          f"rope_type {params['rope_type']!r}; keep one", path=path, field=key)
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise ConfigError(f"{where} asks for rope_type {rope_type!r}, which ignis does not implement "
                          f"(it runs {', '.join(repr(t) for t in ROPE_TYPES)}); running without it "
                          f"would compute different logits than the model was trained for",
                          path=path, field=key)
    wanted = ROPE_TYPES[rope_type]
    extra = sorted(str(k) for k in params if k not in _ROPE_COMMON_KEYS and k not in wanted)
    if extra:
        raise ConfigError(f"{where} has {', '.join(map(repr, extra))}, which rope_type "
                          f"{rope_type!r} does not use; the file is inconsistent: remove the "
                          f"key or fix the rope_type", path=path, field=key)
    prf = params.get("partial_rotary_factor")
    if not _neutral(prf, (None, 1.0)):
        raise ConfigError(f"{where} has partial_rotary_factor {prf!r}: rotary embedding on "
                          f"only part of each head is not implemented", path=path, field=key)

    def number(name: str, lo: float = 0.0) -> float:
        if name not in params:
            raise ConfigError(f"{where} of rope_type {rope_type!r} needs {name!r}, which is missing",
                              path=path, field=key)
        v = _finite(params[name])
        if v is None or v <= lo:
            raise ConfigError(f"{where}.{name} must be a number above {lo:g}, got {params[name]!r}",
                              path=path, field=key)
        return v

    if rope_type == "default":
        return None
    if rope_type == "linear":
        return RopeScaling("linear", factor=number("factor"))
    if rope_type == "freq_factors":
        ff = params.get("freq_factors")
        vals = [_finite(v) for v in ff] if isinstance(ff, list) else None
        if vals is None or len(vals) != head_dim // 2 or any(v is None or v <= 0 for v in vals):
            raise ConfigError(f"{where}.freq_factors must be a list of {head_dim // 2} positive "
                              f"numbers (one per rotary frequency of a {head_dim}-wide head)",
                              path=path, field=key)
        return RopeScaling("freq_factors", freq_factors=tuple(vals))
    # llama3. transformers 5 takes original_max_position_embeddings from the top level of
    # config.json before the rope object, and max_position_embeddings when neither has it.
    orig = params.get("original_max_position_embeddings")
    top = d.get("original_max_position_embeddings")
    if top is not None and orig is not None and top != orig:
        raise ConfigError(f"config.json gives original_max_position_embeddings twice, {top!r} and "
                          f"{where}.original_max_position_embeddings {orig!r}; transformers uses the "
                          f"first: keep one", path=path, field="original_max_position_embeddings")
    orig = top if top is not None else orig if orig is not None else max_pos
    if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
        raise ConfigError(f"original_max_position_embeddings must be a positive integer, got "
                          f"{orig!r}", path=path, field=key)
    low, high = number("low_freq_factor"), number("high_freq_factor")
    if high <= low:
        raise ConfigError(f"{where}: high_freq_factor ({high:g}) must be above low_freq_factor "
                          f"({low:g}); llama3 scaling interpolates between them", path=path, field=key)
    return RopeScaling("llama3", factor=number("factor"), low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=orig)


def _check_full_attention(d: dict[str, Any], arch: str, n_layers: int, max_pos: int,
                          path: str | None) -> None:
    """Check the attention keys every family spells alike, then let the family refuse a sliding
    window it does not run (Qwen2, Llama: one shorter than max_position_embeddings, ignis's longest
    n_ctx) by its own reading of them; Gemma 3 runs its windows (models/gemma3.py)."""
    layer_types = d.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise ConfigError(f"config field 'layer_types' must be a list of names, got "
                              f"{layer_types!r}", path=path, field="layer_types")
        odd = sorted({t for t in layer_types if t not in _LAYER_TYPES})
        if odd:
            raise ConfigError(f"layer_types has {', '.join(map(repr, odd))}; ignis implements full "
                              f"attention and sliding-window attention layers only "
                              f"({', '.join(_LAYER_TYPES)})", path=path, field="layer_types")
    window = d.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"config field 'sliding_window' must be a positive integer or null, got "
                          f"{window!r}", path=path, field="sliding_window")
    FAMILIES[arch].check_attention(d, n_layers, max_pos, path)


def _neutral(v: Any, neutral: tuple[Any, ...]) -> bool:
    """v is one of the values that leave the arithmetic as ignis computes it (True is not 1)."""
    for n in neutral:
        if v is n or (isinstance(n, dict) and isinstance(v, dict) and v == n):
            return True
        if (isinstance(n, (int, float)) and not isinstance(n, bool) and isinstance(v, (int, float))
                and not isinstance(v, bool) and v == n):
            return True
    return False


def _check_refused_keys(d: dict[str, Any], path: str | None, read: frozenset[str] = frozenset()
                        ) -> None:
    """Refuse the keys of CONFIG_KEYS_REFUSED with a value that changes the arithmetic, except
    those the family reads (`read`: Gemma 3's query_pre_attn_scalar)."""
    for key, (neutral, what) in CONFIG_KEYS_REFUSED.items():
        if key in d and key not in read and not _neutral(d[key], neutral):
            raise ConfigError(f"{key} {d[key]!r} asks for {what}, which ignis does not implement; "
                              f"running without it would compute different logits than the model's",
                              path=path, field=key)


def _warn_unknown_keys(d: dict[str, Any], arch: str, path: str | None) -> None:
    known = (CONFIG_KEYS_IMPLEMENTED | CONFIG_KEYS_HARMLESS | CONFIG_KEYS_REFUSED.keys()
             | FAMILIES[arch].config_keys)
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        warnings.warn(f"config.json{f' ({path})' if path else ''} has keys ignis does not know: "
                      f"{', '.join(map(repr, unknown[:8]))}{' ...' if len(unknown) > 8 else ''}; "
                      f"like transformers' {arch} it does not read them. If one changes the "
                      f"model's arithmetic, its output will differ from the model's",
                      UnknownConfigKeyWarning, stacklevel=4)


def _opt_token_id(d: dict[str, Any], name: str, path: str | None) -> int | None:
    v = d.get(name)
    if v is None:
        return None
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"config field {name!r} must be a token id, got {v!r}", path=path, field=name)
    return v


def _token_ids(v: Any, name: str, path: str | None) -> tuple[int, ...]:
    if v is None:
        return ()
    items = v if isinstance(v, list) else [v]
    out = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ConfigError(f"config field {name!r} must be a token id or a list of them, got {v!r}",
                              path=path, field=name)
        if x not in out:
            out.append(x)
    return tuple(out)
