"""Whole tiny-model steps for the C kernel driver (tests/c/kernel_check.c): for each weight format,
the Engine's compiled tape, its weights (f32 and packed), the executor's sizes, and a prefill then
two decode steps, each with the inputs the Engine fed and the logits the "generic" table gave here.
The driver runs the same tape with every kernel table of its target, without Python.

File layout (little endian), one file per case:
  "IGSTEP1\\0"
  i32 instr_size, n_instrs; the tape records
  i32 n_weights; per weight: i64 rows, elems; f32[elems]; i32 packing, layout (-1: no packing);
      i64 packed bytes; the packed bytes
  i32 n_inputs, n_outputs; i64 arena_bytes, scratch_bytes; i32 max_T, max_R, max_ctx, n_seq,
      kv_f16, n_kv_layers; i32[n_kv_layers] kv widths
  i32 n_steps; per step: i32 T, R; per input: i64 bytes, bytes; per output: i64 floats, f32[]
Run as a script: python tests/c/make_steps.py OUT_DIR.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))          # tests/: tiny_models, test_gguf_import

# (case name, weight format, kv dtype); the gguf case reads a file mixing every x16 layout
CASES = [("f32", "f32", "f32"), ("bf16", "bf16", "f32"), ("q8", "q8", "f16"), ("q4", "q4", "f32"),
         ("gguf", "gguf", "f32"), ("gguf_kv16", "gguf", "f16")]
PROMPT = [5, 17, 3, 33, 42, 7, 60]   # ids below 64: the tiny GGUF vocabulary
DECODE = [11, 23]


class _Recorder:
    """Stands in for _core.Executor while an Engine is built: keeps what the Engine gives it and
    every step's inputs and outputs, and forwards everything to the real executor."""

    def __init__(self, real, args, kwargs):
        self.real, self.args, self.kwargs, self.steps = real, args, kwargs, []

    def bind(self, inputs, outputs, seq=None):
        self.inputs, self.outputs = list(inputs), list(outputs)
        return self.real.bind(inputs, outputs, seq)

    def step(self, T, R, threads=1, with_seq=False):
        if with_seq:
            raise AssertionError("make_steps writes single-sequence steps only")
        ins = [a.copy() for a in self.inputs]
        self.real.step(T, R, threads, with_seq)
        self.steps.append((T, R, ins, [o.copy() for o in self.outputs]))

    def __getattr__(self, name):
        return getattr(self.real, name)


def _engine_steps(model_dir: Path, weight_format: str, kv_dtype: str) -> _Recorder:
    from ignis import _core
    from ignis.loader.resolve import open_dir
    from ignis.runtime import engine as engine_mod

    made = []
    real_cls = _core.Executor

    def record(*args, **kwargs):
        rec = _Recorder(real_cls(*args, **kwargs), args, kwargs)
        made.append(rec)
        return rec

    engine_mod._core.Executor = record
    try:
        eng = engine_mod.Engine(open_dir(model_dir, name="tiny"), n_ctx=32, max_batch_tokens=8,
                                kernels="generic", kv_dtype=kv_dtype, weight_format=weight_format,
                                threads=1)
    finally:
        engine_mod._core.Executor = real_cls
    eng.forward(PROMPT, logits_for="all")
    for tok in DECODE:
        eng.forward([tok])
    (rec,) = made
    return rec


def _write(path: Path, rec: _Recorder) -> None:
    records, weights = rec.args
    kw = rec.kwargs
    packed = kw.get("packed") or [None] * len(weights)
    out = bytearray(b"IGSTEP1\0")
    records = np.ascontiguousarray(records)
    out += struct.pack("<ii", records.dtype.itemsize, len(records)) + records.tobytes()
    out += struct.pack("<i", len(weights))
    for w, p in zip(weights, packed):
        out += struct.pack("<qq", w.shape[0] if w.ndim else 1, w.size)
        out += np.ascontiguousarray(w, np.float32).tobytes()
        if p is None:
            out += struct.pack("<iiq", -1, 0, 0)
        else:
            pk, lay, arr = p
            raw = np.ascontiguousarray(arr).tobytes()
            out += struct.pack("<iiq", int(pk), int(lay), len(raw)) + raw
    kv = list(kw["kv_widths"])
    out += struct.pack("<iiqqiiiiii", kw["n_inputs"], kw["n_outputs"], kw["arena_bytes"],
                       kw["scratch_bytes"], kw["max_batch_tokens"], kw["max_rows"], kw["n_ctx"],
                       kw.get("n_seq", 1), int(kw.get("kv_dtype", "f32") == "f16"), len(kv))
    out += struct.pack(f"<{len(kv)}i", *kv)
    out += struct.pack("<i", len(rec.steps))
    for T, R, ins, outs in rec.steps:
        out += struct.pack("<ii", T, R)
        for a in ins:
            out += struct.pack("<q", a.nbytes) + a.tobytes()
        for o in outs:
            out += struct.pack("<q", o.size) + np.ascontiguousarray(o, np.float32).tobytes()
    path.write_bytes(bytes(out))


def write_steps(out_dir: Path) -> list[Path]:
    """One .step file per case in out_dir (the tiny models are written there too)."""
    from gguf import GGMLQuantizationType as QT
    from ignis.loader.gguf_import import import_gguf
    from test_gguf_import import write_gguf
    from tiny_models import write_tiny_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = write_tiny_model(out_dir / "tiny-hf", arch="qwen2", seed=3)
    # every GGUF block type with an x16 layout, Q4_0 and IQ4_NL included, and every matrix in one
    # of them (so a whole step is integer matmuls: no F16 matrix, which would run the f32 matmul)
    mix = {"output.weight": QT.Q8_0, "blk.0.ffn_down.weight": QT.Q4_K, "blk.1.ffn_down.weight": QT.Q6_K,
           "blk.0.ffn_up.weight": QT.Q4_0, "blk.1.attn_v.weight": QT.Q8_0,
           "blk.0.attn_k.weight": QT.Q4_1, "blk.1.ffn_up.weight": QT.Q5_1, "blk.1.ffn_gate.weight": QT.Q5_K,
           "blk.0.attn_output.weight": QT.Q5_K, "blk.1.attn_q.weight": QT.Q3_K,
           "blk.1.attn_k.weight": QT.Q2_K, "blk.0.attn_v.weight": QT.IQ4_NL}
    src = out_dir / "tiny.gguf"
    write_gguf(src, "qwen2", tied=False, qtype=QT.Q5_0, qtypes=mix)
    gg = import_gguf(src, out_dir / "tiny-gguf", progress=False, overwrite=True)
    paths = []
    for name, fmt, kv in CASES:
        rec = _engine_steps(gg if fmt == "gguf" else hf, fmt, kv)
        p = out_dir / f"{name}.step"
        _write(p, rec)
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write_steps(Path(sys.argv[1])):
        print(p)
