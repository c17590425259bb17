"""config.json and generation_config.json -> frozen ModelConfig / GenerationConfig.

Hugging Face field names appear only in this file; the rest of ignis speaks one size vocabulary:
dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UnsupportedArchitectureError

# HF `architectures[0]` / `model_type` -> ignis family. Both families share one graph builder;
# they differ in whether q/k/v carry a bias.
SUPPORTED_ARCHITECTURES = {
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}
_MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str                       # "qwen2" | "llama"
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
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None

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

        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ConfigError(f"hidden_act {act!r} is not supported (only 'silu')",
                              path=path, field="hidden_act")
        rope_scaling = d.get("rope_scaling")
        if rope_scaling not in (None, {}) and not (
                isinstance(rope_scaling, dict)
                and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default"):
            raise ConfigError(f"rope_scaling {rope_scaling!r} is not supported yet",
                              path=path, field="rope_scaling")
        if d.get("use_sliding_window"):
            raise ConfigError("sliding-window attention (use_sliding_window: true) is not supported",
                              path=path, field="use_sliding_window")

        if arch == "qwen2":
            attention_bias = True       # Qwen2 always has q/k/v biases; the field is not written
        else:
            attention_bias = opt_bool("attention_bias", False)
        if arch == "llama" and d.get("mlp_bias"):
            raise ConfigError("mlp_bias: true is not supported", path=path, field="mlp_bias")

        return cls(
            arch=arch, dim=dim, hidden_dim=hidden_dim, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
            rope_theta=opt_float("rope_theta", 10000.0),
            rms_norm_eps=opt_float("rms_norm_eps", 1e-6),
            tie_word_embeddings=opt_bool("tie_word_embeddings", False),
            max_position_embeddings=max_pos,
            attention_bias=attention_bias,
            bos_token_id=_opt_token_id(d, "bos_token_id", path),
            eos_token_ids=_token_ids(d.get("eos_token_id"), "eos_token_id", path),
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(read_json(path), path=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json a Hugging Face model of this family would carry."""
        hf_arch = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.arch]
        d: dict[str, Any] = {
            "architectures": [hf_arch],
            "model_type": self.arch,
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.torch_dtype or "float32",
        }
        if self.arch == "llama":
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        else:
            d["use_sliding_window"] = False
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

        def num(name: str, default: float, lo: float, hi: float = math.inf) -> float:
            v = d.get(name, default)
            if v is None:
                return default
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
                raise ConfigError(f"generation config field {name!r} must be a number in "
                                  f"[{lo}, {hi}], got {v!r}", path=path, field=name)
            return float(v)

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
            repetition_penalty=num("repetition_penalty", 1.0, 0.0),
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


def expected_tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for every tensor a model of this config must have."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.dim),
        "model.norm.weight": (c.dim,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.dim)
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (c.q_dim, c.dim),
            p + "self_attn.k_proj.weight": (c.kv_dim, c.dim),
            p + "self_attn.v_proj.weight": (c.kv_dim, c.dim),
            p + "self_attn.o_proj.weight": (c.dim, c.q_dim),
            p + "input_layernorm.weight": (c.dim,),
            p + "post_attention_layernorm.weight": (c.dim,),
            p + "mlp.gate_proj.weight": (c.hidden_dim, c.dim),
            p + "mlp.up_proj.weight": (c.hidden_dim, c.dim),
            p + "mlp.down_proj.weight": (c.dim, c.hidden_dim),
        })
        if c.attention_bias:
            shapes.update({
                p + "self_attn.q_proj.bias": (c.q_dim,),
                p + "self_attn.k_proj.bias": (c.kv_dim,),
                p + "self_attn.v_proj.bias": (c.kv_dim,),
            })
    return shapes


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
        for a in archs:
            if a in SUPPORTED_ARCHITECTURES:
                return SUPPORTED_ARCHITECTURES[a]
        raise UnsupportedArchitectureError(
            f"architecture {archs[0]!r} is not supported; ignis supports: {supported}",
            path=path, field="architectures")
    mt = d.get("model_type")
    if mt is None:
        raise ConfigError("config has neither 'architectures' nor 'model_type'; cannot tell "
                          f"which model this is (supported: {supported})", path=path,
                          field="architectures")
    if mt not in _MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"model_type {mt!r} is not supported; ignis supports: {supported}",
            path=path, field="model_type")
    return _MODEL_TYPES[mt]


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
