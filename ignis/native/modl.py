"""The MODL section of a compiled library: what csrc/native/runtime.c needs to call ig_model_create
and ig_model_step (csrc/ignis.h) with weights from an mmapped weights.bin, and to decode greedily.

Layout (little endian; every array starts on a multiple of 8 bytes, zero padding before it):
  u32 MODL_VERSION, u32 instr_size (sizeof ig_instr)
  i32 n_instrs, n_weights, n_inputs, n_outputs
  i64 arena_bytes, scratch_bytes
  i32 max_T, max_R, max_ctx, n_kv_layers, kv_dtype (KV_* below), vocab_size, out_width, n_eos,
      f32_weights (1: the step's weights are the f32 format's, so kv_dtype auto keeps f32)
  i32 input roles[n_inputs] (ROLE_*)
  i32 kv widths[n_kv_layers]
  i32 eos ids[n_eos]
  i32 n_valid; u8 valid[ceil(n_valid / 8)]: bit i (LSB first) set when id i may be generated
      (n_valid 0: every id)
  weights.bin: i64 size, i64 sample chunk, i64 n_samples; u8 sha256[32]; u8 sample digest[32]
  per weight: i64 rows, elems; i32 packing (IG_PACK_*), layout; i64 f32 offset (-1: none),
      f32 bytes, packed offset (-1: none), packed bytes   (offsets into weights.bin)
  the tape records, n_instrs x instr_size bytes (ignis.plan.tape.Tape.to_records())
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MODL_VERSION = 1
KV_F32, KV_F16, KV_AUTO = 0, 1, 2
ROLES = {"tokens": 0, "pos": 1, "rows": 2}


@dataclass(frozen=True)
class WeightEntry:
    rows: int
    elems: int
    packing: int          # IG_PACK_*: 0 = the f32 rows
    layout: int
    f32_offset: int       # -1: not stored (a packed matmul weight whose f32 rows nothing reads)
    f32_bytes: int
    packed_offset: int
    packed_bytes: int


@dataclass(frozen=True)
class WeightsIdentity:
    size: int
    sample_chunk: int
    n_samples: int
    sha256: bytes
    sample_digest: bytes


class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def put(self, fmt: str, *values) -> None:
        self.buf += struct.pack("<" + fmt, *values)

    def align(self) -> None:
        self.buf += b"\0" * (-len(self.buf) % 8)

    def array(self, values, dtype) -> None:
        self.align()
        self.buf += np.ascontiguousarray(np.asarray(values, dtype)).tobytes()


def modl_section(*, tape, records: np.ndarray, weights: list[WeightEntry], kv_dtype: int,
                 vocab_size: int, out_width: int, eos: list[int], valid: list[bool] | None,
                 identity: WeightsIdentity, f32_weights: bool) -> bytes:
    """The MODL bytes for a compiled tape and its weights' places in weights.bin."""
    unknown = [k for k in tape.inputs if k not in ROLES]
    if unknown:
        raise ValueError(f"the compiled step takes inputs {unknown} the native runtime cannot feed")
    widths = [0] * (max((layer for layer, _ in tape.kv_layers), default=-1) + 1)
    for layer, w in tape.kv_layers:
        widths[layer] = w
    w = _Writer()
    w.put("II", MODL_VERSION, records.dtype.itemsize)
    w.put("iiii", len(records), len(weights), len(tape.inputs), len(tape.outputs))
    w.put("qq", tape.arena_bytes, tape.scratch_bytes)
    w.put("iiiiiiiii", tape.bounds["T"], tape.bounds["R"], tape.n_ctx, len(widths), kv_dtype,
          vocab_size, out_width, len(eos), int(f32_weights))
    w.array([ROLES[k] for k in tape.inputs], np.int32)
    w.array(widths, np.int32)
    w.array(eos, np.int32)
    w.align()
    if valid is None or all(valid):
        w.put("i", 0)
    else:
        w.put("i", len(valid))
        w.buf += np.packbits(np.asarray(valid, bool), bitorder="little").tobytes()
    w.align()
    w.put("qqq", identity.size, identity.sample_chunk, identity.n_samples)
    w.buf += identity.sha256 + identity.sample_digest
    for e in weights:
        w.put("qqiiqqqq", e.rows, e.elems, e.packing, e.layout, e.f32_offset, e.f32_bytes,
              e.packed_offset, e.packed_bytes)
    w.align()
    w.buf += np.ascontiguousarray(records).tobytes()
    return bytes(w.buf)
