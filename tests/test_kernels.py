"""Kernel table tests: every op x every eligible kernel table x {1, 2} threads x odd sizes,
against a float64 NumPy reference.

How to add an op (the short list of places it touches):
  1. ignis/ir/ops.py     its OpDef: opcode (the next free number, never reused), arity, weights_from,
                         type rule, in-place, purity, scratch
  2. ignis/ir/interp.py  its NumPy semantics (the float64 reference these tests compare with)
  3. csrc/ops.def        one row: name, opcode, activations, min and max weights (the IG_OP_* enum,
                         check_instr's arity and the op names of error messages come from it;
                         test_c_op_table_matches_the_ir_op_table holds it to ir/ops.py)
  4. csrc/executor.c     its case in check_instr (shapes against weights) and in run_instr
  5. its kernel, when no existing slot computes it:
     csrc/ignis.h        a slot in ig_kernel_fns (output first, shape comments) and `ig_<op>_ref`
     csrc/ops/*.c        the portable `_ref` twin (plain loops; threads over rows or heads only)
     csrc/arch/*.c       ISA versions, only where they pay (optional)
     csrc/dispatch.c     the slot in every table (no NULL: the portable one where no ISA version)
     ignis/_core.pyx     a thin nogil entry point taking kernels= and threads=
  6. this file           a row in OP_CASES (_op_case) so the op runs through the real executor as a
                         one-node graph against the interpreter, and for a new kernel its own test
                         (every table x {1, N threads} x odd sizes, bitwise equal across threads)
"""
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from ignis import _core
from ignis.ir import interp
from ignis.ir.graph import GraphBuilder
from ignis.ir.ops import OPS
from ignis.ir.types import TensorType
from ignis.plan.arena import plan_memory
from ignis.plan.tape import lower

TABLES = [t["name"] for t in _core.kernel_tables() if t["eligible"]]


def nmse(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    denom = float(np.sum(want * want))
    err = float(np.sum((got - want) ** 2))
    return err / denom if denom > 0 else err


def report(got, want):
    got, want = np.atleast_1d(got), np.atleast_1d(want)
    diff = np.abs(np.asarray(got, np.float64) - want)
    i = int(np.argmax(diff)) if diff.size else 0
    pairs = list(zip(np.asarray(got).ravel()[:4].tolist(), np.asarray(want).ravel()[:4].tolist()))
    return f"max abs err {diff.max() if diff.size else 0:.3e} at {i}; first pairs (got, want): {pairs}"


def test_generic_table_always_present_and_eligible():
    assert "generic" in TABLES
    assert _core.active_kernels() in TABLES


# ---- the row-wise and elementwise kernels: every table x {1, 2} threads x odd sizes -----------
# (129, 257) and (130, 300) hold more than IG_ROWS_PAR_MIN elements, so 2 threads really split them.
ROW_SHAPES = [(1, 1), (1, 7), (3, 17), (5, 33), (2, 257), (7, 1000), (129, 257), (130, 300)]


def _seed(*key) -> int:
    """A seed from the test's parameters, the same in every process (hash() of a str is not)."""
    return zlib.crc32(repr(key).encode())


def _bitwise_equal(a, b):
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def _rows(T, dim, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((T, dim)) * scale).astype(np.float32)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("T,dim", ROW_SHAPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rmsnorm_matches_float64_and_is_bitwise_equal_across_threads_and_tables(table, T, dim,
                                                                                 weighted):
    x = _rows(T, dim, T * dim, 3.0)
    w = (1 + 0.1 * np.random.default_rng(dim).standard_normal(dim)).astype(np.float32) \
        if weighted else None
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-6)
    if weighted:
        want = want * w
    outs = []
    for threads in (1, 2):
        o = np.full_like(x, np.nan)
        _core.rmsnorm(o, x, w, eps=1e-6, threads=threads, kernels=table)
        outs.append(o)
    assert nmse(outs[0], want) < 1e-12, report(outs[0].ravel(), want.ravel())
    assert _bitwise_equal(outs[0], outs[1])
    generic = np.empty_like(x)
    _core.rmsnorm(generic, x, w, eps=1e-6, kernels="generic")
    assert _bitwise_equal(outs[0], generic)
    inplace = x.copy()                                       # the executor runs it in place too
    _core.rmsnorm(inplace, inplace, w, eps=1e-6, threads=2, kernels=table)
    assert _bitwise_equal(inplace, outs[0])


def _rope64(x, pos, n_heads, head_dim, theta, inv=None):
    """NEOX rope in float64 from the Hugging Face formula, with the angle rounded as the kernel
    documents (ignis.h): the exponent 2j/d, inv_freq and pos * inv_freq in f32, so that large
    positions compare the rotation, not the angle's last bit. inv: a given inverse-frequency table."""
    half = head_dim // 2
    if inv is None:
        e = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
        inv = np.float32(1) / (theta ** e.astype(np.float64)).astype(np.float32)
    ang = (pos.astype(np.float32)[:, None] * inv[None, :]).astype(np.float64)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.astype(np.float64).copy()
    h = out[:, :n_heads * head_dim].reshape(len(x), n_heads, head_dim)
    a, b = h[..., :half].copy(), h[..., half:].copy()
    h[..., :half], h[..., half:] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("T,n_heads,head_dim,extra", [(1, 1, 2, 0), (3, 3, 6, 0), (5, 2, 64, 7),
                                                      (9, 7, 128, 0), (70, 3, 10, 5)])
def test_rope_matches_float64_and_is_bitwise_equal_across_threads_and_tables(table, T, n_heads,
                                                                             head_dim, extra):
    """extra columns past the heads (the v of a packed q|k|v row) are neither read nor written."""
    x = _rows(T, n_heads * head_dim + extra, T + head_dim)
    pos = np.random.default_rng(T).integers(0, 30000, T).astype(np.int32)
    want = _rope64(x, pos, n_heads, head_dim, 1e6)
    outs = []
    for threads in (1, 2):
        o = np.full_like(x, 7.0)
        _core.rope(o, x, pos, n_heads=n_heads, head_dim=head_dim, theta=1e6, threads=threads,
                   kernels=table)
        outs.append(o)
    heads = n_heads * head_dim
    assert nmse(outs[0][:, :heads], want[:, :heads]) < 1e-12, report(outs[0].ravel(), want.ravel())
    assert (outs[0][:, heads:] == 7.0).all()
    assert _bitwise_equal(outs[0], outs[1])
    generic = np.full_like(x, 7.0)
    _core.rope(generic, x, pos, n_heads=n_heads, head_dim=head_dim, theta=1e6, kernels="generic")
    assert _bitwise_equal(outs[0], generic)
    inplace = x.copy()
    _core.rope(inplace, inplace, pos, n_heads=n_heads, head_dim=head_dim, theta=1e6, threads=2,
               kernels=table)
    assert _bitwise_equal(inplace[:, :heads], outs[0][:, :heads])
    assert _bitwise_equal(inplace[:, heads:], x[:, heads:])


def _silu64(x):
    return x / (1.0 + np.exp(-x))


def _gelu_tanh64(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


ELTWISE_REF = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "silu": lambda x, y: _silu64(x),
               "swiglu": lambda x, y: _silu64(x) * y, "scale": lambda x, y: x * y[None, :],
               "geglu": lambda x, y: _gelu_tanh64(x) * y}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op", sorted(ELTWISE_REF))
@pytest.mark.parametrize("T,dim", ROW_SHAPES)
def test_eltwise_matches_float64_and_is_bitwise_equal_across_threads_and_tables(table, op, T, dim):
    x = _rows(T, dim, T * dim + 1, 4.0)
    y = None if op == "silu" else _rows(1 if op == "scale" else T, dim, T + dim)
    if op == "scale":
        y = y[0].copy()
    want = ELTWISE_REF[op](x.astype(np.float64), None if y is None else y.astype(np.float64))
    outs = []
    for threads in (1, 2):
        o = np.full_like(x, np.nan)
        _core.eltwise(op, o, x, y, threads=threads, kernels=table)
        outs.append(o)
    assert nmse(outs[0], want) < 1e-12, report(outs[0].ravel(), want.ravel())
    assert _bitwise_equal(outs[0], outs[1])
    generic = np.empty_like(x)
    _core.eltwise(op, generic, x, y, kernels="generic")
    assert _bitwise_equal(outs[0], generic)
    inplace = x.copy()                                       # out is x (the planner's in-place)
    _core.eltwise(op, inplace, inplace, y, threads=2, kernels=table)
    assert _bitwise_equal(inplace, outs[0])
    if op in ("add", "mul", "swiglu", "geglu"):              # out is y
        inplace = y.copy()
        _core.eltwise(op, inplace, x, inplace, threads=2, kernels=table)
        assert _bitwise_equal(inplace, outs[0])


def _libm_gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanhf(u)) in float32 with the C library's tanhf (what GEGLU computed before its
    polynomial exp), element by element through ctypes."""
    import ctypes
    import ctypes.util
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.tanhf.restype = ctypes.c_float
    libm.tanhf.argtypes = [ctypes.c_float]
    f = np.float32
    out = np.empty_like(x)
    for i, v in enumerate(x):
        u = f(f(0.7978845608028654) * f(v + f(f(0.044715) * f(f(v * v) * v))))
        out[i] = f(f(0.5) * v) * f(f(1.0) + f(libm.tanhf(u)))
    return out


def _silu_inputs() -> np.ndarray:
    """Floats of every kind for SiLU: every 4099th bit pattern (both signs, subnormals, inf, NaN)
    and the edges of ig_expf_f32's branches (|x| = 88, log(FLT_MAX), log 2^-149, log 2^-150)."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x42b00000, 0x42b17217, 0x42b17218, 0xc2b00000, 0xc2ce8ecf, 0xc2ce8ed0,
                      0xc2cff1b4, 0xc2cff1b5, 0x42afffff, 0xc2afffff, 0x7f800000, 0xff800000,
                      0x7fc00000, 0xffc00001, 0x7f800001, 0, 0x80000000, 1, 0x80000001], np.uint32)
    edges = np.concatenate([edges + d for d in (np.uint32(0), np.uint32(1))])
    return np.concatenate([bits, edges]).view(np.float32)


def test_expf_table_is_2_to_the_i_over_32_rounded():
    """ig_expf_tab (csrc/ops/eltwise.c), the table behind SiLU's exp: entry i must be the double
    nearest 2^(i/32), computed here in 60-digit decimal arithmetic, less i << 47."""
    import re
    import struct
    from decimal import Decimal, localcontext
    src = (Path(__file__).resolve().parent.parent / "csrc" / "ops" / "eltwise.c").read_text()
    body = src[src.index("ig_expf_tab[32] = {"):]
    tab = [int(h, 16) for h in re.findall(r"0x[0-9a-fA-F]{16}", body[:body.index("};")])]
    assert len(tab) == 32
    with localcontext() as ctx:
        ctx.prec = 60
        ln2 = Decimal(2).ln()
        for i, entry in enumerate(tab):
            nearest = float((Decimal(i) / 32 * ln2).exp())   # float(Decimal) rounds to nearest
            bits = struct.unpack("<Q", struct.pack("<d", nearest))[0]
            assert entry == (bits - (i << 47)) % (1 << 64), i


@pytest.mark.parametrize("table", TABLES)
def test_silu_has_the_twins_bits_and_libm_expfs(table):
    """SiLU and SwiGLU (ignis.h ig_silu_f32 over ig_expf_f32, glibc's expf algorithm in double) on
    every table, bit for bit the portable twin over floats of every kind, in place too; and where
    the C library is glibc on x86-64 with FMA (__expf_fma), x / (1 + expf(-x)) with libm's expf
    itself: what SiLU computed before (every float was checked so, RESULTS.md). The decode step's
    SwiGLU after its two passes is held to the fused kernel's epilogue by
    test_decode_swiglu_in_two_passes_is_bitwise_the_fused_kernel."""
    x = _silu_inputs()[None].copy()
    y = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    for op in ("silu", "swiglu"):
        args = (x, y) if op == "swiglu" else (x,)
        got, twin = np.empty_like(x), np.empty_like(x)
        _core.eltwise(op, got, *args, kernels=table)
        _core.eltwise(op, twin, *args, kernels="generic")
        assert _bitwise_equal(got, twin), op
        inplace = x.copy()
        _core.eltwise(op, inplace, inplace, *args[1:], kernels=table)
        assert _bitwise_equal(inplace, got), op
    import platform
    libc, version = platform.libc_ver()
    glibc = tuple(int(v) for v in version.split(".")[:2] if v.isdigit()) if libc == "glibc" else ()
    # glibc 2.28 on picks __expf_fma where the CPU has FMA and AVX2
    if not (platform.machine() in ("x86_64", "AMD64") and glibc >= (2, 28)
            and {"fma", "avx2"} <= set(_core.cpu_features())):
        return
    import ctypes
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype = ctypes.c_float
    libm.expf.argtypes = [ctypes.c_float]
    sub = x[0, ::7]
    e = np.array([libm.expf(float(-v)) for v in sub], np.float32)
    with np.errstate(all="ignore"):
        want = sub / (np.float32(1.0) + e)
    silu = np.empty_like(x)
    _core.eltwise("silu", silu, x, kernels=table)
    assert _bitwise_equal(silu[0, ::7], want)


@pytest.mark.parametrize("table", TABLES)
def test_gelu_tanh_error_bound_over_a_sweep(table):
    """GEGLU's gelu_tanh (ignis.h ig_gelu_tanh_f32: x / (1 + exp(-2u)) with a polynomial exp, no libm)
    against float64 and against the libm tanhf formula it replaced, over [-12, 12] every 2^-12 and
    [-1, 1] every 2^-20: the bounds its comment states, and the same bits on every table."""
    x = np.concatenate([np.arange(-12, 12, 2.0 ** -12), np.arange(-1, 1, 2.0 ** -20)]).astype(np.float32)
    one = np.ones((1, x.size), np.float32)
    got = np.empty((1, x.size), np.float32)
    _core.eltwise("geglu", got, x[None].copy(), one, kernels=table)
    got = got[0]
    generic = np.empty((1, x.size), np.float32)
    _core.eltwise("geglu", generic, x[None].copy(), one, kernels="generic")
    assert _bitwise_equal(got, generic[0])
    exact = _gelu_tanh64(x.astype(np.float64))
    err = np.abs(got - exact)
    assert err.max() <= 5.2e-7, (err.max(), x[err.argmax()])
    big = np.abs(exact) > 1e-6
    assert (err[big] / np.abs(exact[big])).max() <= 2e-6
    sub = x[::41]
    ref = _libm_gelu_tanh(sub)
    assert np.abs(ref - _gelu_tanh64(sub.astype(np.float64))).max() <= 4.4e-7   # the bound it had
    assert np.abs(got[::41] - ref).max() <= 4.8e-7
    # the ends: x for large x, (-)0 below about -10, NaN kept
    ends = np.array([[50.0, 1e20, np.inf, -10.5, -50.0, -1e20, 0.0, -0.0, np.nan]], np.float32)
    o = np.empty_like(ends)
    _core.eltwise("geglu", o, ends, np.ones_like(ends), kernels=table)
    assert list(o[0, :3]) == [50.0, 1e20, np.inf]
    assert list(o[0, 3:8]) == [0.0] * 5 and np.isnan(o[0, 8])


def test_kernel_entry_points_refuse_bad_shapes():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="do not agree"):
        _core.rmsnorm(np.zeros((2, 4), np.float32), x, eps=1e-6)
    with pytest.raises(ValueError, match="4 elements"):
        _core.rmsnorm(x.copy(), x, np.zeros(5, np.float32), eps=1e-6)
    with pytest.raises(ValueError, match="threads"):
        _core.rmsnorm(x.copy(), x, eps=1e-6, threads=0)
    with pytest.raises(ValueError, match="hold no 3 heads of 2"):
        _core.rope(x.copy(), x, np.zeros(3, np.int32), n_heads=3, head_dim=2, theta=1e4)
    with pytest.raises(ValueError, match="head_dim even"):
        _core.rope(x.copy(), x, np.zeros(3, np.int32), n_heads=1, head_dim=3, theta=1e4)
    with pytest.raises(ValueError, match="op must be one of"):
        _core.eltwise("sub", x.copy(), x, x)
    with pytest.raises(ValueError, match=r"scale needs y, a C-contiguous float32 array of shape \(4,\)"):
        _core.eltwise("scale", x.copy(), x, x)
    with pytest.raises(ValueError, match="silu takes no y"):
        _core.eltwise("silu", x.copy(), x, x)


def test_unknown_or_ineligible_table_is_a_clear_error():
    with pytest.raises(_core.KernelSelectionError, match="no kernel table named 'avx9000'"):
        _core.eltwise("silu", np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32),
                      kernels="avx9000")
    ineligible = [t for t in _core.kernel_tables() if not t["eligible"]]
    for t in ineligible:
        with pytest.raises(_core.KernelSelectionError, match="lacks"):
            _core.use_kernels(t["name"])


def _run_python(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_env_var_forces_a_table_and_debug_logs_the_choice():
    r = _run_python("import ignis._core as c; print(c.active_kernels())",
                    IGNIS_KERNELS="generic", IGNIS_DEBUG_DISPATCH="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "generic"
    assert "using kernel table 'generic' (forced by IGNIS_KERNELS)" in r.stderr
    assert "cpu features:" in r.stderr


def test_env_var_naming_unknown_table_fails_at_import_with_the_list():
    r = _run_python("import ignis._core", IGNIS_KERNELS="bogus")
    assert r.returncode != 0
    assert "no kernel table named 'bogus'" in r.stderr and "generic" in r.stderr


def test_default_choice_is_best_eligible():
    r = _run_python("import ignis._core as c; print(c.active_kernels())", IGNIS_KERNELS="")
    best = max((t for t in _core.kernel_tables() if t["eligible"]), key=lambda t: t["priority"])
    assert r.stdout.strip() == best["name"]


def test_cpu_features_are_consistent_with_tables():
    feats = set(_core.cpu_features())
    for t in _core.kernel_tables():
        assert t["eligible"] == set(t["requires"]).issubset(feats)
    assert _core.max_threads() >= 1


# ---- every IR op through the executor, as a one-node graph -------------------------------------
# Each case gives the node's inputs in op order: ("act"|"weight", name, array) with activation rows
# on the symbol T (or R for row indices), and the op's attributes. Attention cases run two steps on
# one KV cache (a prefill, then a decode) so cached rows from an earlier step are read back.

CTX = 48


def _gqa(nh=4, nkv=2, hd=6):
    return {"n_heads": nh, "n_kv_heads": nkv, "head_dim": hd}


def _op_case(op, T, rng, big=False):
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    D, K, N = (65, 257, 37) if big else (17, 33, 7)
    g = _gqa(4, 2, 6) if not big else _gqa(6, 3, 10)
    qd, kd = g["n_heads"] * g["head_dim"], g["n_kv_heads"] * g["head_dim"]
    pos = np.arange(T, dtype=np.int32) + (0 if op.startswith("attention") else 3)
    qkv_w = [("weight", "wq", r(qd, K)), ("weight", "wk", r(kd, K)), ("weight", "wv", r(kd, K))]
    qkv_b = [("weight", "bq", r(qd)), ("weight", "bk", r(kd)), ("weight", "bv", r(kd))]
    eps = {"eps": 1e-5}
    cases = {
        "embed": ([("act", "ids", rng.integers(0, 29, T).astype(np.int32)), ("weight", "emb", r(29, D))], {}),
        "rms_normalize": ([("act", "x", r(T, D))], eps),
        "scale": ([("act", "x", r(T, D)), ("weight", "w", r(D))], {}),
        "rmsnorm": ([("act", "x", r(T, D)), ("weight", "w", r(D))], eps),
        "linear": ([("act", "x", r(T, K)), ("weight", "w", r(N, K)), ("weight", "b", r(N))], {}),
        "rope": ([("act", "x", r(T, qd)), ("act", "pos", pos * 37)],
                 {"n_heads": g["n_heads"], "head_dim": g["head_dim"], "theta": 10000.0}),
        "attention": ([("act", "q", r(T, qd)), ("act", "k", r(T, kd)), ("act", "v", r(T, kd)),
                       ("act", "pos", pos)], {"layer": 0, **g}),
        "add": ([("act", "a", r(T, D)), ("act", "b", r(T, D))], {}),
        "silu": ([("act", "x", 4 * r(T, D))], {}),
        "mul": ([("act", "a", r(T, D)), ("act", "b", r(T, D))], {}),
        "swiglu": ([("act", "a", 4 * r(T, D)), ("act", "b", r(T, D))], {}),
        "take_rows": ([("act", "x", r(T, D)),
                       ("act", "rows", np.array([T - 1, 0][:min(T, 2)], np.int32))], {}),
        "linear_qkv": ([("act", "x", r(T, K)), *qkv_w, *qkv_b], g),
        "rope_qkv": ([("act", "qkv", r(T, qd + 2 * kd)), ("act", "pos", pos)], {**g, "theta": 1e6}),
        "linear_qkv_rope": ([("act", "x", r(T, K)), ("act", "pos", pos), *qkv_w, *qkv_b],
                            {**g, "theta": 1e6}),
        "attention_packed": ([("act", "qkv", r(T, qd + 2 * kd)), ("act", "pos", pos)], {"layer": 0, **g}),
        "linear_swiglu": ([("act", "x", r(T, K)), ("weight", "wg", r(N, K)), ("weight", "wu", r(N, K))], {}),
        "linear_add": ([("act", "x", r(T, K)), ("act", "res", r(T, N)), ("weight", "w", r(N, K)),
                        ("weight", "b", r(N))], {}),
        "rms_linear": ([("act", "x", r(T, K)), ("weight", "wn", r(K)), ("weight", "w", r(N, K))], eps),
        "rms_linear_qkv_rope": ([("act", "x", r(T, K)), ("act", "pos", pos), ("weight", "wn", r(K)),
                                 *qkv_w, *qkv_b], {**eps, **g, "theta": 1e6}),
        "rms_linear_swiglu": ([("act", "x", r(T, K)), ("weight", "wn", r(K)), ("weight", "wg", r(N, K)),
                               ("weight", "wu", r(N, K))], eps),
        # a window shorter than the prefill (T=9: rows past the 4th drop their first keys), a scale
        # that is not 1/sqrt(head_dim)
        "attention_window": ([("act", "q", r(T, qd)), ("act", "k", r(T, kd)), ("act", "v", r(T, kd)),
                              ("act", "pos", pos)], {"layer": 0, **g, "window": 4, "scale": 0.3}),
        "geglu": ([("act", "a", 4 * r(T, D)), ("act", "b", r(T, D))], {}),
        "rmsnorm_heads": ([("act", "x", r(T, qd)), ("weight", "w", r(g["head_dim"]))],
                          {**eps, "head_dim": g["head_dim"]}),
    }
    return cases[op]



def _one_op_graph(op, ins, attrs):
    b = GraphBuilder(f"one.{op}")
    vals = []
    for kind, name, a in ins:
        dtype = "i32" if a.dtype == np.int32 else "f32"
        if kind == "act":
            rows = "R" if name == "rows" else "T"
            shape = (rows,) if a.ndim == 1 else (rows, a.shape[1])
            vals.append(b.input(name, TensorType(shape, dtype)))
        else:
            vals.append(b.weight(name, TensorType(a.shape, dtype)))
    b.output("y", b.op(op, *vals, name=op, **attrs))
    return b.finish()


def _run_steps(g, steps, weights, table, threads, kv_dtype="f32", q8=None, bf16=None, n_ctx=CTX):
    """Run `steps` (each {input name: array}) through one executor; returns the outputs."""
    T = max(next(iter(s.values())).shape[0] for s in steps)
    R = max([s["rows"].shape[0] for s in steps if "rows" in s] or [1])
    tape = lower(g, plan_memory(g, {"T": T, "R": R}, n_ctx=n_ctx))
    widths = [w for _, w in sorted(tape.kv_layers)]
    packed = None
    if q8 is not None or bf16 is not None:
        packed = [(2, 0, _packed(q8[n])) if q8 is not None and n in q8
                  else (1, 0, bf16[n]) if bf16 is not None and n in bf16 else None
                  for n in tape.weights]          # Packing.c_id: bf16 1, q8 2
    ex = _core.Executor(tape.to_records(), [weights[n] for n in tape.weights], max_batch_tokens=T,
                        max_rows=R, n_ctx=n_ctx, n_inputs=len(tape.inputs), n_outputs=1,
                        arena_bytes=tape.arena_bytes, scratch_bytes=tape.scratch_bytes,
                        kv_widths=widths, names=[(i.op, i.name) for i in tape.instrs], kernels=table,
                        kv_dtype=kv_dtype, packed=packed)
    outs = []
    cols = g.outputs["y"].type.shape[1]
    for s in steps:
        t = next(iter(s.values())).shape[0]
        r = s["rows"].shape[0] if "rows" in s else 1
        rows = r if g.outputs["y"].type.shape[0] == "R" else t
        out = np.full((rows, cols), np.nan, np.float32)
        ex.bind([np.ascontiguousarray(s[k]) for k in tape.inputs], [out])
        ex.step(t, r, threads)
        outs.append(out)
    return outs


OP_CASES = sorted(OPS)
OP_SIZES = [(1, False), (5, False), (4, True), (9, True)]     # T=1: the GEMV path; T>1: GEMM tiles


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op", OP_CASES)
@pytest.mark.parametrize("T,big", OP_SIZES)
def test_every_op_through_the_executor_matches_float64(table, op, T, big):
    rng = np.random.default_rng(_seed(op, T, big))
    ins, attrs = _op_case(op, T, rng, big)
    g = _one_op_graph(op, ins, attrs)
    weights = {n: a for k, n, a in ins if k == "weight"}
    step1 = {n: a for k, n, a in ins if k == "act"}
    steps = [step1]
    if op.startswith("attention"):
        # then a decode step at the next position, reading the cache the first step wrote
        ins2, _ = _op_case(op, 1, rng, big)
        step2 = {n: a for k, n, a in ins2 if k == "act"}
        step2["pos"] = np.array([T], np.int32)
        steps.append(step2)
    got1 = _run_steps(g, steps, weights, table, 1)
    got2 = _run_steps(g, steps, weights, table, 2)
    cache = interp.KVCache.for_graph(g, CTX)
    for s, a1, a2 in zip(steps, got1, got2):
        want = interp.run(g, weights, s, cache=cache, dtype=np.float64)["y"]
        assert a1.shape == want.shape
        assert nmse(a1, want) < 1e-7, f"{op}: nmse {nmse(a1, want):.2e}; " + report(a1.ravel(), want.ravel())
        # parallel over output columns or heads only: thread count changes no bit
        assert np.array_equal(a1.view(np.uint32), a2.view(np.uint32)), op


@pytest.mark.parametrize("table", TABLES)
def test_matmul_row_results_do_not_depend_on_the_batch(table):
    """A row computed in a prefill tile equals the same row computed alone (decode), bit for bit."""
    rng = np.random.default_rng(5)
    ins, attrs = _op_case("linear_add", 7, rng, big=True)
    g = _one_op_graph("linear_add", ins, attrs)
    weights = {n: a for k, n, a in ins if k == "weight"}
    acts = {n: a for k, n, a in ins if k == "act"}
    whole = _run_steps(g, [acts], weights, table, 2)[0]
    rows = _run_steps(g, [{k: v[t:t + 1] for k, v in acts.items()} for t in range(7)], weights, table, 1)
    assert np.array_equal(whole.view(np.uint32), np.concatenate(rows).view(np.uint32))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("window", [0, 21])
def test_attention_at_real_head_sizes_matches_float64(table, head_dim, window):
    """head_dim 64 / 128 / 256 (Gemma 3's; the vectorized path: 16 keys' dot products at a time,
    the weighted sum of values in registers): a 37-row prefill (two blocks of 16 keys and a tail,
    causal) then a decode reading the cache back, against float64; window 21: attention_window,
    whose rows past the 21st start their keys later (blocks of 16 from there)."""
    rng = np.random.default_rng(head_dim)
    g_attrs = {"layer": 0, **_gqa(4, 2, head_dim)}
    op = "attention"
    if window:
        op, g_attrs = "attention_window", {**g_attrs, "window": window, "scale": 0.05}
    qd, kd = 4 * head_dim, 2 * head_dim
    steps = []
    for T, p0 in ((37, 0), (1, 37)):
        steps.append({"q": rng.standard_normal((T, qd)).astype(np.float32),
                      "k": rng.standard_normal((T, kd)).astype(np.float32),
                      "v": rng.standard_normal((T, kd)).astype(np.float32),
                      "pos": np.arange(p0, p0 + T, dtype=np.int32)})
    ins = [("act", n, steps[0][n]) for n in ("q", "k", "v", "pos")]
    g = _one_op_graph(op, ins, g_attrs)
    got1 = _run_steps(g, steps, {}, table, 1)
    got2 = _run_steps(g, steps, {}, table, 2)
    cache = interp.KVCache.for_graph(g, CTX)
    for s, a1, a2 in zip(steps, got1, got2):
        want = interp.run(g, {}, s, cache=cache, dtype=np.float64)["y"]
        assert nmse(a1, want) < 1e-9, report(a1.ravel(), want.ravel())
        assert np.array_equal(a1.view(np.uint32), a2.view(np.uint32))
    # an f16 cache of keys and values that f16 holds exactly: the same path reads them widened,
    # so the same bits as the f32 cache
    for s in steps:
        for n in ("k", "v"):
            s[n] = s[n].astype(np.float16).astype(np.float32)
    f32 = _run_steps(g, steps, {}, table, 2)
    f16 = _run_steps(g, steps, {}, table, 2, kv_dtype="f16")
    for a, b in zip(f32, f16):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op", ["attention", "attention_packed"])
def test_attention_with_an_f16_kv_cache(op, table):
    """With k and v already representable in f16, f16 storage loses nothing: same tolerance, in
    every table (each widens the cache rows its own way: F16C, vcvtph2ps or the portable code)."""
    rng = np.random.default_rng(11)
    steps = []
    for T in (6, 1):
        ins, attrs = _op_case(op, T, rng, big=True)
        acts = {n: a for k, n, a in ins if k == "act"}
        for name in ("k", "v", "qkv"):
            if name in acts:
                acts[name] = acts[name].astype(np.float16).astype(np.float32)
        acts["pos"] = np.arange(T, dtype=np.int32) + (6 if T == 1 else 0)
        steps.append(acts)
    g = _one_op_graph(op, ins, attrs)
    got1 = _run_steps(g, steps, {}, table, 1, kv_dtype="f16")
    got2 = _run_steps(g, steps, {}, table, 2, kv_dtype="f16")
    cache = interp.KVCache.for_graph(g, CTX)
    for s, a1, a2 in zip(steps, got1, got2):
        want = interp.run(g, {}, s, cache=cache, dtype=np.float64)["y"]
        assert nmse(a1, want) < 1e-7, report(a1.ravel(), want.ravel())
        assert np.array_equal(a1.view(np.uint32), a2.view(np.uint32))


def test_f16_conversions_match_numpy():
    specials = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65519.99, 65520.0, -70000.0, np.inf, -np.inf,
                         6.1035156e-05, 6.0e-05, 5.96e-08, 2.98e-08, 2.99e-08, 1e-9, 1.00048828125,
                         1.0009765625 + 0.00048828125], np.float32)
    rng = np.random.default_rng(3)
    x = np.concatenate([specials, rng.standard_normal(20000).astype(np.float32) *
                        np.exp2(rng.integers(-30, 20, 20000)).astype(np.float32)])
    got = np.empty(x.size, np.uint16)
    _core.f32_to_f16(x, got)
    with np.errstate(over="ignore"):              # the overflow to inf is what is checked
        want = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    first = [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:4]]
    assert bad.size == 0, f"{bad.size} differ; first (x, got, want): {first}"
    nan = np.empty(1, np.uint16)
    _core.f32_to_f16(np.array([np.nan], np.float32), nan)
    assert np.isnan(nan.view(np.float16)[0])
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    wide = np.empty(65536, np.float32)
    _core.f16_to_f32(every, wide)
    ref = every.view(np.float16).astype(np.float32)
    finite = ~np.isnan(ref)
    assert np.array_equal(wide[finite].view(np.uint32), ref[finite].view(np.uint32))
    assert np.isnan(wide[~finite]).all()


def _packed(q):
    """q8 blocks as the executor takes them (the packed layout), or None."""
    from ignis.formats.quant import pack_q8
    return None if q is None else pack_q8(q)


def test_packed_q8_round_trips_and_pads_the_last_group():
    from ignis.formats.quant import pack_q8, packed_q8_bytes, quantize_q8, unpack_q8
    rng = np.random.default_rng(3)
    for n, k in ((1, 32), (5, 64), (8, 96), (37, 160)):
        q = quantize_q8(rng.standard_normal((n, k)).astype(np.float32))
        p = pack_q8(q)
        assert p.dtype == np.uint8 and p.size == packed_q8_bytes(n, k)
        back = unpack_q8(p, n, k)
        assert np.array_equal(back["d"], q["d"]) and np.array_equal(back["qs"], q["qs"])
        groups = p.reshape(-(-n // 4), -1)
        sb = (k // 32 * 8 + 63) // 64 * 64          # half scales, padded to 64 bytes
        assert groups.shape[1] % 64 == 0 and sb % 64 == 0
        if n % 4:                             # padding rows: scale 0, integers 0 (stored as 128)
            assert (unpack_q8(p, -(-n // 4) * 4, k)["d"][n:] == 0).all()
            assert (groups[-1, sb:].reshape(k // 32, 4, 32)[:, n % 4:] == 128).all()


def _q8_rows(x):
    """Activation rows as the executor quantizes them (per block of 32, scale max|x|/127, nearest
    even), dequantized: the float64 reference then sees the same integers as the kernels."""
    from ignis.formats.quant import dequantize_q8, quantize_activations
    return dequantize_q8(quantize_activations(x)).astype(np.float64)


Q8_CASES = [("linear", 1, 64, 37), ("linear", 5, 96, 37), ("linear_add", 4, 64, 9),
            ("linear_add", 9, 160, 70), ("linear_swiglu", 1, 96, 33), ("linear_swiglu", 6, 64, 5)]


def _matmul_case(op, T, K, N, *, seed):
    """Random inputs of one fused matmul op (linear, linear_add, linear_swiglu) and its graph."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    w2 = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((T, N)).astype(np.float32)
    ins = {"linear": [("act", "x", x), ("weight", "w", w), ("weight", "b", b)],
           "linear_add": [("act", "x", x), ("act", "res", res), ("weight", "w", w), ("weight", "b", b)],
           "linear_swiglu": [("act", "x", x), ("weight", "w", w), ("weight", "w2", w2)]}[op]
    g = _one_op_graph(op, ins, {})
    weights = {n: a for k, n, a in ins if k == "weight"}
    return x, b, res, ins, g, weights


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op,T,K,N", Q8_CASES)
def test_q8_matmul_matches_float64_on_the_quantized_values(table, op, T, K, N):
    from ignis.formats.quant import dequantize_q8, quantize_q8
    x, b, res, ins, g, weights = _matmul_case(op, T, K, N, seed=T * 1000 + K + N)
    q8 = {n: quantize_q8(a) for n, a in weights.items() if a.ndim == 2}
    acts = {n: a for k, n, a in ins if k == "act"}
    got1 = _run_steps(g, [acts], weights, table, 1, q8=q8)[0]
    got2 = _run_steps(g, [acts], weights, table, 2, q8=q8)[0]
    assert np.array_equal(got1.view(np.uint32), got2.view(np.uint32))
    xq = _q8_rows(x)
    wq = {n: dequantize_q8(q).astype(np.float64) for n, q in q8.items()}
    y = xq @ wq["w"].T
    if op == "linear":
        want = y + b
    elif op == "linear_add":
        want = y + b + res
    else:
        want = y / (1 + np.exp(-y)) * (xq @ wq["w2"].T)
    assert nmse(got1, want) < 1e-10, report(got1.ravel(), want.ravel())
    # and within int8 rounding of the unquantized product
    exact = interp.run(g, weights, acts, cache=interp.KVCache.for_graph(g, 1), dtype=np.float64)["y"]
    assert nmse(got1, exact) < 1e-3


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op,T,K,N", Q8_CASES + [("linear", 1, 17, 7), ("linear_add", 5, 1000, 65)])
def test_bf16_matmul_is_the_f32_matmul_on_rounded_weights(table, op, T, K, N):
    """bf16 weights widen exactly to f32: the reference is float64 on the rounded weights."""
    from ignis.formats.bf16 import bf16_to_f32, f32_to_bf16
    x, b, res, ins, g, weights = _matmul_case(op, T, K, N, seed=T * 1000 + K + N + 1)
    bf16 = {n: f32_to_bf16(a) for n, a in weights.items() if a.ndim == 2}
    acts = {n: a for k, n, a in ins if k == "act"}
    got1 = _run_steps(g, [acts], weights, table, 1, bf16=bf16)[0]
    got2 = _run_steps(g, [acts], weights, table, 2, bf16=bf16)[0]
    assert np.array_equal(got1.view(np.uint32), got2.view(np.uint32))
    rounded = {**weights, **{n: bf16_to_f32(h) for n, h in bf16.items()}}
    want = interp.run(g, rounded, acts, cache=interp.KVCache.for_graph(g, 1), dtype=np.float64)["y"]
    assert nmse(got1, want) < 1e-9, report(got1.ravel(), want.ravel())


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("T,N,K", [(1, 37, 64), (1, 64, 896), (3, 70, 160), (9, 33, 96), (4, 16, 32)])
def test_q4_matmul_matches_float64_on_the_quantized_values(table, T, N, K):
    from ignis.formats.quant import dequantize_q8, pack_q4, quantize_q4
    rng = np.random.default_rng(T * 100 + N + K)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    p = pack_q4(quantize_q4(w))
    want = _q8_rows(x) @ dequantize_q8(quantize_q4(w)).astype(np.float64).T
    outs = []
    for threads in (1, 2):
        o = np.empty((T, N), np.float32)
        _core.matmul(o, x, p, fmt="q4", threads=threads, kernels=table)
        outs.append(o)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert nmse(outs[0], want) < 1e-12, report(outs[0].ravel(), want.ravel())


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("K", [96, 416, 32 * 1027])
@pytest.mark.parametrize("pair", [False, True])
def test_q4_matmul_rows_do_not_depend_on_the_batch(table, K, pair):
    """A q4 row computed in prefill tiles (T=7: 4 rows then 3, two groups at a time) has the bits of
    the same row computed alone (the decode tile), plain and as a SwiGLU pair; K = 32 * 1027 makes
    the VNNI kernel summarise the activation in two pieces (1024 blocks, then 3)."""
    from ignis.formats.quant import dequantize_q8, pack_q4, quantize_q4
    rng = np.random.default_rng(K + pair)
    N, T = 37, 7
    w = rng.standard_normal((N, K)).astype(np.float32)
    w2 = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    p, p2 = pack_q4(quantize_q4(w)), pack_q4(quantize_q4(w2)) if pair else None
    whole = np.empty((T, N), np.float32)
    _core.matmul(whole, x, p, fmt="q4", w2=p2, threads=2, kernels=table)
    for t in range(T):
        row = np.empty((1, N), np.float32)
        _core.matmul(row, x[t:t + 1], p, fmt="q4", w2=p2, threads=1, kernels=table)
        assert np.array_equal(row.view(np.uint32), whole[t:t + 1].view(np.uint32)), t
    gate = _q8_rows(x) @ dequantize_q8(quantize_q4(w)).astype(np.float64).T
    want = gate
    if pair:        # silu(x.w) * (x.w2)
        want = gate / (1 + np.exp(-gate)) * (_q8_rows(x) @ dequantize_q8(quantize_q4(w2)).astype(np.float64).T)
    assert nmse(whole, want) < 1e-12, report(whole.ravel(), want.ravel())


@pytest.mark.parametrize("table", TABLES)
def test_every_table_quantizes_activations_to_the_same_bytes(table):
    """The activation blocks every q8/q4 matmul sees: each table's function gives exactly the
    NumPy twin's scales and integers (ties to even included)."""
    from ignis.formats.quant import Q8_BLOCK, quantize_activations
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((7, 160)) * 3).astype(np.float32)
    x[1, :32] = 0.0                                       # an all-zero block
    x[2, 32:64] = np.arange(32, dtype=np.float32) - 15.5  # halves: ties to even at scale 127/16.5
    x[3, 5] = -1e4                                        # one outlier takes the block's scale
    got = _core.quantize_rows(x, kernels=table).view(Q8_BLOCK).reshape(7, 5)
    want = quantize_activations(x)
    assert np.array_equal(got["d"].view(np.uint32), want["d"].view(np.uint32))
    assert np.array_equal(got["qs"], want["qs"])
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.quantize_rows(np.zeros((2, 33), np.float32))


def test_quantize_q4_blocks_and_packing():
    from ignis.runtime.errors import RuntimeInputError
    from ignis.formats.quant import (dequantize_q8, pack_q4, packed_q4_bytes, quantize_q4,
                                     unpack_q4)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((7, 96)).astype(np.float32)
    w[2, :32] = 0.0
    q = quantize_q4(w, rows_per_chunk=3)
    assert q["qs"].min() >= -8 and q["qs"].max() <= 7 and q["d"][2, 0] == 0
    rel = np.linalg.norm(dequantize_q8(q) - w) / np.linalg.norm(w)
    assert rel < 0.1                                   # 4 bits: about 8% for Gaussian weights
    p = pack_q4(q)
    assert p.size == packed_q4_bytes(7, 96)
    back = unpack_q4(p, 7, 96)
    assert np.array_equal(back["qs"], q["qs"]) and np.array_equal(back["d"], q["d"])
    with pytest.raises(RuntimeInputError, match="multiple of 32"):
        quantize_q4(np.zeros((2, 33), np.float32))
    bad = q.copy()
    bad["qs"][0, 0, 0] = 9
    with pytest.raises(RuntimeInputError, match="-8..7"):
        pack_q4(bad)


def test_quantize_q4_keeps_gguf_q4_0_blocks_exact():
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from ignis.formats.quant import dequantize_q8, quantize_q4
    w = (np.random.default_rng(6).standard_normal((8, 128)) * 0.05).astype(np.float32)
    deq = gguf.dequantize(gguf.quantize(w, QT.Q4_0), QT.Q4_0).astype(np.float32)
    np.testing.assert_array_equal(dequantize_q8(quantize_q4(deq)), deq)


@pytest.mark.parametrize("table", TABLES)
def test_a_swiglu_pair_of_different_packings_runs_both_on_f32(table):
    """The matmul of a gate/up pair reads one packing; a pair packed differently (a GGUF file may
    hold gate in a block type with an x16 layout and up in one without) runs both on their f32
    rows, bit for bit the f32 matmul, as the former cascade did; packed alike it reads the pair."""
    from ignis.formats.quant import quantize_q8
    x, b, res, ins, g, weights = _matmul_case("linear_swiglu", 5, 64, 9, seed=11)
    acts = {"x": x}
    f32 = _run_steps(g, [acts], weights, table, 2)[0]
    mixed = _run_steps(g, [acts], weights, table, 2, q8={"w": quantize_q8(weights["w"])})[0]
    assert np.array_equal(mixed.view(np.uint32), f32.view(np.uint32))
    both = _run_steps(g, [acts], weights, table, 2, q8={n: quantize_q8(a) for n, a in weights.items()})[0]
    assert not np.array_equal(both.view(np.uint32), f32.view(np.uint32))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("K,N", [(64, 9), (96, 33), (256, 70)])
def test_decode_swiglu_in_two_passes_is_bitwise_the_fused_kernel(table, K, N):
    """At T = 1 the executor runs a packed gate/up pair as two matmuls (the gate's dots into out,
    then the up projection's with silu(gate) * up as its epilogue); bit for bit the fused kernel
    (_core.matmul with w2), on 1 and 2 threads, and T > 1 still the fused tile."""
    from ignis.formats.quant import pack_q8, quantize_q8
    for T in (1, 3):
        x, b, res, ins, g, weights = _matmul_case("linear_swiglu", T, K, N, seed=K + N + T)
        q8 = {n: quantize_q8(a) for n, a in weights.items()}
        fused = np.zeros((T, N), np.float32)
        _core.matmul(fused, x, pack_q8(q8["w"]), fmt="q8", w2=pack_q8(q8["w2"]), threads=1,
                     kernels=table)
        for threads in (1, 2):
            got = _run_steps(g, [{"x": x}], weights, table, threads, q8=q8)[0]
            assert _bitwise_equal(got, fused), (T, threads)


def test_executor_names_the_packed_weight_it_refuses():
    """One validation loop over `packed`, driven by each packing's C size and its record's dtype:
    the error names the weight and what was expected."""
    from ignis.formats.quant import pack_q8, quantize_q8
    x, b, res, ins, g, weights = _matmul_case("linear", 3, 64, 9, seed=12)
    tape = lower(g, plan_memory(g, {"T": 3, "R": 1}, n_ctx=CTX))
    ws = [weights[n] for n in tape.weights]
    i = tape.weights.index("w")
    kw = dict(max_batch_tokens=3, max_rows=1, n_ctx=CTX, n_inputs=len(tape.inputs), n_outputs=1,
              arena_bytes=tape.arena_bytes, scratch_bytes=tape.scratch_bytes, kv_widths=[],
              names=[(n.op, n.name) for n in tape.instrs])
    good = pack_q8(quantize_q8(weights["w"]))
    packed = [None] * len(ws)

    def refused(entry, match, err=TypeError):
        packed[i] = entry
        with pytest.raises(err, match=match):
            _core.Executor(tape.to_records(), ws, packed=packed, **kw)
    refused((2, 0, good[:-1]), rf"packed\[{i}\] \(weight {i}\): expected the \[9, 64\] matrix in "
            rf"packing q8 \(id 2\): a C-contiguous uint8 array of shape \[{good.size}\]")
    refused((3, 0, good), r"packing q4")
    refused((9, 0, good), r"the packing one of 1\.\.4")
    refused((0, 0, ws[i]), r"f32 is None")
    packed[i] = None
    packed[tape.weights.index("b")] = (1, 0, np.zeros(9, np.uint16))
    with pytest.raises(TypeError, match=r"is not a matrix"):
        _core.Executor(tape.to_records(), ws, packed=packed, **kw)
    with pytest.raises(ValueError, match=r"packed has 1 entries for 2 weights"):
        _core.Executor(tape.to_records(), ws, packed=[None], **kw)


# The AVX2 q8 and q4 kernels (tables avx2 and avx512) keep the twin's arithmetic too: each row's
# block dot summed exactly in int32, then acc += (float)s * (d_x * d_w), block after block.
@pytest.mark.skipif(not [t for t in ("avx2", "avx512") if t in TABLES], reason="needs the avx2 table")
@pytest.mark.parametrize("fmt", ["q8", "q4"])
@pytest.mark.parametrize("T,N,K", [(1, 37, 256), (1, 1, 32), (1, 70, 1536), (1, 45, 96), (1, 108, 160),
                                   (1, 1000, 64), (2, 13, 256), (3, 40, 160), (4, 9, 512), (5, 21, 224),
                                   (9, 7, 64), (19, 70, 288)])
def test_avx2_q8_and_q4_kernels_are_bit_for_bit_the_portable_twin(fmt, T, N, K):
    from ignis.formats.quant import pack_q4, pack_q8, quantize_q4, quantize_q8
    rng = np.random.default_rng(_seed(fmt, T, N, K))
    pack = (lambda w: pack_q8(quantize_q8(w))) if fmt == "q8" else (lambda w: pack_q4(quantize_q4(w)))
    # rows and blocks of very different magnitudes, so the f32 steps round differently
    w = (rng.standard_normal((N, K)) * 10.0 ** rng.uniform(-3, 2, (N, 1))).astype(np.float32)
    w2 = rng.standard_normal((N, K)).astype(np.float32)
    x = (rng.standard_normal((T, K)) * 10.0 ** rng.uniform(-3, 3, (1, K))).astype(np.float32)
    for up in (None, pack(w2)):                      # plain, and the SwiGLU pair
        want = np.zeros((T, N), np.float32)
        _core.matmul(want, x, pack(w), fmt=fmt, w2=up, kernels="generic")
        assert np.all(np.isfinite(want))
        for table in [t for t in ("avx2", "avx512") if t in TABLES]:
            for threads in (1, 2):
                got = np.full((T, N), np.nan, np.float32)
                _core.matmul(got, x, pack(w), fmt=fmt, w2=up, kernels=table, threads=threads)
                assert _bitwise_equal(got, want), (table, threads, up is not None,
                                                   report(got.ravel(), want.ravel()))


def _assert_decode_rows_are_prefill_rows(table, x, packed, kw, N):
    """All rows of x at once (prefill) near the portable twin's; then each row alone (decode), at 1
    and 2 threads, with the bits of its prefill row."""
    T = x.shape[0]
    whole = np.full((T, N), np.nan, np.float32)
    _core.matmul(whole, x, packed, threads=1, kernels=table, **kw)
    twin = np.full((T, N), np.nan, np.float32)
    _core.matmul(twin, x, packed, threads=1, kernels="generic", **kw)
    np.testing.assert_allclose(whole, twin, rtol=1e-5, atol=1e-5 * np.abs(twin).max())
    for threads in (1, 2):
        for t in range(T):
            row = np.full((1, N), np.nan, np.float32)
            _core.matmul(row, x[t:t + 1], packed, threads=threads, kernels=table, **kw)
            assert np.array_equal(row[0].view(np.uint32), whole[t].view(np.uint32)), (threads, t)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("N", [4, 33, 40, 64, 65, 100, 108, 192, 260, 1000])
@pytest.mark.parametrize("fmt", ["q8", "q4", "x16 Q8_0"])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("K", [96, 2048])
def test_decode_rows_of_a_q8_matmul_are_its_prefill_rows_bit_for_bit(table, N, fmt, swiglu, K):
    """Decode (one activation row) reads a q8, q4 or GGUF Q8_0 matrix as two streams a thread, block
    b beside block b + half (csrc/arch/avx512.c, ig_qv_pair; csrc/arch/avx2.c, q2_pair_fn, two
    groups of each stream a tile for q4): each row must still be computed once, into its own place,
    with the bits of the same row in a prefill tile, at 1 and 2 threads. The N make one block, a
    short last block, blocks left without a partner, and (108: 27 groups) a partner short by an odd
    number of groups; 33-64 at 2 threads: blocks halved down to single groups so that each
    thread has a pair. K = 2048: groups long enough (> IG_QV_PAIR_PF_LONG) that the paired q8 tile
    prefetches a fixed number of bytes ahead, not whole groups; a prefetch cannot change bits, so
    this holds that path's rows and their places, not its distance."""
    from ignis.formats import gguf_blocks as gb
    from ignis.formats.quant import pack_q4, pack_q8, quantize_q4, quantize_q8
    rng = np.random.default_rng(N)
    T = 5
    w, w2 = (rng.standard_normal((N, K)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((T, K)).astype(np.float32)
    if fmt in ("q8", "q4"):
        pack = (lambda m: pack_q8(quantize_q8(m))) if fmt == "q8" else (lambda m: pack_q4(quantize_q4(m)))
        kw = dict(fmt=fmt, w2=pack(w2) if swiglu else None)
        packed = pack(w)
    else:
        import gguf
        lay = [gb.gguf_weight_layout(gguf.quants.quantize(m, gguf.GGMLQuantizationType.Q8_0)
                                     .reshape(N, -1), "Q8_0", (N, K)) for m in (w, w2)]
        kw = dict(fmt="x16", layout=lay[0].fmt, w2=lay[1].packed if swiglu else None,
                  layout2=lay[1].fmt if swiglu else 0)
        packed = lay[0].packed
    _assert_decode_rows_are_prefill_rows(table, x, packed, kw, N)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("N", [1, 7, 33, 40, 64, 65, 100, 1000])
@pytest.mark.parametrize("fmt", ["f32", "bf16"])
@pytest.mark.parametrize("swiglu", [False, True])
def test_decode_rows_of_an_f32_or_bf16_matmul_are_its_prefill_rows_bit_for_bit(table, N, fmt, swiglu):
    """Decode (one activation row) reads an f32 or bf16 matrix row by row as one or two streams
    (arch/matmul_tmpl.h dec_rows: block b beside block b + half, a row without a partner alone),
    prefill through the 4x4 and 1x8 tiles: every row must have the same bits either way, at 1 and
    2 threads. The N make one short block, blocks without a partner, and a short partner; K = 100
    leaves a partial vector at the end of each row (16 and 8 lanes)."""
    from ignis.formats.bf16 import f32_to_bf16
    rng = np.random.default_rng(N + 7)
    K, T = 100, 5
    w, w2 = (rng.standard_normal((N, K)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((T, K)).astype(np.float32)
    pack = f32_to_bf16 if fmt == "bf16" else (lambda m: m)
    packed = pack(w)
    kw = dict(fmt=fmt, w2=pack(w2) if swiglu else None)
    _assert_decode_rows_are_prefill_rows(table, x, packed, kw, N)


def test_quantize_q8_blocks():
    from ignis.runtime.errors import RuntimeInputError
    from ignis.formats.quant import dequantize_q8, quantize_q8
    rng = np.random.default_rng(2)
    w = rng.standard_normal((7, 96)).astype(np.float32) * 3
    w[2, :32] = 0.0                                   # an all-zero block: scale 0, no NaN
    w[3, 5] = -50.0                                   # the block's extreme maps to -127, never -128
    q = quantize_q8(w, rows_per_chunk=3)
    assert q.shape == (7, 3) and q.dtype.itemsize == 36
    assert q["qs"].min() >= -127 and q["qs"][3, 0, 5] == -127 and q["d"][2, 0] == 0
    err = np.abs(dequantize_q8(q) - w).reshape(7, 3, 32)
    assert (err <= q["d"][..., None] / 2 * (1 + 1e-6)).all()
    with pytest.raises(RuntimeInputError, match="multiple of 32"):
        quantize_q8(np.zeros((2, 33), np.float32))


def test_quantize_q8_keeps_gguf_grid_blocks_exact():
    """Blocks dequantized from GGUF Q5_0 (f16 d times k in -16..15, extreme -16), Q4_0 (k in
    -8..7) and Q8_0 (k in -127..127) convert to q8 bit for bit; the gguf package makes them."""
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from ignis.formats.quant import dequantize_q8, quantize_q8
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((16, 256)) * 0.05).astype(np.float32)
    for qt in (QT.Q5_0, QT.Q4_0, QT.Q8_0):
        deq = gguf.dequantize(gguf.quantize(w, qt), qt).astype(np.float32)
        q = quantize_q8(deq)
        np.testing.assert_array_equal(dequantize_q8(q), deq)
        assert q["qs"].min() >= -127
    # a plain f32 matrix still gets the usual /127 scale, rounded to a half
    q = quantize_q8(w)
    np.testing.assert_allclose(q["d"], np.abs(w.reshape(16, 8, 32)).max(-1) / np.float32(127),
                               rtol=2**-11)
    assert np.array_equal(q["d"], q["d"].astype(np.float16).astype(np.float32))


def test_executor_names_the_failing_instruction():
    from ignis.errors import CoreError
    rng = np.random.default_rng(0)
    ins, attrs = _op_case("embed", 3, rng)
    g = _one_op_graph("embed", ins, attrs)
    weights = {n: a for k, n, a in ins if k == "weight"}
    bad = {"ids": np.array([1, 29, 2], np.int32)}         # 29 rows in the table: 29 is one past
    with pytest.raises(CoreError, match=r"instruction 0 \(embed 'embed'\): token id 29 \(row 1\) "
                                        r"is outside the vocabulary 0\.\.28") as e:
        _run_steps(g, [bad], weights, None, 1)
    assert (e.value.instruction, e.value.op, e.value.node) == (0, "embed", "embed")


def test_executor_refuses_a_tape_that_does_not_match_its_weights():
    from ignis.errors import CoreError
    rng = np.random.default_rng(0)
    ins, attrs = _op_case("linear", 3, rng)
    g = _one_op_graph("linear", ins, attrs)
    weights = {n: a for k, n, a in ins if k == "weight"}
    weights["w"] = weights["w"][:, :-1].copy()           # one input feature short
    with pytest.raises(CoreError, match=r"refused the tape \(linear 'linear'\): instruction 0 \(linear\): "
                                        r"weight 0 has 7 rows and 224 elements; the tape needs \(7, 33\)"):
        _run_steps(g, [{"x": ins[0][2]}], weights, None, 1)


def test_c_op_table_matches_the_ir_op_table():
    """csrc/ops.def and ignis/ir/ops.py OPS name the same ops with the same opcodes, and C allows
    exactly the activation and weight counts the lowering (plan/tape.py) produces from each op's
    arity and weights_from. Every IR op lowers to the tape, so every one must have its row."""
    c = _core.op_table()
    assert sorted(c) == sorted(OPS), f"only in C: {sorted(set(c) - set(OPS))}; only in " \
                                     f"ir/ops.py: {sorted(set(OPS) - set(c))}"
    for name, op in OPS.items():
        n_args = op.weights_from if op.weights_from is not None else min(op.arity)
        assert all(op.weights_from is not None or a == n_args for a in op.arity), name
        want = (op.opcode, n_args, min(op.arity) - n_args, max(op.arity) - n_args)
        assert c[name] == want, f"{name}: C has (opcode, n_args, w_min, w_max) = {c[name]}, " \
                                f"ir/ops.py implies {want}"


def test_executor_names_the_op_of_a_malformed_instruction():
    from ignis.errors import CoreError
    rng = np.random.default_rng(0)
    ins, attrs = _op_case("rope", 2, rng)
    g = _one_op_graph("rope", ins, attrs)
    tape = lower(g, plan_memory(g, {"T": 2, "R": 1}, n_ctx=CTX))
    kw = dict(max_batch_tokens=2, max_rows=1, n_ctx=CTX, n_inputs=len(tape.inputs), n_outputs=1,
              arena_bytes=tape.arena_bytes, scratch_bytes=tape.scratch_bytes, kv_widths=[],
              names=[("rope", "rope")])
    rec = tape.to_records()
    rec["n_args"][0] = 1
    with pytest.raises(CoreError, match=r"instruction 0 \(rope\): 1 activations and 0 weights; "
                                        r"expected 2 and 0\.\.1"):
        _core.Executor(rec, [], **kw)
    rec = tape.to_records()
    rec["opcode"][0] = max(o.opcode for o in OPS.values()) + 1
    with pytest.raises(CoreError, match=r"instruction 0: unknown opcode \d+ \(this build knows "
                                        r"1\.\.\d+\)"):
        _core.Executor(rec, [], **kw)


def test_executor_refuses_a_record_layout_that_drifted_from_the_c_struct():
    rng = np.random.default_rng(0)
    ins, attrs = _op_case("silu", 2, rng)
    g = _one_op_graph("silu", ins, attrs)
    tape = lower(g, plan_memory(g, {"T": 2, "R": 1}, n_ctx=CTX))
    rec = tape.to_records()
    narrow = rec.astype([(n, "<i4") if n == "out_cols" else (n, rec.dtype.fields[n][0])
                         for n in rec.dtype.names])
    kw = dict(max_batch_tokens=2, max_rows=1, n_ctx=CTX, n_inputs=1, n_outputs=1, arena_bytes=0,
              scratch_bytes=0, kv_widths=[], names=[("silu", "silu")])
    with pytest.raises(ValueError, match="expects 240: rebuild"):
        _core.Executor(narrow, [], **kw)
    with pytest.raises(ValueError, match="kv_dtype"):
        _core.Executor(rec, [], kv_dtype="f8", **kw)


def test_executor_refuses_positions_outside_the_cache():
    from ignis.errors import CoreError
    rng = np.random.default_rng(0)
    ins, attrs = _op_case("attention_packed", 2, rng)
    g = _one_op_graph("attention_packed", ins, attrs)
    acts = {n: a for k, n, a in ins if k == "act"}
    acts["pos"] = np.array([CTX - 1, CTX], np.int32)
    with pytest.raises(CoreError, match=f"position {CTX} \\(row 1\\) is outside the KV cache of {CTX}"):
        _run_steps(g, [acts], {}, None, 1)


ROPE_OPS = ["rope", "rope_qkv", "linear_qkv_rope", "rms_linear_qkv_rope"]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("op", ROPE_OPS)
@pytest.mark.parametrize("T,big", OP_SIZES)
@pytest.mark.parametrize("bias", [False, True])
def test_rope_ops_reading_an_inverse_frequency_table_match_float64(table, op, T, big, bias):
    """The rope ops with their optional last weight, the config's inverse frequencies (a scaled
    rope: some divided by 8, some kept), with and without the projections' biases."""
    rng = np.random.default_rng(_seed(op, T, big, bias))
    ins, attrs = _op_case(op, T, rng, big)
    if not bias:
        ins = [i for i in ins if i[1] not in ("bq", "bk", "bv")]
    half = attrs["head_dim"] // 2
    inv = (1e4 ** -(np.arange(half) * 2.0 / attrs["head_dim"])).astype(np.float32)
    inv[half // 2:] /= 8
    g = _one_op_graph(op, [*ins, ("weight", "inv_freq", inv)], attrs)
    weights = {n: a for k, n, a in [*ins, ("weight", "inv_freq", inv)] if k == "weight"}
    step = {n: a for k, n, a in ins if k == "act"}
    got1, got2 = (_run_steps(g, [step], weights, table, th)[0] for th in (1, 2))
    want = interp.run(g, weights, step, cache=interp.KVCache.for_graph(g, CTX), dtype=np.float64)["y"]
    assert nmse(got1, want) < 1e-7, f"{op}: nmse {nmse(got1, want):.2e}; " + report(got1.ravel(), want.ravel())
    assert np.array_equal(got1.view(np.uint32), got2.view(np.uint32)), op
    # the table is what the kernel reads: without it (plain theta) the result differs
    plain = _run_steps(_one_op_graph(op, ins, attrs), [step], {n: a for n, a in weights.items()
                                                               if n != "inv_freq"}, table, 1)[0]
    assert not np.array_equal(plain, got1)


def test_rope_kernel_reads_the_table_and_none_is_the_plain_one():
    x = _rows(5, 3 * 16, 3)
    pos = np.array([0, 1, 7, 300, 9000], np.int32)
    plain, tabled = np.zeros_like(x), np.zeros_like(x)
    _core.rope(plain, x, pos, n_heads=3, head_dim=16, theta=1e6)
    # models/rope.py's plain table is the kernel's own arithmetic, bit for bit
    from ignis.models.rope import plain_inv_freq
    _core.rope(tabled, x, pos, n_heads=3, head_dim=16, theta=1e6, inv_freq=plain_inv_freq(1e6, 16))
    assert _bitwise_equal(plain, tabled)
    half = plain_inv_freq(1e6, 16) / np.float32(2)
    _core.rope(tabled, x, pos, n_heads=3, head_dim=16, theta=1e6, inv_freq=half)
    want = _rope64(x, pos, 3, 16, 1e6, inv=half)
    assert nmse(tabled, want) < 1e-12
    with pytest.raises(ValueError, match="inv_freq has 7 entries"):
        _core.rope(tabled, x, pos, n_heads=3, head_dim=16, theta=1e6, inv_freq=half[:7])


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("head_dim,theta", [(6, 1e4), (64, 1e6), (256, 1e4), (128, 5e5)])
def test_rope_op_without_a_table_is_bitwise_the_kernel_computing_its_own(table, head_dim, theta):
    """The executor makes a rope op's inverse frequencies once, at creation (no pow per step): a
    step's result is bit for bit the kernel's own (theta given, no table), at large positions too."""
    rng = np.random.default_rng(head_dim)
    x = rng.standard_normal((3, 2 * head_dim)).astype(np.float32)
    pos = np.array([0, 517, 30001], np.int32)
    attrs = {"n_heads": 2, "head_dim": head_dim, "theta": theta}
    g = _one_op_graph("rope", [("act", "x", x), ("act", "pos", pos)], attrs)
    for threads in (1, 2):
        got = _run_steps(g, [{"x": x, "pos": pos}], {}, table, threads)[0]
        want = np.zeros_like(x)
        _core.rope(want, x, pos, n_heads=2, head_dim=head_dim, theta=theta, kernels=table)
        assert _bitwise_equal(got, want), (head_dim, theta, threads)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("head_dim", [6, 64])
def test_windowed_attention_keeps_a_ring_and_matches_float64(table, head_dim):
    """attention_window with window + the step bound below the context: the executor keeps a ring
    of window + T positions per layer (position p at row p % ring). Many steps of 1..4 tokens run
    far past the ring, wrapping it several times (the keys of a row then sit in two runs of rows),
    against the interpreter's full cache in float64; 1 and 2 threads bitwise equal."""
    rng = np.random.default_rng(head_dim + 1)
    window, T = 20, 4                        # a ring of 24 rows under CTX = 48 positions
    attrs = {"layer": 0, **_gqa(4, 2, head_dim), "window": window, "scale": 0.2}
    qd, kd = 4 * head_dim, 2 * head_dim
    steps, p = [], 0
    while p < CTX:
        t = min(1 + (p * 7) % T, CTX - p)
        steps.append({"q": rng.standard_normal((t, qd)).astype(np.float32),
                      "k": rng.standard_normal((t, kd)).astype(np.float32),
                      "v": rng.standard_normal((t, kd)).astype(np.float32),
                      "pos": np.arange(p, p + t, dtype=np.int32)})
        p += t
    assert max(s["pos"].size for s in steps) == T       # the step bound the ring is sized for
    ins = [("act", n, steps[0][n]) for n in ("q", "k", "v", "pos")]
    g = _one_op_graph("attention_window", ins, attrs)
    got1 = _run_steps(g, steps, {}, table, 1)
    got2 = _run_steps(g, steps, {}, table, 2)
    cache = interp.KVCache.for_graph(g, CTX)
    for s, a1, a2 in zip(steps, got1, got2):
        want = interp.run(g, {}, s, cache=cache, dtype=np.float64)["y"]
        assert nmse(a1, want) < 1e-9, f"pos {s['pos']}: " + report(a1.ravel(), want.ravel())
        assert np.array_equal(a1.view(np.uint32), a2.view(np.uint32))


# ---- the tiled attention path (ops/attention_tmpl.h): tiles of query rows x the query heads of
# one KV head, keys in blocks of 16 with an online softmax, against the untiled float64
# reference (the interpreter: every score of a row, then one softmax), on long prompts.
# (heads, kv heads, head_dim, window, scale, kv dtype, context, chunk): GQA 7:1 at the default
# model's head_dim 64, Gemma 3's 256 with a window, MHA at 128, a head_dim the AVX-512 blocks do
# not take (the portable block in every table), f16 caches
TILED_CASES = [
    (14, 2, 64, 0, None, "f32", 300, 300),
    (14, 2, 64, 0, None, "f16", 300, 300),
    (4, 1, 256, 57, 0.0625, "f16", 200, 200),
    (4, 4, 128, 0, None, "f32", 160, 160),
    (6, 2, 48, 33, 0.15, "f32", 170, 170),
    (8, 2, 128, 40, 0.09, "f16", 260, 13),      # steps of 13 rows: a ring of 53 rows, wrapped
]


def _tiled_steps(rng, nh, nkv, hd, n_ctx, chunk):
    steps = []
    for p in range(0, n_ctx, chunk):
        t = min(chunk, n_ctx - p)
        steps.append({"q": rng.standard_normal((t, nh * hd)).astype(np.float32),
                      "k": rng.standard_normal((t, nkv * hd)).astype(np.float32),
                      "v": rng.standard_normal((t, nkv * hd)).astype(np.float32),
                      "pos": np.arange(p, p + t, dtype=np.int32)})
    return steps


def _tiled_graph(steps, nh, nkv, hd, window, scale):
    attrs = {"layer": 0, **_gqa(nh, nkv, hd)}
    op = "attention"
    if window:
        op, attrs = "attention_window", {**attrs, "window": window, "scale": scale}
    return _one_op_graph(op, [("act", n, steps[0][n]) for n in ("q", "k", "v", "pos")], attrs)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("case", TILED_CASES, ids=lambda c: "nh{}-kv{}-hd{}-w{}-{}-T{}x{}".format(
    *c[:4], *c[5:]))
def test_tiled_attention_matches_the_untiled_float64_reference(table, case):
    """A long prompt (160 to 300 positions: many tiles of rows, many blocks of keys, the causal
    diagonal inside blocks, windows starting mid-block) in one step, or in steps of 13 over a ring;
    every row within nmse 1e-9 of float64, 1 and 2 threads bit for bit."""
    nh, nkv, hd, window, scale, kv, n_ctx, chunk = case
    rng = np.random.default_rng(nh * 1000 + hd + window)
    steps = _tiled_steps(rng, nh, nkv, hd, n_ctx, chunk)
    if kv == "f16":            # values f16 holds exactly: the float64 reference sees the same keys
        for s in steps:
            for n in ("k", "v"):
                s[n] = s[n].astype(np.float16).astype(np.float32)
    g = _tiled_graph(steps, nh, nkv, hd, window, scale)
    got1 = _run_steps(g, steps, {}, table, 1, kv_dtype=kv, n_ctx=n_ctx)
    got2 = _run_steps(g, steps, {}, table, 2, kv_dtype=kv, n_ctx=n_ctx)
    cache = interp.KVCache.for_graph(g, n_ctx)
    for s, a1, a2 in zip(steps, got1, got2):
        want = interp.run(g, {}, s, cache=cache, dtype=np.float64)["y"]
        err = nmse(a1, want)
        assert err < 1e-9, f"rows at {s['pos'][0]}..: nmse {err:.2e}; " + report(a1.ravel(), want.ravel())
        for t in (0, a1.shape[0] // 2, a1.shape[0] - 1):     # and row by row: none left far off
            assert nmse(a1[t], want[t]) < 1e-8, f"row at {s['pos'][t]}: " + report(a1[t], want[t])
        assert np.array_equal(a1.view(np.uint32), a2.view(np.uint32))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("case", [TILED_CASES[0], TILED_CASES[1], TILED_CASES[2], TILED_CASES[3],
                                  TILED_CASES[4]],
                         ids=["gqa-f32", "gqa-f16", "gemma-window-f16", "mha-128-f32",
                              "portable-block-window"])
def test_a_tiled_row_has_the_bits_of_that_row_alone(table, case):
    """What a row computes depends on its query and its keys only: the same positions as one long
    step, as steps of 1..17 rows (other tiles, other neighbours) and as decode steps of one row
    give the same bits. (Tiles of at most 8 lanes, decode's, take the keys-as-lanes path of the
    avx2 and avx512 tables: 7 heads x 1 row at head_dim 64, 2 at 256, 1..8 rows of MHA at 128, f32
    and f16 caches.)"""
    nh, nkv, hd, window, scale, kv, n_ctx, _ = case
    rng = np.random.default_rng(7)
    whole = _tiled_steps(rng, nh, nkv, hd, n_ctx, n_ctx)[0]
    cuts, p = [], 0
    while p < n_ctx:                     # uneven steps, then single rows at the end
        t = 1 if p >= n_ctx - 5 else 1 + (p * 5) % 17
        cuts.append((p, min(p + t, n_ctx)))
        p += t
    pieces = [{n: a[lo:hi] for n, a in whole.items()} for lo, hi in cuts]
    g = _tiled_graph([whole], nh, nkv, hd, window, scale)
    one = _run_steps(g, [whole], {}, table, 2, kv_dtype=kv, n_ctx=n_ctx)[0]
    many = np.concatenate(_run_steps(g, pieces, {}, table, 2, kv_dtype=kv, n_ctx=n_ctx))
    bad = np.flatnonzero((one.view(np.uint32) != many.view(np.uint32)).any(axis=1))
    assert bad.size == 0, f"{bad.size} rows differ, first at position {bad[:4].tolist()}"


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("nh,nkv,hd", [(14, 2, 64), (8, 2, 128), (4, 1, 256)],
                         ids=["8-lanes", "4-lanes", "4-lanes-hd256"])
def test_decode_steps_keep_the_bits_where_scores_spread_past_exps_range(table, nh, nkv, hd):
    """Queries scaled up so a block's scores spread over thousands: exp's arguments below -88
    (its edge branches: subnormal weights, exact zeros) beside ordinary ones. Decode rows (the
    keys-as-lanes path, its online softmax step in vectors on avx2) keep the bits of the same rows
    in one long step (the tiled block, lane by lane), and stay within nmse 1e-9 of float64."""
    rng = np.random.default_rng(hd + nh)
    n_ctx = 90
    whole = _tiled_steps(rng, nh, nkv, hd, n_ctx, n_ctx)[0]
    whole["q"] *= np.float32(400.0) * rng.uniform(0.2, 1.5, (n_ctx, 1)).astype(np.float32)
    q = whole["q"].reshape(n_ctx, nh, hd)[:, 0]              # head 0's scores: the premise
    s = q @ whole["k"].reshape(n_ctx, nkv, hd)[:, 0].T / np.sqrt(hd)
    spread = [np.ptp(s[t, :t + 1]) for t in range(16, n_ctx)]
    assert np.mean(np.array(spread) > 800) > 0.5, "scores do not spread past exp's range"
    pieces = [{n: a[lo:lo + 1] for n, a in whole.items()} for lo in range(n_ctx)]
    g = _tiled_graph([whole], nh, nkv, hd, 0, None)
    one = _run_steps(g, [whole], {}, table, 1, n_ctx=n_ctx)[0]
    many = np.concatenate(_run_steps(g, pieces, {}, table, 1, n_ctx=n_ctx))
    bad = np.flatnonzero((one.view(np.uint32) != many.view(np.uint32)).any(axis=1))
    assert bad.size == 0, f"{bad.size} rows differ, first at position {bad[:4].tolist()}"
    want = interp.run(g, {}, whole, cache=interp.KVCache.for_graph(g, n_ctx), dtype=np.float64)["y"]
    assert nmse(many, want) < 1e-9, report(many.ravel(), want.ravel())


@pytest.mark.skipif("avx2" not in TABLES, reason="this CPU has no AVX2")
@pytest.mark.parametrize("case", TILED_CASES, ids=lambda c: "nh{}-kv{}-hd{}-w{}-{}-T{}x{}".format(
    *c[:4], *c[5:]))
def test_avx2_attention_has_the_portable_twins_bits(case):
    """The avx2 table's attention (its 16-key block and decode shape in vectors) computes what the
    portable twin does in the same order, with the same exp (ig_expf_f32): a prompt in steps, then
    decode rows, bit for bit the generic table's."""
    nh, nkv, hd, window, scale, kv, n_ctx, chunk = case
    rng = np.random.default_rng(nh * 100 + hd)
    steps = _tiled_steps(rng, nh, nkv, hd, n_ctx - 6, chunk) + [
        {n: a[:1] for n, a in st.items()} for st in _tiled_steps(rng, nh, nkv, hd, 6, 1)]
    for i, st in enumerate(steps[-6:]):        # the decode rows at the positions after the prompt
        st["pos"] = np.array([n_ctx - 6 + i], np.int32)
    if kv == "f16":
        for st in steps:
            for n in ("k", "v"):
                st[n] = st[n].astype(np.float16).astype(np.float32)
    g = _tiled_graph(steps, nh, nkv, hd, window, scale)
    want = _run_steps(g, steps, {}, "generic", 2, kv_dtype=kv, n_ctx=n_ctx)
    got = _run_steps(g, steps, {}, "avx2", 2, kv_dtype=kv, n_ctx=n_ctx)
    for st, a, b in zip(steps, got, want):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"rows at {st['pos'][0]}.."


def test_attention_past_the_tiled_head_sizes_keeps_the_untiled_path():
    """head_dim above 256 takes the untiled path (one row of one head at a time): still within
    nmse 1e-9 of float64, in every table."""
    rng = np.random.default_rng(3)
    steps = _tiled_steps(rng, 4, 2, 320, 40, 33)
    g = _tiled_graph(steps, 4, 2, 320, 0, None)
    cache = interp.KVCache.for_graph(g, 40)
    wants = [interp.run(g, {}, s, cache=cache, dtype=np.float64)["y"] for s in steps]
    for table in TABLES:
        for a, want in zip(_run_steps(g, steps, {}, table, 2, n_ctx=40), wants):
            assert nmse(a, want) < 1e-9, table + ": " + report(a.ravel(), want.ravel())


# ---- the x16 (GGUF block) kernels: bit for bit the portable twin --------------------------------
# The AVX2 kernel (tables avx2 and avx512) keeps the twin's arithmetic: exact int32 sums per block
# and half, combined in f32 in the twin's order. Random bytes reach every integer a layout can hold
# (the gguf package's quantizer would leave the extremes of Q5_0, Q4_1, ... mostly unused), and the
# activations reach the x16 split's extremes: |a| = 32512 (hi = +-127) and lo = -128.
X16_TWIN_TABLES = [t for t in ("avx2", "avx512") if t in TABLES]
# The AVX-512 VNNI kernel's 16-row tile (one row per lane) keeps the twin's arithmetic too, for the
# nibble layouts it reads (at T = 1, the decode GEMV, too: a case with K of several super-blocks);
# Q8_0, Q2_K and Q3_K stay on its 4-row tiles (4 lanes per row).
X16_VNNI_TWIN = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q4_0", "Q4_1", "Q5_1")
# per GGUF block type with 32 weights: its bytes and where its f16 fields sit
_BLOCK32 = {"Q8_0": (34, (0,)), "Q5_0": (22, (0,)), "Q4_0": (18, (0,)), "Q4_1": (20, (0, 2)),
            "Q5_1": (24, (0, 2)), "IQ4_NL": (18, (0,))}
_KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _x16_layout(rng, qtype: str, n: int, k: int):
    from ignis.formats import gguf_blocks as gb
    if qtype in _KQUANTS:
        import gguf
        from test_gguf_import import random_kquant_bytes
        raw = random_kquant_bytes(rng, gguf.GGMLQuantizationType[qtype], n, k)
    else:
        size, halves = _BLOCK32[qtype]
        raw = rng.integers(0, 256, (n * k // 32, size), dtype=np.uint8)
        for at in halves:   # finite scales (and Q4_1/Q5_1 offsets) of either sign
            raw[:, at:at + 2] = (rng.uniform(1e-3, 2e-2, len(raw)) * rng.choice([-1, 1], len(raw))
                                 ).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw = raw.reshape(n, -1)
    return gb.gguf_weight_layout(raw, qtype, (n, k))


def _x16_extreme_rows(rng, T: int, K: int) -> np.ndarray:
    """Activations whose blocks quantize to the split's extremes: integer values with a block
    maximum of 32512 (scale 1), so a is the value itself: +-32512, 32384 (hi 127, lo -128), -128,
    127, and random ones between; every third block instead random normal at a random scale."""
    x = rng.integers(-32512, 32513, (T, K)).astype(np.float32)
    pick = rng.integers(0, 6, (T, K))
    for i, v in enumerate((32512, -32512, 32384, -32384, -128, 127)):
        x[pick == i] = v if rng.random() < 0.5 else x[pick == i]
    x.reshape(T, -1, 32)[:, :, 0] = 32512
    x.reshape(T, -1, 32)[:, 2::3] = (rng.standard_normal((T, len(range(2, K // 32, 3)), 32))
                                      * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    return x


@pytest.mark.skipif(not X16_TWIN_TABLES, reason="needs the avx2 table")
@pytest.mark.parametrize("qtype", list(_BLOCK32) + list(_KQUANTS))
@pytest.mark.parametrize("T,N,K", [(1, 37, 256), (1, 1, 512), (1, 70, 1536), (2, 13, 256), (3, 40, 768),
                                   (4, 9, 512), (5, 21, 256), (9, 7, 256), (19, 70, 256)])
def test_x16_avx2_kernel_is_bit_for_bit_the_portable_twin(qtype, T, N, K):
    rng = np.random.default_rng(_seed(qtype, T, N, K))
    tables = X16_TWIN_TABLES + (["avx512_vnni"] if qtype in X16_VNNI_TWIN and "avx512_vnni" in TABLES
                                else [])
    Ks = [K] if qtype in _KQUANTS else [K, K - 32 * 3 if K > 256 else 32 * 3]   # odd block counts
    for k in Ks:
        lay, lay2 = _x16_layout(rng, qtype, N, k), _x16_layout(rng, qtype, N, k)
        for x in (_x16_extreme_rows(rng, T, k),
                  (rng.standard_normal((T, k)) * rng.uniform(0.1, 10, (1, k))).astype(np.float32)):
            for up in (None, lay2):                  # plain, and the SwiGLU pair
                want = np.zeros((T, N), np.float32)
                _core.matmul_x16(want, x, lay, layout2=up, kernels="generic")
                assert np.all(np.isfinite(want))
                for table in tables:
                    for threads in (1, 2):
                        got = np.full((T, N), np.nan, np.float32)
                        _core.matmul_x16(got, x, lay, layout2=up, kernels=table, threads=threads)
                        assert _bitwise_equal(got, want), (table, threads, k, up is not None,
                                                           report(got.ravel(), want.ravel()))


# the layouts of the VNNI table's 16-row tile, each with a partner of another of them for a SwiGLU
# pair of mixed layouts
_XV_UP = {"Q5_0": "Q6_K", "Q4_K": "Q5_0", "Q6_K": "Q4_K", "Q5_K": "Q4_1", "Q4_1": "Q5_1",
          "Q5_1": "Q5_K", "Q4_0": "Q4_0"}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("qtype", list(_XV_UP))
def test_decode_rows_of_a_nibble_x16_matmul_are_its_prefill_rows_bit_for_bit(table, qtype):
    """Decode (one activation row) and prefill run a nibble layout through the same tile on every
    table (on VNNI, xv_matmul's 16-row tile: 1 row per decode tile, up to 8 in prefill; a two-stream
    decode that paired blocks half the matrix apart was tried, benchmarks/RESULTS.md): each row
    must be computed once, into its own place, with the bits of the same row in a prefill tile
    (and, on that table, the twin's), at 1 and 2 threads, plain and as a SwiGLU pair of the same or
    another layout. The N make one block of groups, a short last block, and N not a multiple of
    4, 16 or 32; K = 256 and 1536 give a tile's prefetch a short and a long group."""
    rng = np.random.default_rng(_seed(qtype, table))
    T = 5
    exact = table == "avx512_vnni" and qtype in X16_VNNI_TWIN
    for N, K in ((4, 256), (16, 256), (33, 256), (48, 1536), (128, 256), (260, 1536), (1000, 256),
                 (1029, 256)):
        lay, same, other = (_x16_layout(rng, q, N, K) for q in (qtype, qtype, _XV_UP[qtype]))
        x = (rng.standard_normal((T, K)) * rng.uniform(0.1, 10, (1, K))).astype(np.float32)
        for up in (None, same, other):
            whole = np.full((T, N), np.nan, np.float32)
            _core.matmul_x16(whole, x, lay, layout2=up, kernels=table, threads=1)
            twin = np.full((T, N), np.nan, np.float32)
            _core.matmul_x16(twin, x, lay, layout2=up, kernels="generic")
            assert np.all(np.isfinite(twin))
            if exact:
                assert _bitwise_equal(whole, twin), (N, up is not None, report(whole.ravel(), twin.ravel()))
            else:
                np.testing.assert_allclose(whole, twin, rtol=1e-4, atol=1e-4 * np.abs(twin).max())
            for threads in (1, 2):
                for t in range(T):
                    row = np.full((1, N), np.nan, np.float32)
                    _core.matmul_x16(row, x[t:t + 1], lay, layout2=up, kernels=table, threads=threads)
                    assert _bitwise_equal(row[0], whole[t]), (N, up is not None, threads, t,
                                                              report(row[0], whole[t]))


@pytest.mark.skipif(not X16_TWIN_TABLES, reason="needs the avx2 table")
def test_x16_avx2_kernel_handles_mixed_layouts_in_a_swiglu_pair():
    rng = np.random.default_rng(4)
    for gate, up in (("Q5_0", "Q6_K"), ("Q8_0", "Q2_K"), ("Q3_K", "Q4_1"), ("Q5_K", "Q8_0"),
                     ("Q4_K", "Q6_K")):
        lg, lu = _x16_layout(rng, gate, 19, 512), _x16_layout(rng, up, 19, 512)
        x = _x16_extreme_rows(rng, 3, 512) * np.float32(1e-4)
        want = np.zeros((3, 19), np.float32)
        _core.matmul_x16(want, x, lg, layout2=lu, kernels="generic")
        vnni = ["avx512_vnni"] if {gate, up} <= set(X16_VNNI_TWIN) and "avx512_vnni" in TABLES else []
        for table in X16_TWIN_TABLES + vnni:
            got = np.zeros((3, 19), np.float32)
            _core.matmul_x16(got, x, lg, layout2=lu, kernels=table, threads=2)
            assert _bitwise_equal(got, want), (gate, up, table, report(got.ravel(), want.ravel()))


@pytest.mark.skipif(not X16_TWIN_TABLES, reason="needs the avx2 table")
def test_x16_avx2_decode_row_of_mixed_layouts_or_a_long_row_is_the_twins():
    """A decode call (one activation row) runs each layout's AVX2 one-row tile (x2_gemv,
    x2_gemv_q6k) or, for Q8_0, Q3_K and Q2_K, the 4-row tile, also when a SwiGLU pair mixes them
    and at a K of several hundred blocks: the twin's bits."""
    rng = np.random.default_rng(5)
    for gate, up, K in (("Q5_0", "Q8_0", 512), ("Q6_K", "Q3_K", 512), ("Q2_K", "Q4_K", 512),
                        ("Q4_K", "Q6_K", 512), ("Q6_K", None, 20736), ("Q5_0", None, 20512)):
        lg = _x16_layout(rng, gate, 19, K)
        lu = _x16_layout(rng, up, 19, K) if up else None
        x = _x16_extreme_rows(rng, 1, K) * np.float32(1e-4)
        want = np.zeros((1, 19), np.float32)
        _core.matmul_x16(want, x, lg, layout2=lu, kernels="generic")
        for table in X16_TWIN_TABLES:
            for threads in (1, 2):
                got = np.zeros((1, 19), np.float32)
                _core.matmul_x16(got, x, lg, layout2=lu, kernels=table, threads=threads)
                assert _bitwise_equal(got, want), (gate, up, K, table, report(got.ravel(), want.ravel()))


def _quantizer_extremes(rng, K: int) -> np.ndarray:
    """Rows of blocks that test the quantizers' corners: zeros of both signs, denormals and maxima
    of exactly FLT_MIN and 1e-37 (their inverse scale is inf), 4e-37 (finite for q8 only), the
    largest finite floats, inf and NaN at the first, a middle and the last lane, exact rounding
    ties of x * (32512 / max) and of x * (127 / max), a block whose maximum is negative, and random
    values at scales 1e-30..1e30."""
    tiny, fmin = np.float32(1e-40), np.finfo(np.float32).tiny
    ramp = (np.arange(32) - 16) / 16.0                                   # -1 first
    rows = [np.zeros(K), np.full(K, tiny), np.tile([tiny, -tiny, 0, 3 * tiny], K // 4),
            np.tile(ramp * fmin, K // 32), np.tile(ramp * 1e-37, K // 32),
            np.tile(ramp * 4e-37, K // 32), np.tile([0.0, -0.0, -0.0], K)[:K],
            np.tile([3.4e38, -3.4e38, 1.0, -1.0], K // 4),
            np.tile(np.r_[32512.0, np.arange(31) + 0.5], K // 32),          # ties for x16
            np.tile(np.r_[-127.0, np.arange(31) * 4 + 0.5], K // 32)]       # ties for q8
    for lane, special in ((0, np.inf), (17, -np.inf), (31, np.nan), (5, np.nan)):
        row = rng.standard_normal(K)
        row[lane::32] = special
        rows.append(row)
    rows[-1][9::32] = -np.inf                                           # NaN and inf in one block
    rows += [rng.standard_normal(K) * 10.0 ** rng.uniform(-30, 30) for _ in range(6)]
    return np.asarray(rows, np.float32)


def _same_sums(a, b) -> bool:
    """The same bits, or NaN in both (which of two NaNs an add returns is the compiler's operand
    order)."""
    a, b = np.asarray(a), np.asarray(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("K", [32, 96, 4864])
def test_activation_quantizers_give_the_twins_bytes_at_the_extremes(table, K):
    from ignis.formats import gguf_blocks as gb
    x = _quantizer_extremes(np.random.default_rng(K), K)
    raw, sums = _core.quantize_x16_rows(x, kernels=table)
    ref_raw, ref_sums = _core.quantize_x16_rows(x, kernels="generic")
    assert np.array_equal(raw, ref_raw)
    assert _same_sums(sums, ref_sums)
    blk = raw.view(gb.X16_BLOCK).reshape(len(x), -1)
    assert blk["hi"].max() == 127 and blk["lo"].min() == -128     # the split's extremes were reached
    # the twin's definition: zero integers where 32512 / max is 0 or not finite, NaN scales where
    # the block holds a NaN
    a = 256 * blk["hi"].astype(np.int32) + blk["lo"]
    amax = np.abs(x.reshape(len(x), -1, 32).astype(np.float64)).max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float64(32512) / amax
        dead = ~((inv > 0) & (inv <= np.finfo(np.float32).max))
    assert np.all(a[dead] == 0) and np.all(blk["s"][dead] == 0)
    assert np.array_equal(np.isnan(blk["d"]), np.isnan(amax))
    # q8: every row, against the C twin and the NumPy one (denormal, tiny, inf and NaN blocks too)
    from ignis.formats.quant import Q8_BLOCK, quantize_activations
    got = _core.quantize_rows(x, kernels=table).view(Q8_BLOCK).reshape(len(x), -1)
    want = _core.quantize_rows(x, kernels="generic").view(Q8_BLOCK).reshape(len(x), -1)
    assert _bitwise_equal(got["d"], want["d"]) and np.array_equal(got["qs"], want["qs"])
    twin = quantize_activations(x)
    assert _bitwise_equal(got["d"], twin["d"]) and np.array_equal(got["qs"], twin["qs"])
    assert np.all(got["qs"] >= -127)            # never -128: the integer dots' sign tricks need it
