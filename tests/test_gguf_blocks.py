"""weight_format="gguf": a GGUF file's own blocks in the x16 kernel layouts (ignis/formats/gguf_blocks.py,
csrc/ignis.h). References: the `gguf` package's dequantizers for the weights, float64 matmuls on
those weights for the kernels (with the error bound 16-bit activations allow), the f32 engine for a
whole model; the real default model against transformers is in test_runtime_model.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_gguf_import import random_kquant_bytes, write_gguf

from ignis import _core
from ignis.loader.gguf_import import import_gguf
from ignis.loader.resolve import open_dir
from ignis.runtime import Engine, RuntimeInputError
from ignis.formats import FORMATS
from ignis.formats import gguf_blocks as gb

TABLES = [t["name"] for t in _core.kernel_tables() if t["eligible"]]
TYPES = [QT.Q8_0, QT.Q5_0, QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
         QT.IQ4_NL]
FMT = {QT.Q8_0: gb.WX_Q8, QT.Q5_0: gb.WX_Q5_0, QT.Q4_0: gb.WX_Q5_0, QT.Q4_1: gb.WX_Q4_1,
       QT.Q5_1: gb.WX_Q5_1, QT.Q2_K: gb.WX_Q2K, QT.Q3_K: gb.WX_Q3K, QT.Q4_K: gb.WX_Q4K,
       QT.Q5_K: gb.WX_Q5K, QT.Q6_K: gb.WX_Q6K, QT.IQ4_NL: gb.WX_Q8}
KQUANTS = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)
OFFSETS = (QT.Q4_1, QT.Q5_1, QT.Q2_K, QT.Q4_K, QT.Q5_K)      # weights = scale * q + an offset per block


def raw_rows(rng: np.random.Generator, qtype: QT, n: int, k: int) -> np.ndarray:
    """[n, row bytes] of qtype: the gguf package's quantizer for the block types it can make,
    random valid bytes for the K-quants and IQ4_NL (which it cannot)."""
    if qtype in KQUANTS + (QT.IQ4_NL,):
        return random_kquant_bytes(rng, qtype, n, k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.3, (n, 1))).astype(np.float32)
    return gguf.quants.quantize(w, qtype)


def dequantized(raw: np.ndarray, qtype: QT, n: int, k: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, qtype).reshape(n, k)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n", [1, 13, 64])
def test_layout_holds_exactly_the_files_weights(qtype, n):
    rng = np.random.default_rng(n)
    k = 512
    raw = raw_rows(rng, qtype, n, k)
    lay = gb.gguf_weight_layout(raw, qtype.name, (n, k))
    assert lay.fmt == FMT[qtype]
    assert lay.packed.size == gb.packed_x16_bytes(lay.fmt, n, k)
    want = dequantized(raw, qtype, n, k)
    got = gb.dequantize_layout(lay, n, k)
    assert np.array_equal(got, want)


def test_llama_rows_are_unpermuted_like_the_import():
    from ignis.loader.gguf_import import unpermute_rope_rows
    rng = np.random.default_rng(5)
    raw = raw_rows(rng, QT.Q5_0, 64, 256)
    lay = gb.gguf_weight_layout(raw, "Q5_0", (64, 256), unpermute_heads=4)
    want = unpermute_rope_rows(dequantized(raw, QT.Q5_0, 64, 256), 4)
    assert np.array_equal(gb.dequantize_layout(lay, 64, 256), want)


@pytest.mark.parametrize("table", TABLES)
def test_x16_activations(table):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 96)) * np.repeat([1e-3, 1.0, 300.0], 32)).astype(np.float32)
    x[2, :32] = 0.0                                    # an all-zero block
    x[3, 40] = -x[3, 32:64].__abs__().max() * 1.5      # the block's extreme is negative
    raw, sums = _core.quantize_x16_rows(x, kernels=table)
    ref_raw, ref_sums = _core.quantize_x16_rows(x, kernels="generic")
    assert np.array_equal(raw, ref_raw) and np.array_equal(sums, ref_sums)   # every table alike
    blk = raw.view(gb.X16_BLOCK).reshape(5, 3)
    a = 256 * blk["hi"].astype(np.int32) + blk["lo"]
    assert blk["hi"].min() >= -127 and blk["hi"].max() <= 127
    assert np.abs(a).max() <= 32512
    assert np.array_equal(blk["s"], a.reshape(5, 3, 2, 16).sum(-1))
    d = blk["d"][..., None].astype(np.float64)
    back = (a.reshape(5, 3, 32) * d).reshape(5, 96)
    assert np.all(np.abs(back - x) <= 0.5 * np.repeat(blk["d"], 32, axis=1) * (1 + 1e-5) + 1e-30)
    assert np.all(blk["d"][2, 0] == 0) and np.all(a[2, 0] == 0)
    np.testing.assert_allclose(sums, x.reshape(5, 3, 32).sum(-1), rtol=1e-5, atol=1e-6)


def _bound(x: np.ndarray, w: np.ndarray, offsets: bool) -> np.ndarray:
    """|x16 matmul - float64| allowed: half a quantization step of each activation times |w|
    (every weight's value is exact), plus f32 rounding of the sums."""
    raw, _ = _core.quantize_x16_rows(np.ascontiguousarray(x))
    d = raw.view(gb.X16_BLOCK).reshape(x.shape[0], -1)["d"].astype(np.float64)
    step = np.repeat(d, 32, axis=1) * 0.5
    wabs = np.abs(w.astype(np.float64))
    if offsets:              # the kernel multiplies d*sc*q; the offsets (dmin*m, m) see the sums
        wabs = wabs + np.abs(w).max()
    return step @ wabs.T + 1e-5 * (np.abs(x.astype(np.float64)) @ wabs.T) + 1e-30


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("T,N", [(1, 37), (1, 64), (2, 13), (3, 40), (4, 9), (7, 21)])
def test_x16_matmul_matches_float64_on_the_files_weights(table, qtype, T, N):
    rng = np.random.default_rng(T * 100 + N)
    K = 768 if qtype in KQUANTS else 416
    raw = raw_rows(rng, qtype, N, K)
    w = dequantized(raw, qtype, N, K)
    lay = gb.gguf_weight_layout(raw, qtype.name, (N, K))
    x = (rng.standard_normal((T, K)) * rng.uniform(0.1, 10, (1, K))).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    bound = _bound(x, w, qtype in OFFSETS)
    for threads in (1, 2):
        out = np.full((T, N), np.nan, np.float32)
        _core.matmul_x16(out, x, lay, threads=threads, kernels=table)
        err = np.abs(out - want)
        assert np.all(err <= bound), (err.max(), (err / bound).max(), list(zip(out.flat[:4], want.flat[:4])))


PAIR_TYPES = [QT.Q8_0, QT.Q5_0, QT.Q6_K, QT.Q4_K, QT.Q4_1, QT.Q5_1, QT.Q5_K, QT.Q3_K, QT.Q2_K]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("gate", PAIR_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("up", PAIR_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3])
def test_x16_swiglu_pairs_any_two_layouts(table, gate, up, T):
    rng = np.random.default_rng(9)
    N, K = 24, 512
    raw_g, raw_u = raw_rows(rng, gate, N, K), raw_rows(rng, up, N, K)
    g, u = dequantized(raw_g, gate, N, K), dequantized(raw_u, up, N, K)
    lg = gb.gguf_weight_layout(raw_g, gate.name, (N, K))
    lu = gb.gguf_weight_layout(raw_u, up.name, (N, K))
    x = rng.standard_normal((T, K)).astype(np.float32)
    out = np.zeros((T, N), np.float32)
    _core.matmul_x16(out, x, lg, layout2=lu, kernels=table, threads=2)
    a = x.astype(np.float64) @ g.T.astype(np.float64)
    b = x.astype(np.float64) @ u.T.astype(np.float64)
    with np.errstate(over="ignore"):
        want = a / (1 + np.exp(-a)) * b
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_kernel_tables_agree_with_the_portable_twin():
    rng = np.random.default_rng(3)
    for qtype in TYPES:
        raw = raw_rows(rng, qtype, 29, 512)
        lay = gb.gguf_weight_layout(raw, qtype.name, (29, 512))
        x = rng.standard_normal((5, 512)).astype(np.float32)
        ref = np.zeros((5, 29), np.float32)
        _core.matmul_x16(ref, x, lay, kernels="generic")
        for table in TABLES:
            out = np.zeros((5, 29), np.float32)
            _core.matmul_x16(out, x, lay, kernels=table, threads=2)
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_bad_layouts_are_refused():
    with pytest.raises(RuntimeInputError, match="0..31"):
        gb.pack_x16_q5(np.zeros((4, 1), np.uint16), np.full((4, 1, 32), 32, np.uint8))
    with pytest.raises(RuntimeInputError, match="0..15"):
        gb.pack_x16_q4k(np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32),
                        np.zeros((4, 8), np.int8), np.zeros((4, 8), np.int8), np.full((4, 8, 32), 16))
    with pytest.raises(RuntimeInputError, match="super-blocks"):
        gb.pack_x16_q6k(np.zeros((4, 1), np.float32), np.zeros((4, 4, 2), np.int8),
                        np.zeros((4, 4, 32), np.int16))
    with pytest.raises(RuntimeInputError, match="-32..31"):
        gb.pack_x16_q6k(np.zeros((4, 1), np.float32), np.zeros((4, 8, 2), np.int8),
                        np.full((4, 8, 32), 40, np.int16))
    with pytest.raises(RuntimeInputError, match="0..15"):
        gb.pack_x16_q51(np.zeros((4, 1), np.uint16), np.zeros((4, 1), np.uint16),
                        np.full((4, 1, 32), 16, np.uint8), five=False)
    with pytest.raises(RuntimeInputError, match="0..31"):
        gb.pack_x16_q4k(np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32),
                        np.zeros((4, 8), np.int8), np.zeros((4, 8), np.int8), np.full((4, 8, 32), 32),
                        five=True)
    with pytest.raises(RuntimeInputError, match="-4..3"):
        gb.pack_x16_q3k(np.zeros((4, 1), np.float32), np.zeros((4, 8, 2), np.int8),
                        np.full((4, 8, 32), 4, np.int16))
    with pytest.raises(RuntimeInputError, match="0..3"):
        gb.pack_x16_q2k(np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32),
                        np.zeros((4, 8, 2), np.uint8), np.full((4, 8, 32), 4))
    with pytest.raises(RuntimeInputError, match="IQ4_XS"):
        gb.gguf_weight_layout(np.zeros((4, 136), np.uint8), "IQ4_XS", (4, 256))
    with pytest.raises(RuntimeInputError, match="not whole blocks"):
        gb.gguf_weight_layout(np.zeros((4, 20), np.uint8), "Q5_0", (4, 40))
    lay = gb.gguf_weight_layout(raw_rows(np.random.default_rng(0), QT.Q5_0, 8, 64), "Q5_0", (8, 64))
    out = np.zeros((1, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[8, 96\] matrix in packing x16"):
        _core.matmul_x16(out, np.zeros((1, 96), np.float32), lay)


# ---- the tensor table, read without the metadata ------------------------------------------------

def test_tensor_index_agrees_with_the_gguf_reader(tmp_path):
    from ignis.loader.gguf_tensors import tensor_index, tensor_rows
    src = tmp_path / "t.gguf"
    write_gguf(src, "llama", tied=False, qtype=QT.Q5_0, qtypes=MIX)
    index = tensor_index(src)
    reader = gguf.GGUFReader(src)
    assert sorted(index) == sorted(t.name for t in reader.tensors)
    for t in reader.tensors:
        loc = index[t.name]
        assert loc.type_id == int(t.tensor_type)
        assert loc.dims == tuple(int(x) for x in t.shape)
        assert loc.offset == int(t.data_offset)
        rows = t.data.reshape(t.data.shape[0], -1).view(np.uint8)
        assert np.array_equal(tensor_rows(src, loc, rows.shape[0], rows.shape[1]), rows)


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.2, 0.5, 0.9, 0.99])
def test_tensor_index_refuses_a_cut_header(tmp_path, fraction):
    """Cut anywhere in the metadata or the tensor table: a GGUFError, nothing else."""
    from ignis.errors import GGUFError
    from ignis.loader.gguf_tensors import tensor_index
    src = tmp_path / "t.gguf"
    write_gguf(src, "qwen2", qtype=QT.Q8_0)
    data = src.read_bytes()
    header_end = min(loc.offset for loc in tensor_index(src).values())
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(header_end * fraction)])
    with pytest.raises(GGUFError):
        tensor_index(cut)


def _header(*kv: bytes, n_tensors: int = 0) -> bytes:
    import struct
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kv)) + b"".join(kv)


def _key(name: str) -> bytes:
    import struct
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize("what", ["alignment 0", "alignment 3", "huge string", "huge array",
                                  "nested arrays", "unknown type"])
def test_tensor_index_refuses_bad_metadata(tmp_path, what):
    import struct

    from ignis.errors import GGUFError
    from ignis.loader.gguf_tensors import tensor_index
    kv = {
        "alignment 0": _key("general.alignment") + struct.pack("<II", 4, 0),
        "alignment 3": _key("general.alignment") + struct.pack("<II", 4, 3),
        "huge string": _key("a") + struct.pack("<IQ", 8, 2 ** 63),
        "huge array": _key("a") + struct.pack("<IIQ", 9, 4, 2 ** 62),
        "nested arrays": _key("a") + struct.pack("<IIQ", 9, 9, 1) * 1 + struct.pack("<IQ", 9, 1) * 40,
        "unknown type": _key("a") + struct.pack("<I", 99),
    }[what]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(_header(kv) + bytes(64))
    with pytest.raises(GGUFError):
        tensor_index(bad)


# ---- whole models -------------------------------------------------------------------------------

MIX = {"output.weight": QT.Q8_0, "blk.0.ffn_down.weight": QT.Q4_K, "blk.1.ffn_down.weight": QT.Q6_K,
       "blk.0.ffn_up.weight": QT.Q4_0, "blk.1.attn_v.weight": QT.Q8_0, "blk.1.attn_output.weight": QT.F16,
       "blk.0.attn_k.weight": QT.Q4_1, "blk.1.ffn_up.weight": QT.Q5_1, "blk.1.ffn_gate.weight": QT.Q5_K,
       "blk.0.attn_output.weight": QT.Q5_K, "blk.1.attn_q.weight": QT.Q3_K, "blk.1.attn_k.weight": QT.Q2_K,
       "blk.0.attn_v.weight": QT.IQ4_NL}


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def imported(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"gguf-{request.param}")
    src = d / "tiny.gguf"
    write_gguf(src, request.param, tied=False, qtype=QT.Q5_0, qtypes=MIX)
    import_gguf(src, d / "model", progress=False)
    return d / "model", src


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))      # a fresh conversion cache


def test_engine_reads_every_matrix_in_its_files_own_blocks(imported):
    model = open_dir(imported[0], name="tiny")
    eng = Engine(model, n_ctx=64, weight_format="gguf")
    # per weight (packing id, x16 layout, bytes), or None
    lay = dict(zip(eng.step_info.tape.weights, eng._packed))
    x16 = FORMATS["gguf"].parts[0].packing.c_id
    assert lay["lm_head.weight"][:2] == (x16, gb.WX_Q8)
    assert lay["model.layers.0.self_attn.q_proj.weight"][:2] == (x16, gb.WX_Q5_0)
    assert lay["model.layers.0.mlp.up_proj.weight"][:2] == (x16, gb.WX_Q5_0)     # Q4_0
    assert lay["model.layers.0.mlp.down_proj.weight"][:2] == (x16, gb.WX_Q4K)    # Q4_K
    assert lay["model.layers.1.mlp.down_proj.weight"][:2] == (x16, gb.WX_Q6K)    # Q6_K
    assert lay["model.layers.0.self_attn.k_proj.weight"][:2] == (x16, gb.WX_Q4_1)  # Q4_1 (llama: unpermuted)
    assert lay["model.layers.1.mlp.up_proj.weight"][:2] == (x16, gb.WX_Q5_1)     # Q5_1
    assert lay["model.layers.1.mlp.gate_proj.weight"][:2] == (x16, gb.WX_Q5K)    # Q5_K
    assert lay["model.layers.0.self_attn.o_proj.weight"][:2] == (x16, gb.WX_Q5K)
    assert lay["model.layers.1.self_attn.q_proj.weight"][:2] == (x16, gb.WX_Q3K)  # Q3_K
    assert lay["model.layers.1.self_attn.k_proj.weight"][:2] == (x16, gb.WX_Q2K)  # Q2_K
    assert lay["model.layers.0.self_attn.v_proj.weight"][:2] == (x16, gb.WX_Q8)   # IQ4_NL
    assert lay["model.layers.1.self_attn.o_proj.weight"] is None                 # F16: f32 path
    assert lay["model.norm.weight"] is None


def test_show_names_the_block_types_read_as_stored(imported, capsys):
    from ignis.api.cli import main
    assert main(["show", str(imported[0]), "-q"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("gguf blocks"))
    assert "IQ4_NL 1, Q2_K 1, Q3_K 1, Q4_0 1, Q4_1 1, Q4_K 1, Q5_0 " in line and "Q5_1 1, Q5_K 2" in line
    assert line.endswith("--weights gguf multiplies IQ4_NL, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, "
                         "Q5_K, Q6_K, Q8_0 as stored; F16, F32 on the f32 path")


def test_engine_matches_the_f32_engine_on_the_dequantized_weights(imported):
    model = open_dir(imported[0], name="tiny")
    ids = np.random.default_rng(0).integers(0, 64, 40)
    ref = Engine(model, n_ctx=64, weight_format="f32").forward(ids, logits_for="all")
    for _ in range(2):                     # converted, then read back from the conversion cache
        eng = Engine(model, n_ctx=64, weight_format="gguf", max_batch_tokens=16)
        got = eng.forward(ids[:30], logits_for="all")
        got = np.concatenate([got] + [eng.forward(ids[i:i + 1]) for i in range(30, 40)])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def _gguf_steps(model, kernels: str, ids: np.ndarray, n_decode: int) -> np.ndarray:
    """Logits of a prefill of ids (every row) and n_decode greedy steps after it."""
    eng = Engine(model, n_ctx=128, weight_format="gguf", kernels=kernels)
    logits = [eng.forward(ids, logits_for="all")]
    for _ in range(n_decode):
        logits.append(eng.forward(np.array([int(logits[-1][-1].argmax())], np.int32)))
    return np.concatenate(logits)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("table", [t for t in ("avx2",) if t in TABLES])
def test_a_model_step_under_the_avx2_table_is_the_generic_tables_bit_for_bit(tmp_path, arch, table):
    """Every x16 layout (MIX without its F16 matrix, whose f32 matmul differs by table) through the
    executor: the avx2 table's logits, prefill (T > 1) and decode (T = 1), equal the portable
    table's bit for bit."""
    src = tmp_path / "tiny.gguf"
    write_gguf(src, arch, tied=False, qtype=QT.Q5_0,
               qtypes={k: v for k, v in MIX.items() if v != QT.F16})
    import_gguf(src, tmp_path / "model", progress=False)
    model = open_dir(tmp_path / "model", name="tiny")
    ids = np.random.default_rng(2).integers(0, 64, 23).astype(np.int32)
    want = _gguf_steps(model, "generic", ids, 6)
    got = _gguf_steps(model, table, ids, 6)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gguf_format_needs_the_gguf_file(imported, tmp_path):
    moved = tmp_path / "copy"
    shutil.copytree(imported[0], moved)
    src = Path(imported[1])
    keep = src.with_suffix(".away")
    src.rename(keep)
    try:
        with pytest.raises(RuntimeInputError, match="missing"):
            Engine(open_dir(moved, name="tiny"), n_ctx=32, weight_format="gguf")
    finally:
        keep.rename(src)


def test_gguf_format_refused_for_a_model_not_from_gguf(tmp_path):
    from tiny_models import write_tiny_model
    d = write_tiny_model(tmp_path / "tiny")
    with pytest.raises(RuntimeInputError, match="not imported from a GGUF"):
        Engine(open_dir(d, name="tiny"), n_ctx=32, weight_format="gguf")


def test_which_tables_have_an_x16_kernel():
    portable = {t["name"]: "matmul_x16" in t["portable"] for t in _core.kernel_tables()}
    assert portable["generic"]
    assert not any(portable[n] for n in ("avx2", "avx512", "avx512_vnni") if n in portable)


@pytest.mark.parametrize("table", TABLES)
def test_gguf_format_warns_where_it_has_no_fast_kernel(imported, table):
    import warnings
    portable = "matmul_x16" in next(t for t in _core.kernel_tables() if t["name"] == table)["portable"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Engine(open_dir(imported[0], name="tiny"), n_ctx=32, weight_format="gguf", kernels=table)
    said = [w for w in caught if "has no" in str(w.message)]
    assert len(said) == (1 if portable else 0)
    if said:
        assert "q8" in str(said[0].message) and said[0].category is RuntimeWarning


def _copy_import(imported, tmp_path) -> tuple[Path, Path]:
    """A private copy of an imported model and its GGUF, the record pointing at the copy."""
    import json
    d = tmp_path / "model"
    shutil.copytree(imported[0], d)
    src = tmp_path / "copy.gguf"
    shutil.copy(imported[1], src)
    from ignis.loader.provenance import file_sha256
    rec = json.loads((d / "ignis_import.json").read_text())
    rec["source"]["path"] = str(src)
    rec["source"]["sha256"] = file_sha256(src)        # as ignis.load's imports record it
    (d / "ignis_import.json").write_text(json.dumps(rec))
    return d, src


def test_gguf_format_refuses_a_file_changed_since_the_import(imported, tmp_path):
    d, src = _copy_import(imported, tmp_path)
    data = bytearray(src.read_bytes())
    data[-1] ^= 0xFF                              # same size, other bytes
    src.write_bytes(bytes(data))
    with pytest.raises(RuntimeInputError, match="changed since the import"):
        Engine(open_dir(d, name="tiny"), n_ctx=32, weight_format="gguf")


def test_gguf_format_checks_each_tensor_against_the_file(imported, tmp_path):
    import json
    d, _ = _copy_import(imported, tmp_path)
    rec = json.loads((d / "ignis_import.json").read_text())
    rec["tensors"]["lm_head.weight"]["gguf_name"] = "blk.0.ffn_down.weight"
    (d / "ignis_import.json").write_text(json.dumps(rec))
    with pytest.raises(RuntimeInputError, match="lm_head.weight"):
        Engine(open_dir(d, name="tiny"), n_ctx=32, weight_format="gguf")


@pytest.mark.parametrize("damage", ["source is a string", "path is a number", "record is a string"])
def test_gguf_format_refuses_a_damaged_import_record(imported, tmp_path, damage):
    import json
    d, _ = _copy_import(imported, tmp_path)
    rec = json.loads((d / "ignis_import.json").read_text())
    if damage == "source is a string":
        rec["source"] = "x"
    elif damage == "path is a number":
        rec["source"]["path"] = 5
    else:
        rec["tensors"]["lm_head.weight"] = "x"
    (d / "ignis_import.json").write_text(json.dumps(rec))
    model = open_dir(d, name="tiny")
    if damage == "record is a string":          # that weight keeps the f32 path; the rest convert
        eng = Engine(model, n_ctx=32, weight_format="gguf")
        assert dict(zip(eng.step_info.tape.weights, eng._packed))["lm_head.weight"] is None
    else:
        with pytest.raises(RuntimeInputError, match="damaged"):
            Engine(model, n_ctx=32, weight_format="gguf")


def test_an_unreadable_conversion_cache_is_converted_again(imported):
    from ignis.loader.safetensors import SafetensorsFile, SafetensorsWriter
    from ignis.loader.cache import conversion_dir as cache_dir
    model = open_dir(imported[0], name="tiny")
    ids = np.arange(12) % 64
    want = Engine(model, n_ctx=32, weight_format="gguf").forward(ids)
    (path,) = list(cache_dir().glob("gguf-*.safetensors"))
    with SafetensorsFile(path) as f:
        tensors = {n: np.array(f.tensor(n)) for n in f.keys()}
        meta = {k: v for k, v in f.metadata.items() if k != "layouts"}   # the layout ids lost
    path.unlink()
    with SafetensorsWriter(path, [(n, "U8", a.shape) for n, a in tensors.items()], meta) as w:
        for n, a in tensors.items():
            w.write(n, a)
    with pytest.warns(RuntimeWarning, match="unreadable conversion cache"):
        got = Engine(model, n_ctx=32, weight_format="gguf").forward(ids)
    assert np.array_equal(got, want)


# ---- a real file: SmolLM2 135M Instruct, Q4_1 (registry model) ----------------------------------

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
                   "Water boils at", "List three colors:"]


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    """SmolLM2's Q4_1 GGUF pulled into a fresh IGNIS_HOME once per module (~100 MB); skips when its
    package is not installed, unless IGNIS_REQUIRE_MODELS=1."""
    import os

    from ignis.loader import registry
    from real_models import require_model_packages
    require_model_packages(registry.REGISTRY[SMOLLM2])
    home = tmp_path_factory.mktemp("ignis-home-smollm2")
    old = os.environ.get("IGNIS_HOME")
    os.environ["IGNIS_HOME"] = str(home)
    try:
        yield registry.pull(SMOLLM2, progress=False)
    finally:
        os.environ.pop("IGNIS_HOME") if old is None else os.environ.__setitem__("IGNIS_HOME", old)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_q4_1_runs_in_its_own_blocks_with_the_f32_greedy_tokens(smollm2_dir):
    """Every Q4_1 matrix of the file (210) and its Q8_0 embedding (the tied output projection) are
    multiplied as stored, and greedy continuations equal the f32 engine's on the same weights."""
    from collections import Counter

    from ignis.tokenizer import load_tokenizer
    files = open_dir(smollm2_dir, name=SMOLLM2)
    gguf_eng = Engine(files, n_ctx=256, weight_format="gguf")
    packed = dict(zip(gguf_eng.step_info.tape.weights, gguf_eng._packed))
    assert Counter(p[1] for p in packed.values() if p is not None) == {gb.WX_Q4_1: 210, gb.WX_Q8: 1}
    f32_eng = Engine(files, n_ctx=256, weight_format="f32")
    tok = load_tokenizer(smollm2_dir)
    for prompt in SMOLLM2_PROMPTS:
        ids = np.array(tok.encode(prompt), np.int32)
        greedy = []
        for eng in (f32_eng, gguf_eng):
            eng.reset()
            logits, got = eng.forward(ids), []
            for _ in range(32):
                got.append(int(logits[0].argmax()))
                logits = eng.forward(np.array(got[-1:], np.int32))
            greedy.append(got)
        assert greedy[0] == greedy[1], prompt


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("table", [t for t in ("avx2",) if t in TABLES])
def test_smollm2_under_the_avx2_table_is_the_generic_tables_bit_for_bit(smollm2_dir, table):
    """The real Q4_1 file (and its Q8_0 output projection): prefill and greedy decode logits of the
    avx2 table equal the portable table's bit for bit."""
    from ignis.tokenizer import load_tokenizer
    files = open_dir(smollm2_dir, name=SMOLLM2)
    ids = np.array(load_tokenizer(smollm2_dir).encode(SMOLLM2_PROMPTS[0]), np.int32)
    want = _gguf_steps(files, "generic", ids, 4)
    got = _gguf_steps(files, table, ids, 4)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
