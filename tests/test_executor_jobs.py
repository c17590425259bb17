"""The executor's decode jobs (csrc/dispatch.c ig_call_matmuls): a decode step's q, k and v
projections run as one job over their concatenated rows, and a SwiGLU pair's two passes as one job,
each piece of rows a kernel call on those rows alone. Every row must keep the bits the kernel gives
it when called on the whole matrix (ig_call_matmul, what _core.matmul runs), for every packing,
every eligible kernel table and 1 or 2 threads, with row counts that leave partial pieces."""
import numpy as np
import pytest

from ignis import _core
from ignis.formats.bf16 import f32_to_bf16
from ignis.formats.quant import pack_q4, pack_q8, quantize_q4, quantize_q8
from ignis.ir.graph import GraphBuilder
from ignis.ir.types import TensorType
from ignis.plan.arena import plan_memory
from ignis.plan.tape import lower

from test_kernels import _x16_layout

TABLES = [t["name"] for t in _core.kernel_tables() if t["eligible"]]
IDS = _core.packing_ids()
CTX = 16


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _pack(fmt, w, rng):
    """(packed entry for the executor, kwargs of _core.matmul) of the f32 matrix w in `fmt`
    ("x16:Q5_0" for a GGUF block layout of random blocks of that shape)."""
    if fmt == "f32":
        return None, dict(w=w, fmt="f32")          # f32: no packed entry
    if fmt == "bf16":
        b = f32_to_bf16(w)
        return (IDS["bf16"], 0, b), dict(w=b, fmt="bf16")
    if fmt == "q8":
        p = pack_q8(quantize_q8(w))
        return (IDS["q8"], 0, p), dict(w=p, fmt="q8")
    if fmt == "q4":
        p = pack_q4(quantize_q4(w))
        return (IDS["q4"], 0, p), dict(w=p, fmt="q4")
    lay = _x16_layout(rng, fmt.split(":")[1], *w.shape)
    return (IDS["x16"], lay.fmt, lay.packed), dict(w=lay.packed, fmt="x16", layout=lay.fmt)


def _executor(g, weights, packed, table):
    tape = lower(g, plan_memory(g, {"T": 1, "R": 1}, n_ctx=CTX))
    ex = _core.Executor(tape.to_records(), [weights[n] for n in tape.weights], max_batch_tokens=1,
                        max_rows=1, n_ctx=CTX, n_inputs=len(tape.inputs), n_outputs=1,
                        arena_bytes=tape.arena_bytes, scratch_bytes=tape.scratch_bytes, kv_widths=[],
                        names=[(i.op, i.name) for i in tape.instrs], kernels=table,
                        packed=[packed.get(n) for n in tape.weights])
    return ex, tape


def _alone(x, kw, N, table):
    out = np.full((1, N), np.nan, np.float32)
    _core.matmul(out, x, threads=1, kernels=table, **kw)
    return out


# (formats of Wq, Wk, Wv): one packing (the one-job path), GGUF files' mixed layouts of one
# packing (Qwen2.5's Q5_0 q/k with a Q8_0 v), and different packings (three jobs, as before)
QKV_FORMATS = [("f32",) * 3, ("bf16",) * 3, ("q8",) * 3, ("q4",) * 3, ("x16:Q5_0",) * 3,
               ("x16:Q5_0", "x16:Q5_0", "x16:Q8_0"), ("x16:Q4_K", "x16:Q6_K", "x16:Q5_0"),
               ("q8", "q8", "f32")]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("fmts", QKV_FORMATS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("heads", [(6, 2, 22), (14, 2, 64)])
def test_decode_qkv_rows_are_the_bits_of_each_projection_alone(table, fmts, heads):
    nh, nkv, hd = heads
    K = 256
    qd, kd = nh * hd, nkv * hd
    rng = np.random.default_rng(qd + kd + len(fmts[0]) + len(fmts[2]))
    x = rng.standard_normal((1, K)).astype(np.float32)
    ws = {"wq": rng.standard_normal((qd, K)).astype(np.float32) * 0.1,
          "wk": rng.standard_normal((kd, K)).astype(np.float32) * 0.1,
          "wv": rng.standard_normal((kd, K)).astype(np.float32) * 0.1}
    bs = {"bq": rng.standard_normal(qd).astype(np.float32),
          "bk": rng.standard_normal(kd).astype(np.float32),
          "bv": rng.standard_normal(kd).astype(np.float32)}
    b = GraphBuilder("one.qkv")
    xin = b.input("x", TensorType(("T", K), "f32"))
    wv = [b.weight(n, TensorType(a.shape, "f32")) for n, a in {**ws, **bs}.items()]
    b.output("y", b.op("linear_qkv", xin, *wv, name="qkv", n_heads=nh, n_kv_heads=nkv,
                       head_dim=hd))
    g = b.finish()
    packed, want = {}, []
    for (n, w), bn, fmt in zip(ws.items(), bs, fmts):
        packed[n], kw = _pack(fmt, w, rng)
        # the kernel's epilogue adds the bias in f32, as NumPy's float32 addition does
        want.append(_alone(x, kw, w.shape[0], table) + bs[bn])
    want = np.concatenate(want, axis=1)
    ex, tape = _executor(g, {**ws, **bs}, packed, table)
    for threads in (1, 2):
        got = np.full((1, qd + 2 * kd), np.nan, np.float32)
        ex.bind([x], [got])
        ex.step(1, 1, threads)
        assert np.array_equal(_bits(got), _bits(want)), (threads, np.flatnonzero(_bits(got) != _bits(want))[:8])


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("fmt", ["q8", "q4", "bf16", "x16:Q5_0", "x16:Q4_K"])
@pytest.mark.parametrize("N", [70, 4864 // 8])
def test_decode_swiglu_pair_in_one_job_is_the_fused_kernel(table, fmt, N):
    """The gate's pass then the up projection's on each piece of rows: bit for bit the fused
    kernel (w and w2 in one call), whatever the pieces 2 threads take."""
    K = 256
    rng = np.random.default_rng(N + len(fmt))
    x = rng.standard_normal((1, K)).astype(np.float32)
    w, w2 = (rng.standard_normal((N, K)).astype(np.float32) * 0.1 for _ in range(2))
    b = GraphBuilder("one.swiglu")
    xin = b.input("x", TensorType(("T", K), "f32"))
    b.output("y", b.op("linear_swiglu", xin, b.weight("w", TensorType(w.shape, "f32")),
                       b.weight("w2", TensorType(w2.shape, "f32")), name="swiglu"))
    g = b.finish()
    pw, kw = _pack(fmt, w, rng)
    pu, ku = _pack(fmt, w2, rng)
    fused = np.full((1, N), np.nan, np.float32)
    up = {"w2": ku["w"], "layout2": ku.get("layout", 0)}
    _core.matmul(fused, x, threads=1, kernels=table, **kw, **up)
    ex, tape = _executor(g, {"w": w, "w2": w2}, {"w": pw, "w2": pu}, table)
    for threads in (1, 2):
        got = np.full((1, N), np.nan, np.float32)
        ex.bind([x], [got])
        ex.step(1, 1, threads)
        assert np.array_equal(_bits(got), _bits(fused)), threads


def test_step_into_writes_the_step_output_into_the_array_given():
    """Executor.step_into: the same bits as step() into the bound output, written into a caller's
    array (the engine's decode hands it out without a copy); a wrong array is refused by name."""
    K, N = 64, 9
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = GraphBuilder("one.linear")
    xin = b.input("x", TensorType(("T", K), "f32"))
    b.output("y", b.op("linear", xin, b.weight("w", TensorType(w.shape, "f32")), name="lin"))
    ex, tape = _executor(b.finish(), {"w": w}, {}, "generic")
    bound = np.full((1, N), np.nan, np.float32)
    with pytest.raises(RuntimeError, match="bind"):
        ex.step_into(np.empty((1, N), np.float32), 1, 1)
    ex.bind([x], [bound])
    ex.step(1, 1)
    got = np.full((1, N), np.nan, np.float32)
    bound[:] = 7.0
    ex.step_into(got, 1, 1)
    assert np.array_equal(_bits(got), _bits(_alone(x, dict(w=w, fmt="f32"), N, "generic")))
    assert np.all(bound == 7.0)                       # the bound output is left alone
    for bad in (np.empty((1, N + 1), np.float32), np.empty((0, N), np.float32),
                np.empty((1, N), np.float64), np.empty((N, 2), np.float32)[:, :1].T,
                np.empty(N, np.float32), [0.0] * N):
        with pytest.raises(ValueError, match=r"step_into: out must be a writable C-contiguous "
                                             r"float32 array of \[>= 1, 9\]"):
            ex.step_into(bad, 1, 1)
    ro = np.empty((1, N), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        ex.step_into(ro, 1, 1)
