"""Builders for tiny random Hugging Face-layout model directories (Qwen2 and Llama) used as test
fixtures, so the real loading code runs without a real model. Written with ignis's own writer.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ignis.formats.bf16 import f32_to_bf16
from ignis.loader.safetensors import INDEX_FILE, SINGLE_FILE, SafetensorsWriter

# Sizes shared by both families (DESIGN.md: 2 layers, GQA, dim 64).
N_LAYERS = 2
DIM = 64
HIDDEN_DIM = 160
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 16
# 256 byte-level tokens + special tokens. The tokenizer fixture must use these ids.
ENDOFTEXT_ID = 256          # <|endoftext|> (Qwen2 bos/pad, Llama bos)
IM_START_ID = 257           # <|im_start|>
IM_END_ID = 258             # <|im_end|>  (eos of the chat models)
VOCAB_SIZE = 272            # padded past the last special token, as real checkpoints do

ARCHS = ("qwen2", "llama")
DTYPES = ("F32", "F16", "BF16")


def tiny_config(arch: str = "qwen2") -> dict:
    """The config.json a tiny model of this family carries (field set as in the real ones)."""
    if arch == "qwen2":
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "hidden_act": "silu",
            "hidden_size": DIM,
            "initializer_range": 0.02,
            "intermediate_size": HIDDEN_DIM,
            "max_position_embeddings": 512,
            "max_window_layers": N_LAYERS,
            "model_type": "qwen2",
            "num_attention_heads": N_HEADS,
            "num_hidden_layers": N_LAYERS,
            "num_key_value_heads": N_KV_HEADS,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": 512,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "transformers_version": "4.43.1",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB_SIZE,
        }
    if arch == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": DIM,
            "initializer_range": 0.02,
            "intermediate_size": HIDDEN_DIM,
            "max_position_embeddings": 512,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": N_HEADS,
            "num_hidden_layers": N_LAYERS,
            "num_key_value_heads": N_KV_HEADS,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 100000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.42.3",
            "use_cache": True,
            "vocab_size": VOCAB_SIZE,
        }
    raise ValueError(f"unknown tiny model arch {arch!r}; choose one of {ARCHS}")


def tiny_generation_config(arch: str = "qwen2") -> dict:
    if arch == "qwen2":     # shaped like Qwen2.5-Instruct's: two eos ids, sampling defaults
        return {"bos_token_id": ENDOFTEXT_ID, "pad_token_id": ENDOFTEXT_ID,
                "do_sample": True, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                "transformers_version": "4.43.1"}
    return {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": IM_END_ID,
            "transformers_version": "4.42.3"}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape ([out_features, in_features] for linear weights), in HF order."""
    dim, hid = config["hidden_size"], config["intermediate_size"]
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or dim // n_heads
    bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], dim)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (dim,)
        shapes[p + "self_attn.q_proj.weight"] = (n_heads * head_dim, dim)
        shapes[p + "self_attn.k_proj.weight"] = (n_kv * head_dim, dim)
        shapes[p + "self_attn.v_proj.weight"] = (n_kv * head_dim, dim)
        if bias:
            shapes[p + "self_attn.q_proj.bias"] = (n_heads * head_dim,)
            shapes[p + "self_attn.k_proj.bias"] = (n_kv * head_dim,)
            shapes[p + "self_attn.v_proj.bias"] = (n_kv * head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (dim, n_heads * head_dim)
        shapes[p + "post_attention_layernorm.weight"] = (dim,)
        shapes[p + "mlp.gate_proj.weight"] = (hid, dim)
        shapes[p + "mlp.up_proj.weight"] = (hid, dim)
        shapes[p + "mlp.down_proj.weight"] = (dim, hid)
    shapes["model.norm.weight"] = (dim,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (config["vocab_size"], dim)
    return shapes


def _random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    # Scales chosen so activations stay O(1) through the layers and logits are well separated
    # (greedy decoding on the tiny model should not hinge on near-ties).
    if name.endswith("norm.weight"):
        a = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name.endswith(".bias"):
        a = 0.1 * rng.standard_normal(shape)
    elif name == "model.embed_tokens.weight":
        a = 0.5 * rng.standard_normal(shape)
    else:                               # linear weight [out, in]
        a = rng.standard_normal(shape) / np.sqrt(shape[1])
    return a.astype(np.float32)


def _encode(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return a
    if dtype == "F16":
        return a.astype(np.float16)
    return f32_to_bf16(a)


def write_tiny_model(directory: str | Path, arch: str = "qwen2", seed: int = 0,
                     sharded: bool = False, dtype: str = "F32") -> Path:
    """Write config.json, generation_config.json and the weights into `directory` (created if
    needed); return it. sharded=True splits the weights over two shards plus an index."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config = tiny_config(arch)
    config["torch_dtype"] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(tiny_generation_config(arch), indent=2)
                                                + "\n")

    shapes = tensor_shapes(config)
    rng = np.random.default_rng(seed)
    # Values depend only on (seed, name order), never on sharding: sharded and single-file
    # checkpoints of one seed hold identical tensors.
    tensors = {n: _encode(_random_tensor(rng, n, s), dtype) for n, s in shapes.items()}
    names = list(shapes)
    if not sharded:
        groups = {SINGLE_FILE: names}
    else:
        half = len(names) // 2
        groups = {"model-00001-of-00002.safetensors": names[:half],
                  "model-00002-of-00002.safetensors": names[half:]}
    for fname, group in groups.items():
        specs = [(n, dtype, shapes[n]) for n in group]
        with SafetensorsWriter(out / fname, specs, {"format": "pt"}) as w:
            for n in group:
                w.write(n, tensors[n])
    if sharded:
        index = {"metadata": {"total_size": sum(int(t.nbytes) for t in tensors.values())},
                 "weight_map": {n: f for f, g in groups.items() for n in g}}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out


TOKENIZER_DATA = Path(__file__).parent / "data" / "tokenizer"


def complete_tiny_model(src: Path, dst: Path) -> Path:
    """A tiny random model directory plus the matching tiny tokenizer (ids 256 <|endoftext|>,
    257 <|im_start|>, 258 <|im_end|>): a directory ignis.load can run."""
    shutil.copytree(src, dst)
    shutil.copy(TOKENIZER_DATA / "tiny-tokenizer.json", dst / "tokenizer.json")
    shutil.copy(TOKENIZER_DATA / "tiny-tokenizer_config.json", dst / "tokenizer_config.json")
    return dst
