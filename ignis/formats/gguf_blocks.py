"""A GGUF file's own quantized blocks, laid out for the x16 kernels (csrc/ignis.h, "a GGUF file's
own blocks, read with 16-bit activations").

weight_format="gguf" multiplies with the exact values the file stores: every matmul weight keeps its
GGUF integers and scales (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; IQ4_NL's table
values as Q8_0 integers), regrouped for the kernels but never re-rounded; activations are quantized to 16 bits per block of 32. A weight of
any other type (F32, F16) stays on the f32 path, which is exact too.

    layout = gguf_weight_layout(raw_rows, qtype_name, shape, unpermute_heads)
    # layout.fmt (IG_WX_*), layout.packed (uint8: the kernel's bytes)

The decoders here (integers and scales of each block type) are written from the format and checked
against the gguf package's dequantizers in tests/test_gguf_blocks.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RuntimeInputError
from .quant import PACK_ROWS, QK, Q8_BLOCK, _scale_bytes, pack_q8

# csrc/ignis.h IG_WX_*; WX_Q5_0 holds Q4_0 blocks too (u = k + 16)
WX_Q8, WX_Q5_0, WX_Q6K, WX_Q4K, WX_Q4_1, WX_Q5_1, WX_Q5K, WX_Q3K, WX_Q2K = 0, 1, 2, 3, 4, 5, 6, 7, 8
K_LAYOUTS = (WX_Q6K, WX_Q4K, WX_Q5K, WX_Q3K, WX_Q2K)     # rows are whole super-blocks of 256
QK_K = 256                               # K-quant super-block


@dataclass(frozen=True)
class Layout:
    fmt: int                     # WX_*
    packed: np.ndarray           # uint8, the kernel's bytes


# ---- sizes (the IG_*_GROUP_BYTES macros) ---------------------------------------------------------

def _groups(n: int) -> int:
    return -(-n // PACK_ROWS)


def _mask_bytes(nb: int) -> int:
    return (nb * 16 + 63) // 64 * 64


def _super_bytes(nb: int, per_row: int = 4) -> int:
    """the f32 super-block region: per super-block per_row floats for each of the 4 rows"""
    return ((nb + 7) // 8 * 4 * per_row + 63) // 64 * 64


def packed_x16_bytes(fmt: int, n: int, k: int) -> int:
    """Bytes of an [n, k] matrix in layout fmt."""
    nb = k // QK
    if fmt == WX_Q8:
        group = _scale_bytes(nb) + nb * PACK_ROWS * QK
    elif fmt == WX_Q5_0:
        group = _scale_bytes(nb) + _mask_bytes(nb) + nb * PACK_ROWS * 16
    elif fmt == WX_Q6K:
        group = _super_bytes(nb) + _scale_bytes(nb) + _mask_bytes(2 * nb) + nb * PACK_ROWS * 16
    elif fmt in (WX_Q4K, WX_Q5K):
        group = _super_bytes(nb, 8) + _scale_bytes(nb) + nb * PACK_ROWS * 16 + \
            (_mask_bytes(nb) if fmt == WX_Q5K else 0)
    elif fmt == WX_Q3K:
        group = _super_bytes(nb) + _scale_bytes(nb) + _mask_bytes(nb) + nb * PACK_ROWS * 8
    elif fmt == WX_Q2K:
        group = _super_bytes(nb, 8) + _scale_bytes(nb) + nb * PACK_ROWS * 8
    elif fmt in (WX_Q4_1, WX_Q5_1):
        group = 2 * _scale_bytes(nb) + nb * PACK_ROWS * 16 + (_mask_bytes(nb) if fmt == WX_Q5_1 else 0)
    else:
        raise RuntimeInputError(f"unknown x16 layout {fmt!r}")
    return _groups(n) * group


# ---- packers: integers and scales -> bytes -------------------------------------------------------

def _pad_rows(a: np.ndarray, n: int) -> np.ndarray:
    rows = _groups(n) * PACK_ROWS
    if a.shape[0] == rows:
        return a
    out = np.zeros((rows,) + a.shape[1:], a.dtype)
    out[:n] = a
    return out


def _by_group(a: np.ndarray) -> np.ndarray:
    """[rows, nb, ...] -> [groups, nb, 4, ...] (block-major inside a group), flattened per group."""
    g = a.reshape(-1, PACK_ROWS, *a.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(g).reshape(g.shape[0], -1)


def pack_x16_q5(d_bits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Q5_0-style blocks: d_bits uint16 [N, nb] (IEEE half scales), u [N, nb, 32] in 0..31 (the
    weight is d * (u - 16)) -> the IG_WX_Q5_0 layout."""
    n, nb = d_bits.shape
    u = _pad_rows(np.asarray(u, np.uint8), n)
    if u.size and u.max() > 31:
        raise RuntimeInputError("Q5 blocks hold integers 0..31")
    scales = _by_group(_pad_rows(d_bits.astype("<u2"), n)).view(np.uint8)
    nib = (u[..., :16] & 15) | ((u[..., 16:] & 15) << 4)                  # [rows, nb, 16]
    sb, mb = _scale_bytes(nb), _mask_bytes(nb)
    out = np.zeros((_groups(n), sb + mb + nb * PACK_ROWS * 16), np.uint8)
    out[:, :nb * 8] = scales
    out[:, sb:sb + nb * 16] = _q5_masks(u)
    out[:, sb + mb:] = _by_group(nib)
    return out.reshape(-1)


def pack_x16_q51(d_bits: np.ndarray, m_bits: np.ndarray, u: np.ndarray, *, five: bool) -> np.ndarray:
    """Q4_1 / Q5_1 blocks: d_bits, m_bits uint16 [N, nb] (IEEE half scales and offsets), u [N, nb,
    32] in 0..15 (five=False) or 0..31 (the weight is d * u + m) -> the IG_WX_Q4_1 / IG_WX_Q5_1
    layout."""
    n, nb = d_bits.shape
    u = _pad_rows(np.asarray(u, np.uint8), n)
    if u.size and u.max() > (31 if five else 15):
        raise RuntimeInputError(f"Q{5 if five else 4}_1 blocks hold integers 0..{31 if five else 15}")
    sb, mb = _scale_bytes(nb), _mask_bytes(nb) if five else 0
    out = np.zeros((_groups(n), 2 * sb + mb + nb * PACK_ROWS * 16), np.uint8)
    out[:, :nb * 8] = _by_group(_pad_rows(d_bits.astype("<u2"), n)).view(np.uint8)
    out[:, sb:sb + nb * 8] = _by_group(_pad_rows(m_bits.astype("<u2"), n)).view(np.uint8)
    if five:
        out[:, 2 * sb:2 * sb + nb * 16] = _q5_masks(u)
    out[:, 2 * sb + mb:] = _by_group((u[..., :16] & 15) | ((u[..., 16:] & 15) << 4))
    return out.reshape(-1)


def _q5_masks(u: np.ndarray) -> np.ndarray:
    """[rows, nb, 32] 5-bit integers -> the fifth bits as two 64-bit masks per block, [groups,
    nb * 16] bytes (bit 16r+i of the first: row r's u[i] >> 4; of the second: u[16+i] >> 4)."""
    return np.stack([_bit_masks(u[..., :16] >> 4), _bit_masks(u[..., 16:] >> 4)], axis=-1) \
        .astype("<u8").view(np.uint8).reshape(u.shape[0] // PACK_ROWS, -1)


def _bit_masks(bits: np.ndarray) -> np.ndarray:
    """[rows, nb, 16] 0/1 values per row and byte position -> [groups, nb] uint64 masks with bit
    16r+i set from row r of the group, position i."""
    nb = bits.shape[1]
    g = np.asarray(bits, np.uint8).reshape(-1, PACK_ROWS, nb, 16).transpose(0, 2, 1, 3)
    packed = np.packbits(g.reshape(g.shape[0], nb, 64), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8")[..., 0]


def _mask_bits(raw: np.ndarray, per_block: int) -> np.ndarray:
    """The inverse of _bit_masks: a region of `per_block` masks per block ([groups, nb * 8 *
    per_block] bytes) -> [groups, nb, per_block, 4, 16] 0/1 values (row r, position i)."""
    bits = np.unpackbits(np.ascontiguousarray(raw), axis=-1, bitorder="little")
    return bits.reshape(raw.shape[0], -1, per_block, PACK_ROWS, 16).astype(np.int32)


# Q6_K nibble order: byte i of a row-block holds value LOW6[i] (low nibble) and LOW6[i] + 8 (high)
LOW6 = np.r_[0:8, 16:24]


def pack_x16_q6k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q6_K blocks: d float32 [N, nb/8] super-block scales, sc int8 [N, nb, 2] sub-block scales
    (one per 16 weights), q [N, nb, 32] in -32..31 (the weight is d * sc * q) -> the IG_WX_Q6K
    layout."""
    n, nb = sc.shape[:2]
    if nb % 8:
        raise RuntimeInputError(f"K-quant rows are whole super-blocks of {QK_K}; got {nb * QK} columns")
    q = np.asarray(q)
    if q.size and (q.min() < -32 or q.max() > 31):
        raise RuntimeInputError("Q6_K integers are -32..31")
    u = _pad_rows((q.astype(np.int16) + 32).astype(np.uint8), n)
    low, high = u[..., LOW6], u[..., LOW6 + 8]                             # [rows, nb, 16] each
    masks = np.stack([_bit_masks((low >> 4) & 1), _bit_masks(low >> 5),
                      _bit_masks((high >> 4) & 1), _bit_masks(high >> 5)], axis=-1)
    db, sb, mb = _super_bytes(nb), _scale_bytes(nb), _mask_bytes(2 * nb)
    out = np.zeros((_groups(n), db + sb + mb + nb * PACK_ROWS * 16), np.uint8)
    out[:, :nb // 8 * 16] = _by_group(_pad_rows(np.asarray(d, "<f4"), n)).view(np.uint8)
    out[:, db:db + nb * 8] = _by_group(_pad_rows(np.asarray(sc, np.int8), n)).view(np.uint8)
    out[:, db + sb:db + sb + nb * 32] = masks.astype("<u8").view(np.uint8).reshape(_groups(n), -1)
    out[:, db + sb + mb:] = _by_group((low & 15) | ((high & 15) << 4))
    return out.reshape(-1)


def pack_x16_q3k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q3_K blocks: d float32 [N, nb/8] super-block scales, sc int8 [N, nb, 2] sub-block scales
    (one per 16 weights), q [N, nb, 32] in -4..3 (the weight is d * sc * q) -> the IG_WX_Q3K
    layout."""
    n, nb = sc.shape[:2]
    if nb % 8:
        raise RuntimeInputError(f"K-quant rows are whole super-blocks of {QK_K}; got {nb * QK} columns")
    q = np.asarray(q)
    if q.size and (q.min() < -4 or q.max() > 3):
        raise RuntimeInputError("Q3_K integers are -4..3")
    u = _pad_rows((q.astype(np.int16) + 4).astype(np.uint8), n)
    low, high = u[..., LOW6], u[..., LOW6 + 8]                             # [rows, nb, 16] each
    masks = np.stack([_bit_masks(low >> 2), _bit_masks(high >> 2)], axis=-1)
    db, sb, mb = _super_bytes(nb), _scale_bytes(nb), _mask_bytes(nb)
    out = np.zeros((_groups(n), db + sb + mb + nb * PACK_ROWS * 8), np.uint8)
    out[:, :nb // 8 * 16] = _by_group(_pad_rows(np.asarray(d, "<f4"), n)).view(np.uint8)
    out[:, db:db + nb * 8] = _by_group(_pad_rows(np.asarray(sc, np.int8), n)).view(np.uint8)
    out[:, db + sb:db + sb + nb * 16] = masks.astype("<u8").view(np.uint8).reshape(_groups(n), -1)
    out[:, db + sb + mb:] = _crumb_pairs(low, high)
    return out.reshape(-1)


def _crumb_pairs(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[rows, nb, 16] values in Q6_K's order (their low two bits) -> [groups, nb * 32] bytes: per
    pair of blocks and row 16 bytes, the first block in bits 0-3 (low, high), the second in 4-7."""
    crumb = (low & 3) | ((high & 3) << 2)
    return _by_group(crumb[:, 0::2] | (crumb[:, 1::2] << 4))


def pack_x16_q2k(d: np.ndarray, dmin: np.ndarray, scm: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q2_K blocks: d, dmin float32 [N, nb/8] super-block scales, scm uint8 [N, nb, 2] the file's
    sc | m << 4 per 16 weights, q [N, nb, 32] in 0..3 (the weight is d * sc * q - dmin * m) -> the
    IG_WX_Q2K layout."""
    n, nb = scm.shape[:2]
    if nb % 8:
        raise RuntimeInputError(f"K-quant rows are whole super-blocks of {QK_K}; got {nb * QK} columns")
    q = np.asarray(q)
    if q.size and (q.min() < 0 or q.max() > 3):
        raise RuntimeInputError("Q2_K integers are 0..3")
    u = _pad_rows(q.astype(np.uint8), n)
    db, sb = _super_bytes(nb, 8), _scale_bytes(nb)
    dd = np.stack([_pad_rows(np.asarray(d, "<f4"), n), _pad_rows(np.asarray(dmin, "<f4"), n)], axis=-1)
    sup = dd.reshape(-1, PACK_ROWS, nb // 8, 2).transpose(0, 2, 3, 1)         # [g, ns, 2, 4]
    out = np.zeros((_groups(n), db + sb + nb * PACK_ROWS * 8), np.uint8)
    out[:, :nb // 8 * 32] = np.ascontiguousarray(sup).reshape(_groups(n), -1).view(np.uint8)
    out[:, db:db + nb * 8] = _by_group(_pad_rows(np.asarray(scm, np.uint8), n))
    out[:, db + sb:] = _crumb_pairs(u[..., LOW6], u[..., LOW6 + 8])
    return out.reshape(-1)


def pack_x16_q4k(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray,
                 q: np.ndarray, *, five: bool = False) -> np.ndarray:
    """Q4_K blocks: d, dmin float32 [N, nb/8] super-block scales, sc, m [N, nb] sub-block scale and
    offset multipliers (0..127), q [N, nb, 32] in 0..15 (the weight is d * sc * q - dmin * m) ->
    the IG_WX_Q4K layout; five=True: Q5_K blocks (q in 0..31) -> the IG_WX_Q5K layout."""
    n, nb = sc.shape
    if nb % 8:
        raise RuntimeInputError(f"K-quant rows are whole super-blocks of {QK_K}; got {nb * QK} columns")
    q = np.asarray(q)
    top = 31 if five else 15
    if q.size and (q.min() < 0 or q.max() > top):
        raise RuntimeInputError(f"Q{5 if five else 4}_K integers are 0..{top}")
    db = _super_bytes(nb, 8)
    dd = np.stack([_pad_rows(np.asarray(d, "<f4"), n), _pad_rows(np.asarray(dmin, "<f4"), n)], axis=-1)
    sup = dd.reshape(-1, PACK_ROWS, nb // 8, 2).transpose(0, 2, 3, 1)         # [g, ns, 2, 4]
    sm = np.stack([_pad_rows(np.asarray(sc, np.int8), n), _pad_rows(np.asarray(m, np.int8), n)], -1)
    scl = sm.reshape(-1, PACK_ROWS, nb, 2).transpose(0, 2, 3, 1)               # [g, nb, 2, 4]
    u = _pad_rows(q.astype(np.uint8), n)
    sb, mb = _scale_bytes(nb), _mask_bytes(nb) if five else 0
    out = np.zeros((_groups(n), db + sb + mb + nb * PACK_ROWS * 16), np.uint8)
    out[:, :nb // 8 * 32] = np.ascontiguousarray(sup).reshape(_groups(n), -1).view(np.uint8)
    out[:, db:db + nb * 8] = np.ascontiguousarray(scl).reshape(_groups(n), -1).view(np.uint8)
    if five:
        out[:, db + sb:db + sb + nb * 16] = _q5_masks(u)
    out[:, db + sb + mb:] = _by_group((u[..., :16] & 15) | ((u[..., 16:] & 15) << 4))
    return out.reshape(-1)


# ---- decoders: raw GGUF rows -> integers and scales ----------------------------------------------

def _half(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)[..., 0]


def _blocks(raw: np.ndarray, n: int, size: int) -> np.ndarray:
    """[N, row bytes] -> [N, blocks per row, size] (the file's rows as blocks)."""
    raw = np.asarray(raw, np.uint8).reshape(n, -1)
    return raw.reshape(n, raw.shape[1] // size, size)


def decode_q8_0(raw: np.ndarray, n: int):
    b = _blocks(raw, n, 34)
    return b[..., 0:2], b[..., 2:].view(np.int8)                 # d bits, k [N, nb, 32]


# ggml's kvalues_iq4nl: an IQ4_NL weight is d * IQ4_NL_VALUES[its 4-bit index]
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def decode_iq4_nl(raw: np.ndarray, n: int):
    """-> d bits, k [N, nb, 32] int8 (the table values: Q8_0's integers, exactly)."""
    b = _blocks(raw, n, 18)
    qs = b[..., 2:18]
    return b[..., 0:2], IQ4_NL_VALUES[np.concatenate([qs & 15, qs >> 4], axis=-1)]


def decode_q5_0(raw: np.ndarray, n: int):
    b = _blocks(raw, n, 22)
    qh = np.ascontiguousarray(b[..., 2:6]).view("<u4")[..., 0]     # bit i: u[i] >> 4
    qs = b[..., 6:22]
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)              # [N, nb, 32]
    high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return b[..., 0:2], (low | (high.astype(np.uint8) << 4))      # d bits, u = k + 16


def decode_q4_0(raw: np.ndarray, n: int):
    b = _blocks(raw, n, 18)
    qs = b[..., 2:18]
    return b[..., 0:2], np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.uint8) + 8   # u = k + 16


def decode_q4_1(raw: np.ndarray, n: int):
    b = _blocks(raw, n, 20)
    qs = b[..., 4:20]
    return b[..., 0:2], b[..., 2:4], np.concatenate([qs & 15, qs >> 4], axis=-1)   # d, m bits, u


def decode_q5_1(raw: np.ndarray, n: int):
    b = _blocks(raw, n, 24)
    qh = np.ascontiguousarray(b[..., 4:8]).view("<u4")[..., 0]     # bit i: u[i] >> 4
    qs = b[..., 8:24]
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)
    high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return b[..., 0:2], b[..., 2:4], low | (high.astype(np.uint8) << 4)            # d, m bits, u


def decode_q6_k(raw: np.ndarray, n: int):
    """-> d [N, ns], sc int8 [N, ns, 16] (per 16 weights), q [N, ns, 256] in -32..31."""
    b = _blocks(raw, n, 210)
    ql, qh, sc = b[..., :128], b[..., 128:192], b[..., 192:208].view(np.int8)
    d = _half(b[..., 208:210])
    # per half of 128 weights: ql byte j holds weight j (low nibble) and j + 64 (high); qh byte j
    # holds bits 4..5 of weights j, j + 32, j + 64, j + 96 (two bits each, low first)
    ql = ql.reshape(n, -1, 2, 64)
    low = np.concatenate([ql & 15, ql >> 4], axis=-1)               # [N, ns, 2, 128]
    qh = qh.reshape(n, -1, 2, 32)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = (low | (high << 4)).astype(np.int16).reshape(n, -1, QK_K) - 32
    return d, sc, q


def decode_q2_k(raw: np.ndarray, n: int):
    """-> d, dmin [N, ns], scm uint8 [N, ns, 16] (sc | m << 4 per 16 weights), q [N, ns, 256] in
    0..3."""
    b = _blocks(raw, n, 84)
    qs = b[..., 16:80]              # like Q3_K's low bits: byte i of chunk c: weights 128c + 32s + i
    q = np.concatenate([(qs.reshape(n, -1, 2, 1, 32) >> sh) & 3 for sh in (0, 2, 4, 6)], axis=3)
    return _half(b[..., 80:82]), _half(b[..., 82:84]), b[..., :16], q.reshape(n, -1, QK_K)


def decode_q3_k(raw: np.ndarray, n: int):
    """-> d [N, ns], sc int8 [N, ns, 16] (per 16 weights, the stored 6 bits minus 32), q [N, ns,
    256] in -4..3."""
    b = _blocks(raw, n, 110)
    hmask, qs, s = b[..., :32], b[..., 32:96], b[..., 96:108]
    d = _half(b[..., 108:110])
    # scales: 16 of 6 bits, the low four in bytes 0..7 (low nibbles: 0..7, high: 8..15), the top two
    # in bytes 8..11 (two bits each, sub-block j in byte 8 + j % 4 at bit 2 * (j // 4))
    low = np.concatenate([s[..., :8] & 15, s[..., :8] >> 4], axis=-1)
    top = np.concatenate([(s[..., 8:12] >> sh) & 3 for sh in (0, 2, 4, 6)], axis=-1)
    sc = ((low | (top << 4)).astype(np.int16) - 32).astype(np.int8)
    # two chunks of 128 weights: byte i of a chunk holds weights i, i+32, i+64, i+96 (2 bits each);
    # hmask byte i bit j: the third bit of weight 32 j + i (set: no -4)
    ql = np.concatenate([(qs.reshape(n, -1, 2, 1, 32) >> sh) & 3 for sh in (0, 2, 4, 6)], axis=3)
    qh = (hmask[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1   # [N, ns, 8, 32]
    q = ql.reshape(n, -1, QK_K).astype(np.int16) + (qh.reshape(n, -1, QK_K).astype(np.int16) << 2) - 4
    return d, sc, q


def _k_scale_min(s: np.ndarray):
    """The 12 packed bytes of Q4_K/Q5_K -> sc, m [.., 8], six bits each: sub-blocks 0..3 in the low
    six bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 in bytes 8..11's nibbles plus the top two
    bits of bytes 0..3 / 4..7."""
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, m


def decode_q4_k(raw: np.ndarray, n: int):
    """-> d, dmin [N, ns], sc, m [N, ns, 8] (per 32 weights), q [N, ns, 256] in 0..15."""
    b = _blocks(raw, n, 144)
    d, dmin = _half(b[..., 0:2]), _half(b[..., 2:4])
    sc, m = _k_scale_min(b[..., 4:16])
    qs = b[..., 16:].reshape(n, -1, 4, 32)          # 4 chunks of 64 weights: low nibbles first
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, -1, QK_K)
    return d, dmin, sc, m, q


def decode_q5_k(raw: np.ndarray, n: int):
    """-> d, dmin [N, ns], sc, m [N, ns, 8] (per 32 weights), q [N, ns, 256] in 0..31."""
    b = _blocks(raw, n, 176)
    d, dmin = _half(b[..., 0:2]), _half(b[..., 2:4])
    sc, m = _k_scale_min(b[..., 4:16])
    qh = b[..., 16:48]                              # byte i: bit j is the fifth bit of sub-block j's q[i]
    qs = b[..., 48:].reshape(n, -1, 4, 32)          # like Q4_K: sub-blocks 2c (low) and 2c+1 (high)
    low = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, -1, 8, 32)
    high = (qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    return d, dmin, sc, m, (low | (high << 4)).reshape(n, -1, QK_K)


# ---- one tensor -----------------------------------------------------------------------------------

# GGUF types with a layout: (weights per block, bytes per block), and their ggml type ids
BLOCK_BYTES = {"Q8_0": (32, 34), "Q5_0": (32, 22), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_1": (32, 24),
               "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
               "Q6_K": (256, 210), "IQ4_NL": (32, 18)}
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12,
            "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20}


def gguf_weight_layout(raw: np.ndarray, qtype_name: str, shape: tuple[int, int],
                       unpermute_heads: int | None = None) -> Layout:
    """A GGUF matrix's raw rows ([N, row bytes], the file's order) -> its x16 layout, rows in the
    Hugging Face order (llama q/k rows un-permuted like the import does)."""
    n, k = shape
    if k % QK:
        raise RuntimeInputError(f"{qtype_name} rows of {k} weights are not whole blocks of {QK}")

    def rows(a: np.ndarray) -> np.ndarray:
        if unpermute_heads is None:
            return a
        from ..loader.gguf_import import unpermute_rope_rows
        return unpermute_rope_rows(a, unpermute_heads)

    nb = k // QK
    if qtype_name in ("Q8_0", "IQ4_NL"):          # IQ4_NL: its values -127..113 are int8 integers
        d, ks = (decode_q8_0 if qtype_name == "Q8_0" else decode_iq4_nl)(raw, n)
        blk = np.empty((n, nb), Q8_BLOCK)
        blk["d"] = _half(d)
        blk["qs"] = ks
        return Layout(WX_Q8, pack_q8(rows(blk)))
    if qtype_name in ("Q5_0", "Q4_0"):
        d, u = (decode_q5_0 if qtype_name == "Q5_0" else decode_q4_0)(raw, n)
        return Layout(WX_Q5_0, pack_x16_q5(rows(np.ascontiguousarray(d).view("<u2")[..., 0]), rows(u)))
    if qtype_name == "Q6_K":
        d, sc, q = decode_q6_k(raw, n)
        return Layout(WX_Q6K, pack_x16_q6k(rows(d), rows(sc.reshape(n, nb, 2)),
                                           rows(q.reshape(n, nb, QK))))
    if qtype_name in ("Q4_K", "Q5_K"):
        five = qtype_name == "Q5_K"
        d, dmin, sc, m, q = (decode_q5_k if five else decode_q4_k)(raw, n)
        return Layout(WX_Q5K if five else WX_Q4K,
                      pack_x16_q4k(rows(d), rows(dmin), rows(sc.reshape(n, nb)), rows(m.reshape(n, nb)),
                                   rows(q.reshape(n, nb, QK)), five=five))
    if qtype_name == "Q2_K":
        d, dmin, scm, q = decode_q2_k(raw, n)
        return Layout(WX_Q2K, pack_x16_q2k(rows(d), rows(dmin), rows(scm.reshape(n, nb, 2)),
                                           rows(q.reshape(n, nb, QK))))
    if qtype_name == "Q3_K":
        d, sc, q = decode_q3_k(raw, n)
        return Layout(WX_Q3K, pack_x16_q3k(rows(d), rows(sc.reshape(n, nb, 2)), rows(q.reshape(n, nb, QK))))
    if qtype_name in ("Q4_1", "Q5_1"):
        five = qtype_name == "Q5_1"
        d, m, u = (decode_q5_1 if five else decode_q4_1)(raw, n)
        bits = lambda h: rows(np.ascontiguousarray(h).view("<u2")[..., 0])
        return Layout(WX_Q5_1 if five else WX_Q4_1, pack_x16_q51(bits(d), bits(m), rows(u), five=five))
    raise RuntimeInputError(f"no x16 layout for GGUF type {qtype_name}")


def dequantize_layout(layout: Layout, n: int, k: int) -> np.ndarray:
    """The float32 [n, k] matrix a layout multiplies with (for tests): d * k per block, or
    d * sc * q (- dmin * m) for K-quants."""
    nb = k // QK
    p = layout.packed.reshape(_groups(n), -1)
    if layout.fmt == WX_Q8:
        from .quant import dequantize_q8, unpack_q8
        return dequantize_q8(unpack_q8(layout.packed, n, k))
    if layout.fmt == WX_Q5_0:
        sb, mb = _scale_bytes(nb), _mask_bytes(nb)
        d = np.ascontiguousarray(p[:, :nb * 8]).view("<f2").astype(np.float32).reshape(-1, nb, PACK_ROWS)
        out = (_nibbles(p[:, sb + mb:], nb, p[:, sb:sb + mb]) - 16) * d[..., None]
    elif layout.fmt in (WX_Q4K, WX_Q5K):
        db, sb = _super_bytes(nb, 8), _scale_bytes(nb)
        mb = _mask_bytes(nb) if layout.fmt == WX_Q5K else 0
        sup = np.ascontiguousarray(p[:, :nb // 8 * 32]).view("<f4").reshape(-1, nb // 8, 2, PACK_ROWS)
        scl = p[:, db:db + nb * 8].view(np.int8).reshape(-1, nb, 2, PACK_ROWS).astype(np.float32)
        q = _nibbles(p[:, db + sb + mb:], nb, p[:, db + sb:db + sb + nb * 16] if mb else None)
        sup = np.repeat(sup, 8, axis=1)                                       # [g, nb, 2, 4]
        scale, off = sup[:, :, 0] * scl[:, :, 0], sup[:, :, 1] * scl[:, :, 1]
        out = (scale[..., None] * q.astype(np.float32) - off[..., None]).astype(np.float32)
    elif layout.fmt == WX_Q2K:
        db, sb = _super_bytes(nb, 8), _scale_bytes(nb)
        sup = np.ascontiguousarray(p[:, :nb // 8 * 32]).view("<f4").reshape(-1, nb // 8, 2, PACK_ROWS)
        sup = np.repeat(sup, 8, axis=1)[..., None]                                # [g, nb, 2, 4, 1]
        scm = p[:, db:db + nb * 8].reshape(-1, nb, PACK_ROWS, 2)
        scale = sup[:, :, 0] * (scm & 15).astype(np.float32)                    # [g, nb, 4, 2]
        off = sup[:, :, 1] * (scm >> 4).astype(np.float32)
        u = np.zeros((p.shape[0], nb, PACK_ROWS, QK), np.float32)
        crumb = _crumbs(p[:, db + sb:], nb)
        u[..., LOW6], u[..., LOW6 + 8] = crumb & 3, crumb >> 2
        u = u.reshape(-1, nb, PACK_ROWS, 2, 16)
        out = (scale[..., None] * u - off[..., None]).reshape(-1, nb, PACK_ROWS, QK)
    elif layout.fmt in (WX_Q4_1, WX_Q5_1):
        sb = _scale_bytes(nb)
        mb = _mask_bytes(nb) if layout.fmt == WX_Q5_1 else 0
        half = lambda a: np.ascontiguousarray(a).view("<f2").astype(np.float32).reshape(-1, nb, PACK_ROWS)
        d, m = half(p[:, :nb * 8]), half(p[:, sb:sb + nb * 8])
        q = _nibbles(p[:, 2 * sb + mb:], nb, p[:, 2 * sb:2 * sb + nb * 16] if mb else None)
        out = d[..., None] * q.astype(np.float32) + m[..., None]          # gguf's (d * q) + m
    else:
        q3 = layout.fmt == WX_Q3K
        db, sb, mb = _super_bytes(nb), _scale_bytes(nb), _mask_bytes(nb if q3 else 2 * nb)
        d = np.ascontiguousarray(p[:, :nb // 8 * 16]).view("<f4").reshape(-1, nb // 8, PACK_ROWS)
        sc = p[:, db:db + nb * 8].view(np.int8).reshape(-1, nb, PACK_ROWS, 2).astype(np.float32)
        u = np.zeros((p.shape[0], nb, PACK_ROWS, QK), np.int32)
        if q3:
            bit = _mask_bits(p[:, db + sb:db + sb + nb * 16], 2)
            crumb = _crumbs(p[:, db + sb + mb:], nb)
            u[..., LOW6] = (crumb & 3) | bit[:, :, 0] << 2
            u[..., LOW6 + 8] = (crumb >> 2) | bit[:, :, 1] << 2
            u -= 4
        else:
            bit = _mask_bits(p[:, db + sb:db + sb + nb * 32], 4)
            nib = p[:, db + sb + mb:].reshape(-1, nb, PACK_ROWS, 16).astype(np.int32)
            u[..., LOW6] = (nib & 15) | bit[:, :, 0] << 4 | bit[:, :, 1] << 5
            u[..., LOW6 + 8] = (nib >> 4) | bit[:, :, 2] << 4 | bit[:, :, 3] << 5
            u -= 32
        scale = np.repeat(d, 8, axis=1)[..., None] * sc                           # [g, nb, 4, 2]
        out = (u.reshape(-1, nb, PACK_ROWS, 2, 16) * scale[..., None]).reshape(-1, nb, PACK_ROWS, QK)
    return out.transpose(0, 2, 1, 3).reshape(-1, k)[:n].astype(np.float32)


def _crumbs(raw: np.ndarray, nb: int) -> np.ndarray:
    """A group's crumb region -> [g, nb, 4, 16] int32: per block and row, low | high << 2."""
    pairs = raw.reshape(-1, nb // 2, 1, PACK_ROWS, 16).astype(np.int32)
    return np.concatenate([pairs & 15, pairs >> 4], axis=2).reshape(-1, nb, PACK_ROWS, 16)


def _nibbles(nib: np.ndarray, nb: int, masks: np.ndarray | None) -> np.ndarray:
    """A group's nibble region (and Q5_0-style masks, or None) -> [g, nb, 4, 32] int32 integers."""
    nib = nib.reshape(-1, nb, PACK_ROWS, 16)
    q = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int32)
    if masks is not None:
        bit = _mask_bits(masks, 2)
        q |= np.concatenate([bit[:, :, 0], bit[:, :, 1]], axis=-1) << 4
    return q


X16_BLOCK = np.dtype([("d", "<f4"), ("s", "<i4", (2,)), ("hi", "i1", (QK,)),
                      ("lo", "i1", (QK,))])                                    # ig_block_x16
assert X16_BLOCK.itemsize == 76
