"""The runtime on tiny random models: the C executor against the NumPy interpreter (float64),
bitwise invariants (planner on/off, 1 vs 2 threads, chunking, cache truncation) and input errors."""
from __future__ import annotations

import numpy as np
import pytest

from ignis import _core
from ignis.errors import CoreError
from ignis.formats.q4 import Q4P
from ignis.formats.q8 import Q8P
from ignis.ir import interp
from ignis.loader.resolve import open_model
from ignis.models import build_graph
from ignis.passes.pipeline import OPTIONAL, PIPELINE, run_pipeline, select_passes
from ignis.runtime import ContextOverflowError, Engine, RuntimeInputError, TokenIdError

PROMPT = np.array([256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 257], np.int32)
DECODE = [17, 200, 3]
CTX = 64


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tiny_qwen2_dir, tiny_llama_dir):
    m = open_model(tiny_qwen2_dir if request.param == "qwen2" else tiny_llama_dir)
    yield m
    m.weights.close()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _reference(model, passes=None):
    """Float64 interpreter logits for the prompt (all rows), then each decode token."""
    g = build_graph(model.config)
    if passes is not None:
        g = run_pipeline(g, select_passes(passes)).graph
    cache = interp.KVCache.for_graph(g, CTX)
    out = []
    n = 0
    for ids in [PROMPT] + [np.array([t], np.int32) for t in DECODE]:
        inputs = {"tokens": ids, "pos": np.arange(n, n + ids.size, dtype=np.int32)}
        if "rows" in g.inputs:
            inputs["rows"] = np.arange(ids.size, dtype=np.int32)
        out.append(interp.run(g, model.weights, inputs, cache=cache, dtype=np.float64)["logits"])
        n += ids.size
    return out


def _run(engine: Engine):
    out = [engine.forward(PROMPT, logits_for="all")]
    out += [engine.forward(np.array([t], np.int32)) for t in DECODE]
    return out


def test_logits_match_the_interpreter_for_chunked_prefill_then_decode(tiny):
    want = _reference(tiny)
    # chunks of 4: the 15-token prompt runs as 4+4+4+3, decode as T=1
    got = _run(Engine(tiny, n_ctx=CTX, threads=1, max_batch_tokens=4))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = float(np.abs(g - w).max())
        assert err <= 1e-4, f"max abs err {err:.3e}"


@pytest.mark.parametrize("k", range(1, len(PIPELINE) + 1))
def test_every_pipeline_prefix_runs_and_matches(tiny_qwen2_dir, k):
    """Planned graphs of any pipeline prefix (seed granularity included) and the optional passes."""
    names = [e.name for e in PIPELINE[:k]]
    if k == len(PIPELINE):
        names += [e.name for e in OPTIONAL]
    model = open_model(tiny_qwen2_dir)
    want = _reference(model, names)
    got = _run(Engine(model, n_ctx=CTX, threads=2, max_batch_tokens=8, passes=names))
    for g, w in zip(got, want):
        assert g.shape[1] == w.shape[1]
        err = float(np.abs(g - w[-g.shape[0]:]).max())
        assert err <= 1e-4, f"passes {names}: max abs err {err:.3e}"


def test_planned_and_unplanned_are_bitwise_equal(tiny):
    a = _run(Engine(tiny, n_ctx=CTX, threads=1, max_batch_tokens=8, plan=True))
    b_engine = Engine(tiny, n_ctx=CTX, threads=1, max_batch_tokens=8, plan=False)
    assert not b_engine.options.planned
    b = _run(b_engine)
    for x, y in zip(a, b):
        assert np.array_equal(_bits(x), _bits(y))


def test_one_and_two_threads_are_bitwise_equal(tiny):
    a = _run(Engine(tiny, n_ctx=CTX, threads=1, max_batch_tokens=8))
    b = _run(Engine(tiny, n_ctx=CTX, threads=2, max_batch_tokens=8))
    for x, y in zip(a, b):
        assert np.array_equal(_bits(x), _bits(y))


def test_profile_times_every_instruction_and_changes_no_bit(tiny):
    plain = Engine(tiny, n_ctx=CTX, threads=2, max_batch_tokens=4)
    eng = Engine(tiny, n_ctx=CTX, threads=2, max_batch_tokens=4)
    names = eng._exec.instructions
    assert names and all(isinstance(op, str) and isinstance(node, str) for op, node in names)
    ns = np.zeros(len(names), np.int64)
    eng._exec.profile(ns)
    for x, y in zip(_run(eng), _run(plain)):
        assert np.array_equal(_bits(x), _bits(y))
    assert (ns > 0).all(), [n for n, t in zip(names, ns) if t <= 0]
    eng._exec.profile(None)             # stopped: later steps add nothing
    seen = ns.copy()
    eng.forward(np.array([1], np.int32))
    assert np.array_equal(ns, seen)
    for bad in (np.zeros(len(names) + 1, np.int64), np.zeros(len(names), np.int32),
                np.zeros(len(names), np.int64)[::-1]):
        with pytest.raises(ValueError, match=f"int64 array of {len(names)} entries"):
            eng._exec.profile(bad)


def test_chunk_size_does_not_change_a_bit(tiny):
    """Every row is computed in one fixed order whatever tile or chunk it falls in."""
    a = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=3))
    b = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=32))
    for x, y in zip(a, b):
        assert np.array_equal(_bits(x), _bits(y))


def test_truncate_then_rerun_equals_a_fresh_run(tiny):
    eng = Engine(tiny, n_ctx=CTX, max_batch_tokens=4)
    eng.forward(PROMPT)
    eng.forward(np.array([5, 6, 7], np.int32))
    assert eng.n_past == PROMPT.size + 3
    eng.truncate(8)                                # keep a shared prefix, overwrite the rest
    resumed = eng.forward(PROMPT[8:], logits_for="all")
    fresh_engine = Engine(tiny, n_ctx=CTX, max_batch_tokens=4)
    fresh = fresh_engine.forward(PROMPT, logits_for="all")[8:]
    assert np.array_equal(_bits(resumed), _bits(fresh))
    eng.reset()
    assert eng.n_past == 0
    again = eng.forward(PROMPT, logits_for="all")
    assert np.array_equal(_bits(again), _bits(Engine(tiny, n_ctx=CTX).forward(PROMPT, logits_for="all")))


def test_last_equals_the_last_row_of_all(tiny):
    a = Engine(tiny, n_ctx=CTX, max_batch_tokens=4).forward(PROMPT, logits_for="all")
    b = Engine(tiny, n_ctx=CTX, max_batch_tokens=4).forward(PROMPT)
    assert b.shape == (1, tiny.config.vocab_size)
    assert np.array_equal(_bits(a[-1:]), _bits(b))


@pytest.mark.parametrize("table", [t["name"] for t in _core.kernel_tables() if t["eligible"]])
def test_every_eligible_kernel_table_runs_the_model(tiny_qwen2_dir, table):
    model = open_model(tiny_qwen2_dir)
    want = _reference(model)
    got = _run(Engine(model, n_ctx=CTX, max_batch_tokens=8, kernels=table))
    for g, w in zip(got, want):
        assert float(np.abs(g - w).max()) <= 1e-4
    assert Engine(model, n_ctx=CTX, kernels=table).options.kernels == table


def test_f16_kv_cache_halves_the_cache_and_stays_close(tiny):
    f32 = Engine(tiny, n_ctx=CTX, max_batch_tokens=4)
    f16 = Engine(tiny, n_ctx=CTX, max_batch_tokens=4, kv_dtype="f16")
    two = Engine(tiny, n_ctx=CTX, max_batch_tokens=4, kv_dtype="f16", threads=2)
    c = tiny.config
    kv_bytes = 2 * c.n_layers * CTX * c.kv_dim * 4
    assert f32.nbytes - f16.nbytes == kv_bytes // 2
    a, b, b2 = _run(f32), _run(f16), _run(two)
    for x, y, y2 in zip(a, b, b2):
        assert float(np.abs(x - y).max()) < 1e-2          # k, v rounded to 11 significant bits
        assert np.array_equal(_bits(y), _bits(y2))
    assert f16.options.kv_dtype == "f16"
    with pytest.raises(RuntimeInputError, match="kv_dtype"):
        Engine(tiny, n_ctx=CTX, kv_dtype="bf16")


def test_f16_kv_cache_saturates_values_beyond_its_range(tiny):
    """Values past f16's largest (65504) are kept as +-65504, not inf: the logits stay finite and a
    prompt in one tile of rows gives the bits of the same prompt a token at a time (the tile weighs
    the later rows' values by 0, which would turn an inf into NaN)."""
    class loud:
        config = tiny.config
        weights = {k: np.asarray(tiny.weights[k], np.float32) * (1e6 if "v_proj" in k else 1)
                   for k in tiny.weights}
    whole = Engine(loud, n_ctx=CTX, max_batch_tokens=16, kv_dtype="f16")
    single = Engine(loud, n_ctx=CTX, max_batch_tokens=1, kv_dtype="f16")
    a = whole.forward(PROMPT, logits_for="all")
    b = np.concatenate([single.forward(PROMPT[i:i + 1]) for i in range(PROMPT.size)])
    assert np.isfinite(a).all()
    assert np.array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_checkpoints_are_widened_once(tmp_path, dtype):
    from tiny_models import write_tiny_model
    model = open_model(write_tiny_model(tmp_path, arch="qwen2", seed=0, dtype=dtype))
    want = _reference(model if dtype == "F16" else _widened(model))
    for g, w in zip(_run(Engine(model, n_ctx=CTX)), want):
        assert float(np.abs(g - w).max()) <= 1e-4


class _widened:
    """A model whose BF16 weights are given to the interpreter as f32 values."""
    def __init__(self, model):
        from ignis.formats.bf16 import bf16_to_f32
        self.config = model.config
        self.weights = {k: bf16_to_f32(model.weights[k]) for k in model.weights}


def _nmse(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2) / np.sum(want * want))


def test_q8_weights_stay_close_and_keep_the_invariants(tiny):
    """int8 blocks for every matmul weight: near the f32 logits, and still bitwise stable across
    threads, planner on/off and chunking."""
    want = _reference(tiny)
    a = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=4, weight_format="q8", threads=1))
    b = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=8, weight_format="q8", threads=2, plan=False))
    for x, y, w in zip(a, b, want):
        assert _nmse(x, w) < 2e-3, f"nmse {_nmse(x, w):.2e}"          # observed <= 8e-4
        assert np.array_equal(_bits(x), _bits(y))
    eng = Engine(tiny, n_ctx=CTX, weight_format="q8")
    assert eng.options.weight_format == "q8"
    with pytest.raises(RuntimeInputError, match="weight_format must be .auto. or one of f32, bf16, q8, q4"):
        Engine(tiny, n_ctx=CTX, weight_format="q3")


def test_q4_weights_stay_close_and_keep_the_invariants(tiny):
    """4-bit blocks (the output projection kept in q8): near the f32 logits, bitwise stable across
    threads, planner on/off and chunking, and every q4 row equal to the portable twin's within
    float rounding."""
    want = _reference(tiny)
    a = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=4, weight_format="q4", threads=1))
    b = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=8, weight_format="q4", threads=2, plan=False))
    g = _run(Engine(tiny, n_ctx=CTX, weight_format="q4", threads=1, kernels="generic"))
    for x, y, z, w in zip(a, b, g, want):
        assert _nmse(x, w) < 0.1, f"nmse {_nmse(x, w):.2e}"         # random weights: observed <= 4e-2
        assert np.array_equal(_bits(x), _bits(y))
        assert _nmse(x, z) < 1e-10
    eng = Engine(tiny, n_ctx=CTX, weight_format="q4")
    # per weight (packing id, layout, bytes) or None; ids: Packing.c_id
    packing = {n: p and p[0] for n, p in zip(eng.step_info.tape.weights, eng._packed)}
    q4 = [n for n, p in packing.items() if p == Q4P.c_id]
    q8 = [n for n, p in packing.items() if p == Q8P.c_id]
    assert q4 and all("mlp" in n or "self_attn" in n for n in q4)
    assert set(q8) <= {"lm_head.weight", "model.embed_tokens.weight"} and q8


def test_bf16_weights_equal_the_interpreter_on_rounded_weights(tiny):
    """bf16 matmul weights are exact in f32, so the f32 tolerance holds against a model whose
    matmul matrices were rounded the same way. The embedding gather stays f32: with tied
    embeddings one table is both, which one interpreter graph cannot express, so that case is
    held to the bf16 rounding error against f32 instead."""
    from ignis.formats.bf16 import bf16_to_f32, f32_to_bf16
    eng = Engine(tiny, n_ctx=CTX, max_batch_tokens=4, weight_format="bf16")
    got = _run(eng)
    if tiny.config.tie_word_embeddings:
        for g, w in zip(got, _reference(tiny)):
            assert _nmse(g, w) < 1e-4, f"nmse {_nmse(g, w):.2e}"
    else:
        rounded = {k: bf16_to_f32(f32_to_bf16(v)) if v.ndim == 2 and k != "model.embed_tokens.weight"
                   else v for k, v in tiny.weights.items()}
        for g, w in zip(got, _reference(_Weights(tiny.config, rounded))):
            assert float(np.abs(g - w).max()) <= 1e-4
    two = _run(Engine(tiny, n_ctx=CTX, max_batch_tokens=8, weight_format="bf16", threads=2))
    for x, y in zip(got, two):
        assert np.array_equal(_bits(x), _bits(y))
    assert eng.options.weight_format == "bf16"


class _Weights:
    def __init__(self, config, weights):
        self.config, self.weights = config, weights


def test_bad_tokens_are_typed_errors_and_change_nothing(tiny_qwen2_dir):
    model = open_model(tiny_qwen2_dir)
    eng = Engine(model, n_ctx=16, max_batch_tokens=4)
    eng.forward(PROMPT[:3])
    vocab = model.config.vocab_size
    with pytest.raises(TokenIdError, match=f"token id {vocab} at index 1 is outside the vocabulary "
                                           f"0..{vocab - 1}"):
        eng.forward(np.array([1, vocab], np.int32))
    with pytest.raises(TokenIdError, match="token id -1 at index 0"):
        eng.forward(np.array([-1], np.int64))
    with pytest.raises(TokenIdError, match=f"token id {vocab} at index 0"):
        eng.forward(np.array([vocab], np.uint64))          # one token: the decode step's check
    with pytest.raises(RuntimeInputError, match="integers, got dtype bool"):
        eng.forward(np.array([True]))
    with pytest.raises(RuntimeInputError, match="empty"):
        eng.forward(np.array([], np.int32))
    with pytest.raises(RuntimeInputError, match="1-D"):
        eng.forward(np.array([[1, 2]], np.int32))
    with pytest.raises(RuntimeInputError, match="integers"):
        eng.forward(np.array([1.0]))
    with pytest.raises(RuntimeInputError, match="logits_for"):
        eng.forward(PROMPT[:1], logits_for="first")
    with pytest.raises(ContextOverflowError, match="14 tokens after 3 cached positions need 17 "
                                                   "positions; the context holds 16"):
        eng.forward(PROMPT[:14])
    with pytest.raises(RuntimeInputError, match="truncate"):
        eng.truncate(4)
    assert eng.n_past == 3                        # nothing above ran


@pytest.mark.parametrize("weight_format", ["f32", "q8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_steps_return_fresh_arrays_equal_to_the_bound_output(tiny, weight_format, threads):
    """A one-token forward has the executor write its logits straight into the array it returns
    (Executor.step_into): bit for bit what a step into the engine's bound output gives (a batch of
    one part, which copies out of it), each step its own array, left alone by later steps; on
    slot 1 too."""
    a = Engine(tiny, n_ctx=32, n_seq=2, threads=threads, weight_format=weight_format)
    b = Engine(tiny, n_ctx=32, n_seq=2, threads=threads, weight_format=weight_format)
    for seq in (0, 1):
        a.forward(PROMPT[:5], seq=seq)
        b.forward(PROMPT[:5], seq=seq)
        got, kept = [], []
        tok = 3
        for _ in range(4):
            x = a.forward(np.array([tok], np.int32), seq=seq)
            (y,) = b.forward_batch([(seq, [tok])])
            assert x.shape == y.shape == (1, a.config.vocab_size) and x.dtype == np.float32
            assert np.array_equal(_bits(x), _bits(y))
            got.append(x)
            kept.append(x.copy())
            tok = int(np.argmax(x[0]))
        assert all(np.array_equal(_bits(g), _bits(k)) for g, k in zip(got, kept))
        assert a.seq_n_past(seq) == b.seq_n_past(seq) == 9


def test_prompt_longer_than_the_context_is_refused_before_running(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=8)
    with pytest.raises(ContextOverflowError, match="the context holds 8"):
        eng.forward(PROMPT)
    assert eng.n_past == 0
    assert isinstance(ContextOverflowError("x"), ValueError)


@pytest.mark.parametrize("kw", [{"n_ctx": 0}, {"threads": 0}, {"max_batch_tokens": -1},
                                {"n_ctx": True}])
def test_bad_engine_options(tiny_qwen2_dir, kw):
    with pytest.raises(RuntimeInputError, match="must be a positive integer"):
        Engine(open_model(tiny_qwen2_dir), **kw)


def test_core_errors_name_the_instruction(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=CTX, max_batch_tokens=4)
    # bypass forward()'s checks to reach the C bound check on positions
    eng._tokens[:1] = 1
    eng._pos[:1] = CTX
    with pytest.raises(CoreError, match=r"instruction \d+ \(attention_packed 'blk\.0\.attn'\): position "
                                        rf"{CTX} \(row 0\) is outside the KV cache of {CTX} positions"):
        eng._exec.step(1, 1, 1)


def test_converted_weights_are_cached_and_mmapped_on_the_next_load(tiny_qwen2_dir, tmp_path,
                                                                    monkeypatch):
    import os
    import shutil
    from dataclasses import replace
    from ignis.formats import FORMATS
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    src = tmp_path / "m"
    shutil.copytree(tiny_qwen2_dir, src)
    m = open_model(src)
    first = _run(Engine(m, n_ctx=CTX, weight_format="q8", threads=1))
    cached = list((tmp_path / "home" / "convert").glob("q8-*.safetensors"))
    assert len(cached) == 1

    def no_conversion(*a, **k):
        raise AssertionError("converted again although a cache file exists")
    monkeypatch.setitem(FORMATS, "q8", replace(FORMATS["q8"], convert=no_conversion))
    again = _run(Engine(m, n_ctx=CTX, weight_format="q8", threads=1))
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(first, again))
    monkeypatch.undo()
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))

    # a changed source is a different key: converted again, never the stale file
    st = os.stat(src / "model.safetensors")
    os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _run(Engine(open_model(src), n_ctx=CTX, weight_format="q8", threads=1))
    assert len(list((tmp_path / "home" / "convert").glob("q8-*.safetensors"))) == 2

    # a damaged cache file is ignored with a warning and the weights are converted afresh
    for f in (tmp_path / "home" / "convert").glob("q8-*.safetensors"):
        f.write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="unreadable conversion cache"):
        damaged = _run(Engine(open_model(src), n_ctx=CTX, weight_format="q8", threads=1))
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(first, damaged))


# ---- KV slots: several sequences in one step ---------------------------------------------------

OTHER = np.array([30, 5, 77, 100, 12, 9], np.int32)


@pytest.mark.parametrize("weight_format", ["f32", "q8"])
def test_batched_steps_equal_each_sequence_run_alone(tiny, weight_format):
    """Slot 0 prefills and decodes while slot 1 prefills beside it and then decodes with it: every
    logit row is bitwise the one a lone engine computes (a row never depends on its neighbours)."""
    kw = dict(n_ctx=CTX, threads=2, max_batch_tokens=32, weight_format=weight_format)
    alone_a, alone_b = Engine(tiny, **kw), Engine(tiny, **kw)
    want_a = [alone_a.forward(PROMPT)] + [alone_a.forward(np.array([t], np.int32)) for t in DECODE]
    want_b = [alone_b.forward(OTHER)] + [alone_b.forward(np.array([t], np.int32)) for t in DECODE[::-1]]

    eng = Engine(tiny, n_seq=3, **kw)
    got_a = [eng.forward(PROMPT, seq=2)]
    # decode of slot 2 beside the whole prefill of slot 0, then two batched decodes
    a, b = eng.forward_batch([(2, [DECODE[0]]), (0, OTHER)])
    got_a.append(a)
    got_b = [b]
    for ta, tb in zip(DECODE[1:], DECODE[::-1]):
        b, a = eng.forward_batch([(0, [tb]), (2, [ta])])
        got_a.append(a)
        got_b.append(b)
    got_b.append(eng.forward([DECODE[0]], seq=0))
    for g, w in zip(got_a + got_b, want_a + want_b):
        assert g.shape == w.shape == (1, tiny.config.vocab_size)
        np.testing.assert_array_equal(_bits(g), _bits(w))
    assert (eng.seq_n_past(2), eng.seq_n_past(0), eng.seq_n_past(1)) == (
        PROMPT.size + len(DECODE), OTHER.size + len(DECODE), 0)


def test_slots_are_independent_caches(tiny):
    eng = Engine(tiny, n_ctx=CTX, n_seq=2, threads=1)
    a = eng.forward(PROMPT, seq=1)
    eng.forward(OTHER, seq=0)
    eng.truncate(2, seq=0)
    eng.reset(seq=0)
    assert (eng.seq_n_past(0), eng.seq_n_past(1)) == (0, PROMPT.size)
    b = eng.forward([DECODE[0]], seq=1)
    ref = Engine(tiny, n_ctx=CTX, threads=1)
    np.testing.assert_array_equal(_bits(a), _bits(ref.forward(PROMPT)))
    np.testing.assert_array_equal(_bits(b), _bits(ref.forward([DECODE[0]])))
    view = eng.slot(1)
    assert view.n_past == PROMPT.size + 1 and view.n_ctx == CTX
    view.truncate(3)
    assert eng.seq_n_past(1) == 3
    eng.reset()
    assert eng.n_past == eng.seq_n_past(1) == 0


def test_bad_batches_are_typed_errors_and_move_no_slot(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=16, n_seq=2, max_batch_tokens=8)
    eng.forward(PROMPT[:3], seq=1)
    vocab = eng.config.vocab_size
    cases = [
        ([], RuntimeInputError, "at least one"),
        ([(2, [1])], RuntimeInputError, r"KV slot 2 does not exist; this engine has slots 0\.\.1"),
        ([(-1, [1])], RuntimeInputError, "KV slot -1 does not exist"),
        ([(True, [1])], RuntimeInputError, "KV slot True does not exist"),
        ([(0, [1]), (0, [2])], RuntimeInputError, "appears twice"),
        ([(0, [1] * 6), (1, [1] * 3)], RuntimeInputError, "9 tokens exceeds max_batch_tokens=8"),
        ([(0, [1]), (1, [vocab])], TokenIdError, "outside the vocabulary"),
        ([(0, [1]), (1, [1] * 14)], ContextOverflowError, "14 tokens after 3 cached positions"),
        ([(0, [])], RuntimeInputError, "empty"),
    ]
    for parts, err, msg in cases:
        with pytest.raises(err, match=msg):
            eng.forward_batch(parts)
    with pytest.raises(RuntimeInputError, match="KV slot 5"):
        eng.forward([1], seq=5)
    with pytest.raises(RuntimeInputError, match="must be a positive integer"):
        Engine(open_model(tiny_qwen2_dir), n_seq=0)
    assert (eng.seq_n_past(0), eng.seq_n_past(1)) == (0, 3)


def test_the_executor_refuses_a_row_in_a_missing_slot(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=16, n_seq=2)
    eng._tokens[0], eng._pos[0], eng._seq[0] = 1, 0, 2      # bypass forward_batch's checks
    with pytest.raises(CoreError, match="row 0 belongs to KV slot 2; this model has slots 0..1"):
        eng._exec.step(1, 1, 1, True)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_a_copied_slot_continues_bit_for_bit_as_one_that_ran_the_prompt(tiny, kv_dtype):
    """copy_slot (n > 1 choices sharing a prompt): the copied slot's next logits, and the ones
    after, are those of a slot that ran the prompt itself, bit for bit; the source is untouched."""
    eng = Engine(tiny, n_ctx=CTX, n_seq=3, threads=1, kv_dtype=kv_dtype, max_batch_tokens=4)
    ref = Engine(tiny, n_ctx=CTX, threads=1, kv_dtype=kv_dtype, max_batch_tokens=4)
    eng.forward(OTHER, seq=2)                  # slot 2 held something else: it is overwritten
    eng.forward(PROMPT[:-1], seq=0)
    eng.copy_slot(2, 0, PROMPT.size - 1)
    assert (eng.seq_n_past(0), eng.seq_n_past(2)) == (PROMPT.size - 1, PROMPT.size - 1)
    ref.forward(PROMPT[:-1])
    want = [ref.forward(PROMPT[-1:]), ref.forward(DECODE[:1])]
    got = [eng.forward(PROMPT[-1:], seq=2), eng.forward(DECODE[:1], seq=2)]
    src = eng.forward(PROMPT[-1:], seq=0)
    for g, w in zip(got + [src], want + [want[0]]):
        np.testing.assert_array_equal(_bits(g), _bits(w))
    eng.copy_slot(1, 2, 3)                     # a shorter prefix of a slot that ran further
    assert eng.seq_n_past(1) == 3
    fresh = Engine(tiny, n_ctx=CTX, threads=1, kv_dtype=kv_dtype, max_batch_tokens=4)
    fresh.forward(PROMPT[:3])
    np.testing.assert_array_equal(_bits(eng.forward(OTHER[:2], seq=1)),
                                  _bits(fresh.forward(OTHER[:2])))


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("n", [16, 33, 47])
def test_a_long_copied_prefix_moves_whole_key_blocks_bit_for_bit(tiny, kv_dtype, n):
    """copy_slot of 16 and more positions copies the key cache's blocks of 16 transposed rows
    whole (the remainder element by element): the copy continues as a slot that ran them."""
    rng = np.random.default_rng(n)
    tokens = rng.integers(0, tiny.config.vocab_size, n + 2).astype(np.int32)
    eng = Engine(tiny, n_ctx=CTX, n_seq=2, threads=1, kv_dtype=kv_dtype, max_batch_tokens=8)
    ref = Engine(tiny, n_ctx=CTX, threads=1, kv_dtype=kv_dtype, max_batch_tokens=8)
    eng.forward(tokens[::-1], seq=1)           # slot 1 held other keys: every one is replaced
    eng.forward(tokens[:n], seq=0)
    eng.copy_slot(1, 0, n)
    ref.forward(tokens[:n])
    for t in tokens[n:]:
        np.testing.assert_array_equal(_bits(eng.forward(np.array([t], np.int32), seq=1)),
                                      _bits(ref.forward(np.array([t], np.int32))))


def test_bad_slot_copies_are_typed_errors_and_move_nothing(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=16, n_seq=2)
    eng.forward(PROMPT[:3], seq=1)
    cases = [((2, 1, 1), "KV slot 2 does not exist"), ((0, -1, 1), "KV slot -1 does not exist"),
             ((0, 1, 4), r"copy_slot\(0, 1, 4\): copy between 0 and n_past=3"),
             ((0, 1, -1), "between 0 and n_past=3"), ((0, 1, 1.0), "between 0 and n_past=3"),
             ((0, 1, True), "between 0 and n_past=3")]
    for args, msg in cases:
        with pytest.raises(RuntimeInputError, match=msg):
            eng.copy_slot(*args)
    assert (eng.seq_n_past(0), eng.seq_n_past(1)) == (0, 3)
    eng.copy_slot(1, 1, 2)                     # onto itself: keeps the first 2
    assert eng.seq_n_past(1) == 2


def test_the_executor_refuses_a_copy_outside_its_slots_or_context(tiny_qwen2_dir):
    eng = Engine(open_model(tiny_qwen2_dir), n_ctx=16, n_seq=2)
    with pytest.raises(CoreError, match="kv_copy from slot 0 to slot 2; this model has slots 0..1"):
        eng._exec.kv_copy(2, 0, 1)
    with pytest.raises(CoreError, match="kv_copy of 17 positions; the KV cache holds 0..16"):
        eng._exec.kv_copy(1, 0, 17)
    with pytest.raises(CoreError, match="kv_copy of -1 positions"):
        eng._exec.kv_copy(1, 0, -1)
    eng._exec.kv_copy(1, 1, 16)                # onto itself: nothing to do
