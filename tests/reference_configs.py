"""Reference configs whose figures DESIGN.md quotes; compiling needs only the config, no weights."""
from __future__ import annotations

from ignis.loader.config import ModelConfig


def qwen25_05b() -> ModelConfig:
    """Qwen2.5(-Coder)-0.5B as the default GGUF carries it (separate lm_head, not tied)."""
    return ModelConfig(arch="qwen2", dim=896, hidden_dim=4864, n_layers=24, n_heads=14, n_kv_heads=2,
                       head_dim=64, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, max_position_embeddings=32768, attention_bias=True)
