"""Rotary embedding frequencies as data: the inverse frequency of each rotary pair, computed here
from the config, so a rope variant is a table the kernels read, never new kernel code.

Plain RoPE rotates pair j of a head by pos * theta^(-2j/d). `inv_freq` rounds that table as the
C kernels compute it themselves (f32 exponent 2j/d, the power in double rounded to f32, then the f32
reciprocal: bitwise what the rope kernels derive from theta). transformers' torch power differs from
it by at most 2 ulp on some entries. Scaled variants then follow transformers' f32 arithmetic step
by step (modeling_rope_utils.py), or llama.cpp's per-frequency divisors for an imported GGUF.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # a type only: the loader reads families, so a family never imports the loader
    from ..loader.config import ModelConfig, RopeScaling

f32 = np.float32


def plain_inv_freq(theta: float, head_dim: int) -> np.ndarray:
    """theta^(-2j/d) for j < d/2, f32, rounded as the rope kernels round it (see the module doc)."""
    e = np.arange(0, head_dim, 2).astype(f32) / f32(head_dim)
    return f32(1.0) / (np.float64(f32(theta)) ** e.astype(np.float64)).astype(f32)


def scaled_inv_freq(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """`inv_freq` (f32) under the scaling `s`, each operation in f32 as transformers does it."""
    inv = np.asarray(inv_freq, f32)
    if s.type == "linear":          # _compute_linear_scaling_rope_parameters: inv_freq /= factor
        return inv / f32(s.factor)
    if s.type == "freq_factors":    # llama.cpp: the angle of pair j divided by freq_factors[j]
        return inv / np.asarray(s.freq_factors, f32)
    if s.type == "llama3":          # _compute_llama3_parameters, op by op (torch's a / t is
        factor, low, high = f32(s.factor), s.low_freq_factor, s.high_freq_factor   # t.reciprocal() * a)
        old = s.original_max_position_embeddings
        low_wavelen, high_wavelen = f32(old / low), f32(old / high)
        wavelen = (f32(1.0) / inv) * f32(2 * math.pi)
        llama = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = ((f32(1.0) / wavelen) * f32(old) - f32(low)) / f32(high - low)
        smoothed = (f32(1.0) - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, llama).astype(f32)
    raise ValueError(f"rope scaling {s.type!r} has no inverse-frequency rule here")


def inv_freq(config: ModelConfig) -> np.ndarray:
    """The f32 table of config.head_dim // 2 inverse frequencies the model's rope reads."""
    base = plain_inv_freq(config.rope_theta, config.head_dim)
    return base if config.rope_scaling is None else scaled_inv_freq(base, config.rope_scaling)
