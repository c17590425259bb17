# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""ignis._core — the one compiled extension: CPU dispatch and the C kernels, reached from Python.

The kernel table is chosen once, at import, from CPUID (see csrc/dispatch.c). IGNIS_KERNELS=<name>
forces a table; IGNIS_DEBUG_DISPATCH=1 prints the choice to stderr.
"""
import os
import sys

from libc.stdint cimport int8_t, int32_t, uint32_t


cdef extern from "ignis.h" nogil:
    ctypedef struct ig_kernel_fns:
        float (*dot_f32)(const float *x, const float *y, int n) noexcept nogil
        void (*gemv_f32)(float *out, const float *w, const float *x, int rows, int cols, int n_threads) noexcept nogil
        int32_t (*dot_i8)(const int8_t *x, const int8_t *y, int n) noexcept nogil

    ctypedef struct ig_kernel_table:
        const char *name
        uint32_t requires
        int priority
        ig_kernel_fns fns

    uint32_t ig_cpu_features()
    const char *ig_cpu_feature_name(int bit)
    int ig_kernel_table_count()
    const ig_kernel_table *ig_kernel_table_at(int i)
    const ig_kernel_table *ig_kernel_table_find(const char *name)
    int ig_kernel_table_eligible(const ig_kernel_table *t)
    const ig_kernel_table *ig_kernel_table_best()
    int ig_openmp_enabled()
    int ig_max_threads()


class KernelSelectionError(RuntimeError):
    """A kernel table was asked for that does not exist or that this CPU cannot run."""


cdef const ig_kernel_table *_active = NULL


cdef tuple _feature_names(uint32_t mask):
    names = []
    cdef int bit = 0
    cdef const char *name = ig_cpu_feature_name(0)
    while name != NULL:
        if mask & (1u << bit):
            names.append(name.decode())
        bit += 1
        name = ig_cpu_feature_name(bit)
    return tuple(names)


def cpu_features() -> tuple:
    """Names of the CPU features this process may use (the OS saves their state)."""
    return _feature_names(ig_cpu_features())


def kernel_tables() -> list:
    """Every kernel table compiled in: name, required features, eligibility on this CPU, priority."""
    out = []
    cdef const ig_kernel_table *t
    for i in range(ig_kernel_table_count()):
        t = ig_kernel_table_at(i)
        missing = _feature_names(t.requires & ~ig_cpu_features())
        out.append({"name": t.name.decode(), "requires": _feature_names(t.requires),
                    "eligible": bool(ig_kernel_table_eligible(t)), "missing": missing,
                    "priority": t.priority})
    return out


cdef const ig_kernel_table *_lookup(name) except NULL:
    cdef bytes b = str(name).encode()
    cdef const ig_kernel_table *t = ig_kernel_table_find(b)
    if t == NULL:
        known = ", ".join(k["name"] for k in kernel_tables())
        raise KernelSelectionError(f"no kernel table named {name!r}; this build has: {known}")
    if not ig_kernel_table_eligible(t):
        missing = ", ".join(_feature_names(t.requires & ~ig_cpu_features()))
        raise KernelSelectionError(f"kernel table {name!r} needs CPU features this machine lacks: "
                                   f"{missing}")
    return t


def active_kernels() -> str:
    """Name of the kernel table in use."""
    return _active.name.decode()


def use_kernels(name: str) -> None:
    """Switch every later call to the named kernel table (must be eligible on this CPU)."""
    global _active
    _active = _lookup(name)


def openmp_enabled() -> bool:
    return bool(ig_openmp_enabled())


def max_threads() -> int:
    return ig_max_threads()


cdef const ig_kernel_table *_table_for(kernels) except NULL:
    return _active if kernels is None else _lookup(kernels)


# ---- thin kernel entry points (used by tests and by Python-side checks) -------------------------

def dot_f32(const float[::1] x, const float[::1] y, *, kernels=None) -> float:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"dot_f32: length mismatch {x.shape[0]} vs {y.shape[0]}")
    cdef const ig_kernel_table *t = _table_for(kernels)
    cdef float r
    with nogil:
        r = t.fns.dot_f32(&x[0] if x.shape[0] else NULL, &y[0] if y.shape[0] else NULL, <int>x.shape[0])
    return r


def gemv_f32(float[::1] out, const float[:, ::1] w, const float[::1] x, *, int threads=1,
             kernels=None) -> None:
    if w.shape[1] != x.shape[0] or out.shape[0] != w.shape[0]:
        raise ValueError(f"gemv_f32: shapes out{(out.shape[0],)} w{(w.shape[0], w.shape[1])} "
                         f"x{(x.shape[0],)} do not agree")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if w.shape[0] == 0:
        return
    cdef const ig_kernel_table *t = _table_for(kernels)
    cdef int rows = <int>w.shape[0], cols = <int>w.shape[1]
    with nogil:
        t.fns.gemv_f32(&out[0], &w[0, 0] if cols else NULL, &x[0] if cols else NULL, rows, cols, threads)


def dot_i8(const int8_t[::1] x, const int8_t[::1] y, *, kernels=None) -> int:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"dot_i8: length mismatch {x.shape[0]} vs {y.shape[0]}")
    cdef const ig_kernel_table *t = _table_for(kernels)
    cdef int32_t r
    with nogil:
        r = t.fns.dot_i8(&x[0] if x.shape[0] else NULL, &y[0] if y.shape[0] else NULL, <int>x.shape[0])
    return r


def _select_at_import():
    global _active
    forced = os.environ.get("IGNIS_KERNELS", "").strip()
    if forced:
        _active = _lookup(forced)
        how = "forced by IGNIS_KERNELS"
    else:
        _active = ig_kernel_table_best()
        how = "best eligible"
    if os.environ.get("IGNIS_DEBUG_DISPATCH", "") not in ("", "0"):
        tables = ", ".join(f"{k['name']}{'' if k['eligible'] else ' (ineligible)'}"
                           for k in kernel_tables())
        print(f"ignis: cpu features: {' '.join(cpu_features()) or '(none)'}", file=sys.stderr)
        print(f"ignis: kernel tables: {tables}", file=sys.stderr)
        print(f"ignis: using kernel table {active_kernels()!r} ({how}); "
              f"openmp={'on' if ig_openmp_enabled() else 'off'}, threads={ig_max_threads()}",
              file=sys.stderr)


_select_at_import()


include "_bpe.pxi"
