"""Kernel table tests: every op x every eligible kernel table x {1, 2} threads x odd sizes,
against a float64 NumPy reference.

How to add an op (the short list of places it touches):
  1. csrc/ignis.h      declare `ig_<op>_ref` and any ISA versions; add a slot to ig_kernel_fns
  2. csrc/ops/*.c      the portable `_ref` twin (plain loops)
  3. csrc/arch/*.c     ISA hot loops, if they pay (optional)
  4. csrc/dispatch.c   fill the slot in every table (no NULL: fall back to the portable one)
  5. ignis/_core.pyx   a thin nogil entry point
  6. this file         a row in CASES below (reference, sizes, tolerance)
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from ignis import _core

TABLES = [t["name"] for t in _core.kernel_tables() if t["eligible"]]
SIZES = [0, 1, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 255, 257, 1000, 4097]


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


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("n", SIZES)
def test_dot_f32(table, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    want = x.astype(np.float64) @ y.astype(np.float64)
    got = _core.dot_f32(x, y, kernels=table)
    assert nmse(got, want) < 1e-10 or abs(got - want) < 1e-5 * max(1.0, n ** 0.5), report(got, want)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 17), (7, 64), (33, 65), (64, 257), (129, 1000)])
def test_gemv_f32_matches_reference_and_threads_are_bitwise_equal(table, rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    want = w.astype(np.float64) @ x.astype(np.float64)
    out1 = np.empty(rows, np.float32)
    out2 = np.empty(rows, np.float32)
    _core.gemv_f32(out1, w, x, threads=1, kernels=table)
    _core.gemv_f32(out2, w, x, threads=2, kernels=table)
    assert nmse(out1, want) < 1e-7, report(out1, want)
    # Parallel over rows only: the thread count must not change a single bit.
    assert np.array_equal(out1.view(np.uint32), out2.view(np.uint32))


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("n", SIZES)
def test_dot_i8_exact_over_full_range(table, n):
    rng = np.random.default_rng(n + 7)
    x = rng.integers(-128, 128, n).astype(np.int8)
    y = rng.integers(-128, 128, n).astype(np.int8)
    if n:
        x[0], y[0] = -128, -128          # the pair that breaks saturating u8*s8 tricks
    want = int(x.astype(np.int64) @ y.astype(np.int64))
    assert _core.dot_i8(x, y, kernels=table) == want


def test_kernel_entry_points_refuse_bad_shapes():
    with pytest.raises(ValueError, match="length mismatch"):
        _core.dot_f32(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="do not agree"):
        _core.gemv_f32(np.zeros(2, np.float32), np.zeros((3, 4), np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="threads"):
        _core.gemv_f32(np.zeros(3, np.float32), np.zeros((3, 4), np.float32), np.zeros(4, np.float32),
                       threads=0)


def test_unknown_or_ineligible_table_is_a_clear_error():
    with pytest.raises(_core.KernelSelectionError, match="no kernel table named 'avx9000'"):
        _core.dot_f32(np.zeros(1, np.float32), np.zeros(1, np.float32), kernels="avx9000")
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
