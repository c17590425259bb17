# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""ignis._core — the one compiled extension: CPU dispatch and the C kernels, reached from Python.

The kernel table is chosen once, at import, from CPUID (see csrc/dispatch.c). IGNIS_KERNELS=<name>
forces a table; IGNIS_DEBUG_DISPATCH=1 prints the choice to stderr.
"""
import os
import sys

from ignis.errors import CoreError

from libc.stdint cimport int8_t, int32_t, int64_t, uint16_t, uint32_t, uintptr_t, uint8_t
from libc.stdlib cimport calloc, free


cdef extern from "ignis.h" nogil:
    ctypedef struct ig_block_q8:
        pass

    ctypedef struct ig_block_x16:
        float d
        int32_t s[2]
        int8_t hi[32]
        int8_t lo[32]

    enum:
        IG_PACK_F32
        IG_PACK_COUNT
        IG_ACT_F32
        IG_ACT_Q8
        IG_ACT_X16

    ctypedef struct ig_packed_weight:
        int32_t packing
        int32_t layout
        const void *w

    int64_t ig_packed_bytes(int packing, int64_t N, int64_t K, int layout)
    int ig_packed_block(int packing, int layout)
    const char *ig_packing_name(int packing)

    ctypedef struct ig_matmul_args:
        float *out
        const void *x
        const float *xsum
        const void *w
        const void *w2
        const float *bias
        const float *res
        const float *gate
        int64_t ldo, ldx, ldr
        int T, N, K
        int layout, layout2

    ctypedef struct ig_wformat:
        int act
        void (*matmul)(const ig_matmul_args *a, int n_threads) noexcept nogil

    ctypedef struct ig_kernel_fns:
        ig_wformat wformat[IG_PACK_COUNT]
        void (*quantize_q8_rows)(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K) noexcept nogil
        void (*quantize_x16_rows)(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T, int K) noexcept nogil
        void (*rmsnorm_f32)(float *out, const float *x, const float *w, int T, int dim, float eps,
                            int n_threads) noexcept nogil
        void (*rope_f32)(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                         const float *inv_freq, int T,
                         int n_heads, int head_dim, float theta, int n_threads) noexcept nogil
        void (*eltwise_f32)(float *out, const float *x, const float *y, int op, int T, int dim,
                            int n_threads) noexcept nogil

    enum:
        IG_EW_ADD
        IG_EW_MUL
        IG_EW_SILU
        IG_EW_SWIGLU
        IG_EW_SCALE
        IG_EW_GEGLU
        IG_MAX_HEAD_DIM

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
    void ig_call_matmul(const ig_wformat *f, const ig_matmul_args *a, int n_threads)
    void ig_call_rmsnorm(const ig_kernel_fns *k, float *out, const float *x, const float *w, int T,
                         int dim, float eps, int n_threads)
    void ig_call_rope(const ig_kernel_fns *k, float *out, int64_t ldo, const float *x, int64_t ldx,
                      const int32_t *pos, const float *inv_freq, int T, int n_heads, int head_dim,
                      float theta, int n_threads)
    void ig_call_eltwise(const ig_kernel_fns *k, float *out, const float *x, const float *y, int op,
                         int T, int dim, int n_threads)
    ctypedef struct ig_pool_stats:
        int64_t jobs, reduced_jobs, late_joins, backoffs, failed_probes, slow_probes
        int64_t shared_windows
        int backoff_jobs, workers, threads_now, traced
        int64_t entered, missed, sleeps, own_ns, wait_ns, lag_ns
    void ig_pool_get_stats(ig_pool_stats *out)

    ctypedef struct ig_instr:
        pass

    ctypedef struct ig_op_info:
        const char *name
        int opcode, n_args, w_min, w_max

    enum: IG_OP_COUNT
    const ig_op_info *ig_op_info_of(int opcode)

    ctypedef struct ig_model_desc:
        const ig_instr *instrs
        int n_instrs
        const float *const *weights
        const ig_packed_weight *packed
        const int64_t *weight_rows
        const int64_t *weight_elems
        int n_weights
        int n_inputs
        int n_outputs
        int64_t arena_bytes
        int64_t scratch_bytes
        int max_T
        int max_R
        int max_ctx
        int n_seq
        const int32_t *kv_widths
        int n_kv_layers
        int kv_f16
        const ig_kernel_table *kernels

    ctypedef struct ig_model:
        pass

    int ig_model_create(ig_model **out, const ig_model_desc *desc, char *err, int err_len)
    void ig_model_free(ig_model *m)
    int ig_model_step(ig_model *m, const void *const *inputs, float *const *outputs, int T, int R,
                      const int32_t *seq, int n_threads, int *failed)
    int ig_model_kv_copy(ig_model *m, int dst_seq, int src_seq, int n_positions)
    void ig_model_profile(ig_model *m, int64_t *ns_per_instr)
    const char *ig_model_error(const ig_model *m)
    int64_t ig_model_bytes(const ig_model *m)
    size_t ig_instr_size()
    uint16_t ig_f32_to_f16(float f)
    float ig_f16_to_f32(uint16_t h)


class KernelSelectionError(CoreError):
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
    """Every kernel table compiled in: name, required features, eligibility on this CPU, priority,
    and `portable`: the matmuls for which it has no version of its own (it runs the plain C twin)."""
    out = []
    cdef const ig_kernel_table *t
    cdef const ig_kernel_table *g = ig_kernel_table_find(b"generic")
    for i in range(ig_kernel_table_count()):
        t = ig_kernel_table_at(i)
        missing = _feature_names(t.requires & ~ig_cpu_features())
        portable = ["matmul_" + ig_packing_name(p).decode() for p in range(IG_PACK_COUNT)
                    if <void *>t.fns.wformat[p].matmul == <void *>g.fns.wformat[p].matmul]
        out.append({"name": t.name.decode(), "requires": _feature_names(t.requires),
                    "eligible": bool(ig_kernel_table_eligible(t)), "missing": missing,
                    "priority": t.priority, "portable": portable})
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
    """CPUs this process may run on (its affinity mask); ignis.runtime.cpus also reads the
    cgroup CPU quota."""
    return ig_max_threads()


def pool_stats() -> dict:
    """The worker pool's counters (csrc/threads.h ig_pool_stats): jobs run on several threads, jobs
    run on fewer because a worker lagged, late joins, backoffs (of them failed_probes: soon after
    the full count came back, and of those slow_probes: its steps were not faster than the steps
    on fewer threads), windows of jobs that backed off because a worker kept entering jobs on the
    caller's CPU (shared_windows), the current backoff's length in jobs (backoff_jobs), workers started, threads a job would get now,
    worker entries into jobs, jobs a worker found closed (missed), worker sleeps; with
    IGNIS_POOL_TRACE=1 set before the pool started (traced), the caller's own share, its wait for
    the workers and the workers' lag from publication to entry, in ns summed over jobs."""
    cdef ig_pool_stats st
    with nogil:
        ig_pool_get_stats(&st)
    return {"jobs": st.jobs, "reduced_jobs": st.reduced_jobs, "late_joins": st.late_joins,
            "backoffs": st.backoffs, "failed_probes": st.failed_probes,
            "slow_probes": st.slow_probes, "shared_windows": st.shared_windows,
            "backoff_jobs": st.backoff_jobs,
            "workers": st.workers, "threads_now": st.threads_now, "traced": st.traced,
            "entered": st.entered, "missed": st.missed, "sleeps": st.sleeps, "own_ns": st.own_ns,
            "wait_ns": st.wait_ns, "lag_ns": st.lag_ns}


cdef const ig_kernel_table *_table_for(kernels) except NULL:
    return _active if kernels is None else _lookup(kernels)


# ---- thin kernel entry points (used by tests and by Python-side checks) -------------------------

cdef void _check_threads(int threads) except *:
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")


def rmsnorm(float[:, ::1] out, const float[:, ::1] x, w=None, *, float eps, int threads=1,
            kernels=None) -> None:
    """out = x / sqrt(mean(x^2) + eps) (* w) per row, by one kernel table's rmsnorm (out may be x)."""
    import numpy as np
    cdef int T = <int>x.shape[0], dim = <int>x.shape[1]
    if out.shape[0] != T or out.shape[1] != dim:
        raise ValueError(f"rmsnorm: out {tuple(out.shape)} and x {tuple(x.shape)} do not agree")
    if w is not None and (not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 1
                          or w.shape[0] != dim or not w.flags.c_contiguous):
        raise ValueError(f"rmsnorm: w must be a C-contiguous float32 array of {dim} elements")
    _check_threads(threads)
    cdef const ig_kernel_table *t = _table_for(kernels)
    cdef const float *pw = <const float *><uintptr_t>w.__array_interface__["data"][0] \
        if w is not None else NULL
    if T == 0 or dim == 0:
        return
    with nogil:
        ig_call_rmsnorm(&t.fns, &out[0, 0], &x[0, 0], pw, T, dim, eps, threads)


def rope(float[:, ::1] out, const float[:, ::1] x, const int32_t[::1] pos, *, int n_heads,
         int head_dim, float theta, inv_freq=None, int threads=1, kernels=None) -> None:
    """NEOX rotary embedding of the first n_heads*head_dim columns of each row of x into out (out
    may be x), rows at positions pos, by one kernel table's rope; inv_freq: the head_dim/2 inverse
    frequencies (f32), or None for theta^(-2j/d)."""
    cdef int T = <int>x.shape[0]
    cdef const float[::1] table
    cdef const float *tp = NULL
    if inv_freq is not None:
        table = inv_freq
        if table.shape[0] != head_dim // 2:
            raise ValueError(f"rope: inv_freq has {table.shape[0]} entries, head_dim {head_dim} "
                             f"needs {head_dim // 2}")
        tp = &table[0] if table.shape[0] else NULL
    if out.shape[0] != T or pos.shape[0] != T:
        raise ValueError(f"rope: out has {out.shape[0]} rows, x {T}, pos {pos.shape[0]}")
    if n_heads < 1 or head_dim < 2 or head_dim % 2 or head_dim > IG_MAX_HEAD_DIM:
        raise ValueError(f"rope: n_heads must be >= 1 and head_dim even in 2..{IG_MAX_HEAD_DIM}, "
                         f"got {n_heads}, {head_dim}")
    if x.shape[1] < n_heads * head_dim or out.shape[1] < n_heads * head_dim:
        raise ValueError(f"rope: rows of {x.shape[1]} (x) and {out.shape[1]} (out) columns hold no "
                         f"{n_heads} heads of {head_dim}")
    _check_threads(threads)
    cdef const ig_kernel_table *t = _table_for(kernels)
    if T == 0:
        return
    with nogil:
        ig_call_rope(&t.fns, &out[0, 0], out.shape[1], &x[0, 0], x.shape[1], &pos[0], tp, T, n_heads,
                       head_dim, theta, threads)


_ELTWISE = {"add": IG_EW_ADD, "mul": IG_EW_MUL, "silu": IG_EW_SILU, "swiglu": IG_EW_SWIGLU,
            "scale": IG_EW_SCALE, "geglu": IG_EW_GEGLU}


def eltwise(str op, float[:, ::1] out, const float[:, ::1] x, y=None, *, int threads=1,
            kernels=None) -> None:
    """out = op(x, y) elementwise by one kernel table's kernel: "add", "mul", "swiglu" (silu(x) * y),
    "geglu" (gelu_tanh(x) * y) with y like x; "silu" without y; "scale" (x * y, y of one row's length, broadcast over rows).
    out may be x or y."""
    import numpy as np
    if op not in _ELTWISE:
        raise ValueError(f"eltwise: op must be one of {', '.join(_ELTWISE)}, got {op!r}")
    cdef int T = <int>x.shape[0], dim = <int>x.shape[1]
    if out.shape[0] != T or out.shape[1] != dim:
        raise ValueError(f"eltwise: out {tuple(out.shape)} and x {tuple(x.shape)} do not agree")
    want = None
    if op == "scale":
        want = (x.shape[1],)
    elif op != "silu":
        want = (x.shape[0], x.shape[1])
    if want is None and y is not None:
        raise ValueError("eltwise: silu takes no y")
    if want is not None and (not isinstance(y, np.ndarray) or y.dtype != np.float32
                             or tuple(y.shape) != want or not y.flags.c_contiguous):
        raise ValueError(f"eltwise: {op} needs y, a C-contiguous float32 array of shape {want}")
    _check_threads(threads)
    cdef const ig_kernel_table *t = _table_for(kernels)
    cdef const float *py = <const float *><uintptr_t>y.__array_interface__["data"][0] \
        if y is not None else NULL
    cdef int code = _ELTWISE[op]
    if T == 0 or dim == 0:
        return
    with nogil:
        ig_call_eltwise(&t.fns, &out[0, 0], &x[0, 0], py, code, T, dim, threads)


def f32_to_f16(const float[::1] x, uint16_t[::1] out) -> None:
    """IEEE half bits of x (the KV cache's f16 storage conversion), round to nearest even."""
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"f32_to_f16: length mismatch {x.shape[0]} vs {out.shape[0]}")
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            out[i] = ig_f32_to_f16(x[i])


def f16_to_f32(const uint16_t[::1] h, float[::1] out) -> None:
    """IEEE half bits widened to f32 (exact)."""
    if out.shape[0] != h.shape[0]:
        raise ValueError(f"f16_to_f32: length mismatch {h.shape[0]} vs {out.shape[0]}")
    cdef Py_ssize_t i
    with nogil:
        for i in range(h.shape[0]):
            out[i] = ig_f16_to_f32(h[i])


def mask_logits(double[::1] logits, const uint32_t[::1] words, Py_ssize_t n) -> int:
    """Set logits[i] to -inf for every i < n whose bit (i % 32 of words[i // 32]) is 0; returns
    how many stay allowed. One pass over a grammar's token bitmask (llguidance's layout)."""
    if n < 0 or n > logits.shape[0] or (n + 31) // 32 > words.shape[0]:
        raise ValueError(f"mask_logits: {n} ids need {(n + 31) // 32} words and as many logits; "
                         f"got {words.shape[0]} words, {logits.shape[0]} logits")
    cdef Py_ssize_t w, i, end, kept = 0
    cdef uint32_t bits
    cdef double neg = -float("inf")
    with nogil:
        for w in range((n + 31) // 32):
            bits = words[w]
            end = min(32 * w + 32, n)
            if bits == 0:                   # most words: all out (after a key) or all in
                for i in range(32 * w, end):
                    logits[i] = neg
            elif bits == 0xFFFFFFFFu and end == 32 * w + 32:
                kept += 32
            else:
                for i in range(32 * w, end):
                    if (bits >> (i - 32 * w)) & 1:
                        kept += 1
                    else:
                        logits[i] = neg
    return kept


def packing_ids() -> dict:
    """The packings the matmul kernels read (csrc/ignis.h IG_PACK_*): name -> id, "f32" -> 0, ...
    ignis.formats' Packing.c_id holds the same ids."""
    return {ig_packing_name(p).decode(): p for p in range(IG_PACK_COUNT)}


def packed_bytes(int packing, long long N, long long K, int layout=0) -> int:
    """Bytes of an [N, K] matrix in a packing (IG_PACK_*; layout: an x16 matrix's IG_WX_*), by the C
    size macros; -1 for an unknown packing or layout, or K not a multiple of its block."""
    return ig_packed_bytes(packing, N, K, layout)


cdef str _check_packed(a, int packing, int layout, long long n, long long k):
    """Why array a is not an [n, k] matrix in the packing, or "" when it is: the C size macro
    gives its bytes, ignis.formats the element type (a 1-D array of them, or the [n, k] matrix
    where an element is a weight)."""
    import numpy as np
    from ignis.formats import PACKINGS
    nbytes = ig_packed_bytes(packing, n, k, layout)
    if packing not in PACKINGS or nbytes < 0:
        block = ig_packed_block(packing, layout)
        return (f"packing {packing} (layout {layout}) with K={k}: " +
                (f"K is not a multiple of {block}" if block else "no such packing or layout"))
    dtype = PACKINGS[packing].dtype
    shapes = {(nbytes // dtype.itemsize,), (n, k)} if nbytes == n * k * dtype.itemsize \
        else {(nbytes // dtype.itemsize,)}
    if (not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous
            or tuple(a.shape) not in shapes):
        got = (f"{a.dtype} {list(a.shape)}{'' if a.flags.c_contiguous else ' not C-contiguous'}"
               if isinstance(a, np.ndarray) else type(a).__name__)
        return (f"expected the [{n}, {k}] matrix in packing {PACKINGS[packing].name} "
                f"(id {packing}{f', layout {layout}' if layout else ''}): a C-contiguous {dtype} array "
                f"of shape {' or '.join(str(list(sh)) for sh in sorted(shapes))} ({nbytes} bytes), "
                f"got {got}")
    return ""


cdef void _matmul(const ig_kernel_table *t, float[:, ::1] out, const float[:, ::1] x, int packing,
                  w, int layout, w2, int layout2, int threads) except *:
    """One matmul as the executor runs it: the packing's kernel table entry says which activations
    it reads (x quantized first, into scratch arrays here) and which function runs it."""
    import numpy as np
    cdef int T = <int>x.shape[0], K = <int>x.shape[1], N = <int>out.shape[1]
    if out.shape[0] != T or T < 1 or N < 1 or K < 1:
        raise ValueError(f"matmul: out {tuple(out.shape)} and x {tuple(x.shape)} do not agree")
    _check_threads(threads)
    if not 0 <= packing < IG_PACK_COUNT:
        raise ValueError(f"matmul: no packing {packing}; known: {packing_ids()}")
    for name, arr, lay in (("w", w, layout), ("w2", w2, layout2)):
        why = _check_packed(arr, packing, lay, N, K) if arr is not None or name == "w" else ""
        if why:
            raise ValueError(f"matmul: {name}: {why}")
    cdef const ig_wformat *f = &t.fns.wformat[packing]
    cdef ig_matmul_args a
    a.out = &out[0, 0]
    a.x = &x[0, 0]
    a.xsum = NULL
    a.w = <const void *><uintptr_t>w.__array_interface__["data"][0]
    a.w2 = <const void *><uintptr_t>(w2.__array_interface__["data"][0] if w2 is not None else 0)
    a.bias = NULL
    a.res = NULL
    a.gate = NULL
    a.ldo, a.ldx, a.ldr = N, K, N
    a.T, a.N, a.K = T, N, K
    a.layout, a.layout2 = layout, layout2 if w2 is not None else 0
    xq = xs = None
    if f.act == IG_ACT_Q8:
        xq = np.empty(T * (K // 32) * 36, np.uint8)
        a.x = <const void *><uintptr_t>xq.__array_interface__["data"][0]
    elif f.act == IG_ACT_X16:
        xq = np.empty(T * (K // 32) * sizeof(ig_block_x16), np.uint8)
        xs = np.empty(T * (K // 32), np.float32)
        a.x = <const void *><uintptr_t>xq.__array_interface__["data"][0]
        a.xsum = <const float *><uintptr_t>xs.__array_interface__["data"][0]
    with nogil:
        if f.act == IG_ACT_Q8:
            t.fns.quantize_q8_rows(<ig_block_q8 *>a.x, &x[0, 0], K, T, K)
        elif f.act == IG_ACT_X16:
            t.fns.quantize_x16_rows(<ig_block_x16 *>a.x, <float *>a.xsum, &x[0, 0], K, T, K)
        ig_call_matmul(f, &a, threads)


def matmul(float[:, ::1] out, const float[:, ::1] x, w, *, str fmt="f32", w2=None, int layout=0,
           int layout2=0, int threads=1, kernels=None) -> None:
    """out[t, n] = dot(x[t], w[n]) with one kernel table's matmul for the packing named fmt
    (packing_ids(): "f32", "bf16", "q8", "q4", "x16"), through the same table entry and argument
    struct as the executor: x is quantized first when the packing reads blocks. w2: the SwiGLU
    epilogue silu(x.w) * (x.w2). w (and w2) as ignis.formats packs them: "f32" float32 [N, K],
    "bf16" uint16 bits [N, K], "q8"/"q4" the packed bytes (formats.quant.pack_q8 / pack_q4),
    "x16" the bytes of a GGUF block layout `layout` (formats.gguf_blocks; layout2 for w2). For
    tests and kernel benchmarks."""
    ids = packing_ids()
    if fmt not in ids:
        raise ValueError(f"fmt must be one of {', '.join(ids)}; got {fmt!r}")
    _matmul(_table_for(kernels), out, x, ids[fmt], w, layout, w2, layout2, threads)


def quantize_rows(const float[:, ::1] x, *, kernels=None):
    """[T, K] activations quantized per block of 32 as the executor does before a q8/q4 matmul,
    by one kernel table's function: a uint8 array of T*K/32 36-byte ig_block_q8 records (view it
    with ignis.formats.quant.Q8_BLOCK)."""
    import numpy as np
    cdef int T = <int>x.shape[0], K = <int>x.shape[1]
    if T < 1 or K < 32 or K % 32:
        raise ValueError(f"quantize_rows: x must be [T, K] with K a positive multiple of 32, got "
                         f"{(x.shape[0], x.shape[1])}")
    cdef const ig_kernel_table *t = _table_for(kernels)
    out = np.empty(T * (K // 32) * 36, np.uint8)
    cdef uintptr_t p = out.__array_interface__["data"][0]
    with nogil:
        t.fns.quantize_q8_rows(<ig_block_q8 *>p, &x[0, 0], K, T, K)
    return out


def matmul_x16(float[:, ::1] out, const float[:, ::1] x, layout, *, layout2=None, int threads=1,
               kernels=None) -> None:
    """matmul(fmt="x16") given ignis.formats.gguf_blocks.Layout records (layout2: the SwiGLU up
    projection's): their .fmt and .packed."""
    from ignis.formats.gguf_blocks import Layout
    for name, lay in (("layout", layout), ("layout2", layout2)):
        if lay is not None and not isinstance(lay, Layout):
            raise ValueError(f"matmul_x16: {name} must be a gguf_blocks.Layout, got "
                             f"{type(lay).__name__}")
    matmul(out, x, layout.packed, fmt="x16", layout=layout.fmt,
           w2=layout2.packed if layout2 is not None else None,
           layout2=layout2.fmt if layout2 is not None else 0, threads=threads, kernels=kernels)


def quantize_x16_rows(const float[:, ::1] x, *, kernels=None):
    """[T, K] activations as the executor quantizes them before an x16 matmul, by one kernel
    table's function: (blocks, sums), a
    uint8 array of T*K/32 76-byte ig_block_x16 records (view it with
    ignis.formats.gguf_blocks.X16_BLOCK) and the float32 [T, K/32] block sums."""
    import numpy as np
    cdef int T = <int>x.shape[0], K = <int>x.shape[1]
    if T < 1 or K < 32 or K % 32:
        raise ValueError(f"quantize_x16_rows: x must be [T, K] with K a positive multiple of 32, "
                         f"got {(x.shape[0], x.shape[1])}")
    cdef const ig_kernel_table *t = _table_for(kernels)
    out = np.empty(T * (K // 32) * sizeof(ig_block_x16), np.uint8)
    sums = np.empty((T, K // 32), np.float32)
    cdef uintptr_t p = out.__array_interface__["data"][0]
    cdef float[:, ::1] s = sums
    with nogil:
        t.fns.quantize_x16_rows(<ig_block_x16 *>p, &s[0, 0], &x[0, 0], K, T, K)
    return out, sums


# ---- the executor ----------------------------------------------------------------------------

def op_table() -> dict:
    """The C executor's op table (csrc/ops.def): name -> (opcode, n_args, w_min, w_max), the
    activation operands and the range of weights check_instr allows. Tests hold it against
    ignis.ir.ops.OPS."""
    out = {}
    cdef const ig_op_info *op
    for code in range(1, IG_OP_COUNT):
        op = ig_op_info_of(code)
        out[op.name.decode()] = (op.opcode, op.n_args, op.w_min, op.w_max)
    return out


_STATUS = {1: "argument out of range", 2: "unsupported", 3: "out of memory", 4: "malformed tape"}

# The C struct ig_instr, field by field: a tape record layout that drifts from it is refused.
_INSTR_FIELDS = (("opcode", 0), ("n_args", 4), ("n_weights", 8), ("out_space", 16), ("out_rows", 20),
                 ("out_where", 24), ("out_cols", 32), ("arg_space", 40), ("arg_rows", 56),
                 ("arg_where", 72), ("arg_cols", 104), ("weight", 136), ("ints", 168),
                 ("floats", 216), ("scratch_bytes", 232))


cdef uintptr_t _address(a) except 0:
    cdef uintptr_t p = <uintptr_t>a.__array_interface__["data"][0]
    if p == 0:
        raise ValueError("an array without memory (size 0?) cannot be bound to the executor")
    return p


def _core_error(str message, int instr=-1, str op="", str node=""):
    from ignis.errors import CoreError
    e = CoreError(message)
    e.instruction, e.op, e.node = instr, op, node
    return e


cdef class Executor:
    """A lowered tape handed to C once: weights resolved to pointers, arena, scratch and KV cache
    allocated in one block. `bind` fixes the input/output buffers; `step` runs the tape (nogil).

    weights are f32 arrays in Tape.weights order; packed optionally gives, per weight, the form the
    matmuls read instead: None (its f32 rows) or (packing id, layout, array), the array as
    ignis.formats packs it (Packing.c_id; layout: an x16 matrix's IG_WX_*, else 0). The f32
    weights stay what gathers and biases read. kv_dtype is "f32" or "f16".
    n_seq KV slots hold independent sequences; a step's rows say which slot each belongs to (the
    `seq` buffer given to bind), so one pass over the weights serves several sequences.
    Low level: ignis.runtime.Engine builds one from a compiled model and owns the buffers."""
    cdef ig_model *_m
    cdef const void **_in
    cdef float **_out
    cdef const int32_t *_seq
    cdef int _n_in, _n_out
    cdef object _keep            # weights, records: alive as long as C points at them
    cdef object _bound
    cdef object _profile          # the int64 array ig_model_profile adds into, or None
    cdef list _names             # (op, node name) per instruction, for error messages
    cdef object _out_shape       # per output: (row code: >= 0, -1 for T, -2 for R; columns)
    cdef object _ndarray         # numpy.ndarray, for step_into's check
    cdef readonly int max_batch_tokens, max_rows, n_ctx, n_seq

    def __cinit__(self, records, weights, *, int max_batch_tokens, int max_rows, int n_ctx,
                  int n_inputs, int n_outputs, long long arena_bytes, long long scratch_bytes,
                  kv_widths, names, kernels=None, str kv_dtype="f32", packed=None, int n_seq=1):
        import numpy as np
        cdef const ig_kernel_table *t = _table_for(kernels)
        if records.dtype.itemsize != <long long>ig_instr_size():
            raise ValueError(f"tape records are {records.dtype.itemsize} bytes wide, the C executor "
                             f"expects {ig_instr_size()}: rebuild ignis._core")
        for name, off in _INSTR_FIELDS:
            if records.dtype.fields[name][1] != off:
                raise ValueError(f"tape record field {name!r} at byte {records.dtype.fields[name][1]}, "
                                 f"the C struct has it at {off}: rebuild ignis._core")
        records = np.ascontiguousarray(records)
        n_w = len(weights)
        ws = []
        for i, w in enumerate(weights):
            if not isinstance(w, np.ndarray) or w.dtype != np.float32 or not w.flags.c_contiguous:
                raise TypeError(f"weight {i} must be a C-contiguous float32 ndarray")
            ws.append(w)
        rows = np.array([w.shape[0] if w.ndim else 1 for w in ws] or [0], np.int64)
        elems = np.array([w.size for w in ws] or [0], np.int64)
        kvw = np.ascontiguousarray(np.asarray(list(kv_widths) or [0], np.int32))
        forms = list(packed) if packed is not None else [None] * n_w
        if len(forms) != n_w:
            raise ValueError(f"packed has {len(forms)} entries for {n_w} weights")
        arrays = []
        for i, form in enumerate(forms):
            if form is None:
                continue
            if not isinstance(form, tuple) or len(form) != 3:
                raise TypeError(f"packed[{i}] must be None or (packing id, layout, array), got "
                                f"{type(form).__name__}")
            pk, lay, arr = form
            n = ws[i].shape[0] if ws[i].ndim == 2 else 0
            k = ws[i].shape[1] if ws[i].ndim == 2 else 0
            if (not isinstance(pk, (int, np.integer)) or not 0 < pk < IG_PACK_COUNT
                    or not isinstance(lay, (int, np.integer))):
                why = (f"packing {pk!r}, layout {lay!r}: expected integers, the packing one of "
                       f"1..{IG_PACK_COUNT - 1} ({packing_ids()}; f32 is None)")
            elif not n:
                why = f"weight {i} is not a matrix (shape {list(ws[i].shape)}): only matmuls read packings"
            else:
                why = _check_packed(arr, pk, lay, n, k)
            if why:
                raise TypeError(f"packed[{i}] (weight {i}): {why}")
            arrays.append(arr)
        cdef const float **wp = <const float **>calloc(max(n_w, 1), sizeof(float *))
        cdef ig_packed_weight *pp = <ig_packed_weight *>calloc(max(n_w, 1), sizeof(ig_packed_weight))
        if wp == NULL or pp == NULL:
            free(wp)
            free(pp)
            raise MemoryError()
        for i, w in enumerate(ws):
            wp[i] = <const float *><uintptr_t>(w.__array_interface__["data"][0])
            if forms[i] is not None:
                pp[i].packing = int(forms[i][0])
                pp[i].layout = int(forms[i][1])
                pp[i].w = <const void *><uintptr_t>(forms[i][2].__array_interface__["data"][0])
        cdef ig_model_desc d
        d.instrs = <const ig_instr *><uintptr_t>(records.__array_interface__["data"][0]) \
            if len(records) else NULL
        d.n_instrs = <int>len(records)
        d.weights = wp
        d.packed = pp
        d.weight_rows = <const int64_t *><uintptr_t>rows.__array_interface__["data"][0]
        d.weight_elems = <const int64_t *><uintptr_t>elems.__array_interface__["data"][0]
        d.n_weights = n_w
        d.n_inputs, d.n_outputs = n_inputs, n_outputs
        d.arena_bytes, d.scratch_bytes = arena_bytes, scratch_bytes
        d.max_T, d.max_R, d.max_ctx = max_batch_tokens, max_rows, n_ctx
        d.n_seq = n_seq
        d.kv_widths = <const int32_t *><uintptr_t>kvw.__array_interface__["data"][0]
        d.n_kv_layers = <int>len(list(kv_widths))
        if kv_dtype not in ("f32", "f16"):
            raise ValueError(f"kv_dtype must be 'f32' or 'f16', got {kv_dtype!r}")
        d.kv_f16 = kv_dtype == "f16"
        d.kernels = t
        cdef char err[512]
        err[0] = 0
        cdef int status
        with nogil:
            status = ig_model_create(&self._m, &d, err, sizeof(err))
        free(wp)
        free(pp)
        self._names = list(names)
        if status != 0:
            msg = err.decode(errors="replace")
            import re
            m = re.match(r"instruction (\d+)", msg)
            i = int(m.group(1)) if m else -1
            op, node = self._names[i] if 0 <= i < len(self._names) else ("", "")
            where = f" ({op} {node!r})" if op else ""
            raise _core_error(f"the executor refused the tape{where}: {msg} "
                              f"[{_STATUS.get(status, status)}]", i, op, node)
        self._n_in, self._n_out = n_inputs, n_outputs
        self._in = <const void **>calloc(max(n_inputs, 1), sizeof(void *))
        self._out = <float **>calloc(max(n_outputs, 1), sizeof(float *))
        if self._in == NULL or self._out == NULL:
            raise MemoryError()
        self._keep = (records, ws, arrays)
        self._ndarray = np.ndarray
        self._out_shape = [(0, 0)] * n_outputs
        for r in records[records["out_space"] == 2]:          # IG_SPACE_OUTPUT
            self._out_shape[int(r["out_where"])] = (int(r["out_rows"]), int(r["out_cols"]))
        self.max_batch_tokens, self.max_rows, self.n_ctx = max_batch_tokens, max_rows, n_ctx
        self.n_seq = n_seq

    def __dealloc__(self):
        if self._m != NULL:
            ig_model_free(self._m)
        free(self._in)
        free(self._out)

    @property
    def nbytes(self) -> int:
        """Bytes of the one block: arena, scratch and KV cache."""
        return ig_model_bytes(self._m)

    def bind(self, inputs, outputs, seq=None) -> None:
        """Point the tape's inputs and outputs at these C-contiguous arrays (kept alive here).
        They must be large enough for the compiled bounds; the caller fills them in place.
        seq: an int32 array of max_batch_tokens entries, each row's KV slot (read by
        step(with_seq=True))."""
        if len(inputs) != self._n_in or len(outputs) != self._n_out:
            raise ValueError(f"the tape takes {self._n_in} inputs and {self._n_out} outputs, got "
                             f"{len(inputs)} and {len(outputs)}")
        for i, a in enumerate(inputs):
            if not a.flags.c_contiguous or a.dtype.itemsize != 4:
                raise ValueError(f"input {i} must be a C-contiguous 4-byte array")
            self._in[i] = <const void *>_address(a)
        for i, a in enumerate(outputs):
            if not a.flags.c_contiguous or not a.flags.writeable or a.dtype.str != "<f4":
                raise ValueError(f"output {i} must be a writable C-contiguous float32 array")
            self._out[i] = <float *>_address(a)
        self._seq = NULL
        if seq is not None:
            if not seq.flags.c_contiguous or seq.dtype.str != "<i4" or seq.size < self.max_batch_tokens:
                raise ValueError(f"seq must be a C-contiguous int32 array of at least "
                                 f"{self.max_batch_tokens} entries")
            self._seq = <const int32_t *>_address(seq)
        self._bound = (list(inputs), list(outputs), seq)

    def step(self, int T, int R, int threads=1, bint with_seq=False) -> None:
        """Run the whole tape once for T tokens and R logit rows (with_seq: rows go to the KV slots
        in the bound seq buffer, else all to slot 0); raises CoreError naming the failing
        instruction."""
        if self._bound is None:
            raise RuntimeError("bind() the input and output buffers before step()")
        if with_seq and self._seq == NULL:
            raise RuntimeError("step(with_seq=True) needs a seq buffer given to bind()")
        cdef const int32_t *seq = self._seq if with_seq else NULL
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._run(T, R, threads, seq, self._out)

    def step_into(self, out, int T, int R, int threads=1, bint with_seq=False) -> None:
        """step(), the tape's one output written into `out` instead of the bound array: a
        writable C-contiguous float32 [rows, columns] array with at least the rows this step
        writes (T or R, as the tape's output counts them). A caller that hands each step's result
        out keeps it as it is, without a copy."""
        if self._bound is None:
            raise RuntimeError("bind() the input and output buffers before step_into()")
        if self._n_out != 1:
            raise ValueError(f"step_into writes one output; this tape has {self._n_out}")
        if with_seq and self._seq == NULL:
            raise RuntimeError("step(with_seq=True) needs a seq buffer given to bind()")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        code, cols = self._out_shape[0]
        rows = T if code == -1 else R if code == -2 else code
        if (not isinstance(out, self._ndarray) or out.ndim != 2 or out.dtype.str != "<f4"
                or not out.flags.c_contiguous or not out.flags.writeable
                or out.shape[1] != cols or out.shape[0] < rows):
            raise ValueError(f"step_into: out must be a writable C-contiguous float32 array of "
                             f"[>= {rows}, {cols}], got {type(out).__name__} "
                             f"{getattr(out, 'dtype', '')}{list(getattr(out, 'shape', []))}")
        cdef float *dst[1]
        dst[0] = <float *><uintptr_t>out.__array_interface__["data"][0]
        self._run(T, R, threads, self._seq if with_seq else NULL, dst)

    cdef _run(self, int T, int R, int threads, const int32_t *seq, float **outs):
        cdef int failed = -1, status
        with nogil:
            status = ig_model_step(self._m, self._in, outs, T, R, seq, threads, &failed)
        if status != 0:
            msg = ig_model_error(self._m).decode(errors="replace")
            op, node = self._names[failed] if 0 <= failed < len(self._names) else ("", "")
            where = f"instruction {failed} ({op} {node!r}): " if failed >= 0 else ""
            raise _core_error(f"{where}{msg} [{_STATUS.get(status, status)}]", failed, op, node)


    @property
    def instructions(self) -> list:
        """(op, node name) of each tape instruction, in order (what profile's entries are)."""
        return list(self._names)

    def profile(self, ns=None) -> None:
        """Profile the steps: every step adds each instruction's wall time in ns (its kernels and
        its threads' join) to ns, a writable C-contiguous int64 array of one entry per tape
        instruction (kept here); None stops."""
        if ns is None:
            ig_model_profile(self._m, NULL)
            self._profile = None
            return
        if (ns.dtype.str != "<i8" or not ns.flags.c_contiguous or not ns.flags.writeable
                or ns.ndim != 1 or ns.size != len(self._names)):
            raise ValueError(f"profile needs a writable C-contiguous int64 array of {len(self._names)} "
                             f"entries (one per tape instruction)")
        self._profile = ns
        ig_model_profile(self._m, <int64_t *>_address(ns))

    def kv_copy(self, int dst, int src, int n) -> None:
        """Copy the keys and values of positions 0..n-1 of KV slot src into slot dst (every
        layer); raises CoreError for a slot outside 0..n_seq-1 or n outside 0..n_ctx."""
        cdef int status
        with nogil:
            status = ig_model_kv_copy(self._m, dst, src, n)
        if status != 0:
            msg = ig_model_error(self._m).decode(errors="replace")
            raise _core_error(f"{msg} [{_STATUS.get(status, status)}]")

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
