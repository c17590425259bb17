"""Pass tests: each pass preserves what the interpreter computes (tiny models, prefill then decode,
and random graphs), never mutates its input, and the pipeline reproduces the seed's 435 -> 362.
Golden printed IR catches any unintended change (IGNIS_UPDATE_GOLDEN=1 rewrites the files)."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.ir import GraphBuilder, f32, format_graph, verify
from ignis.ir.interp import KVCache, run
from ignis.models import build_graph
from reference_configs import qwen25_05b
from random_models import random_graph, random_weights, tiny_config
from ignis.passes import OPTIONAL, PASSES, PIPELINE, SEED_PASSES, PassEntry, PassError, run_pipeline, select_passes
from ignis.passes.dce import dce
from ignis.passes.fuse_residual import fuse_residual
from ignis.passes.fuse_swiglu import fuse_swiglu
from golden_files import check_golden

STEPS = [[3, 5, 7, 11, 13], [17], [19, 23]]
PASS_NAMES = list(PASSES)          # the pipeline's passes and the optional ones


def _model_outputs(g, w, rows_last=False):
    cache = KVCache.for_graph(g, 16)
    out, p = [], 0
    for ids in STEPS:
        inputs = {"tokens": np.array(ids, np.int32), "pos": np.arange(p, p + len(ids), dtype=np.int32)}
        if "rows" in g.inputs:
            inputs["rows"] = np.array([len(ids) - 1] if rows_last else range(len(ids)), np.int32)
        out.append(run(g, w, inputs, cache=cache)["logits"])
        p += len(ids)
    return out


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request):
    c = tiny_config(request.param, tie_word_embeddings=request.param == "qwen2")
    return c, random_weights(c, seed=3)


@pytest.mark.parametrize("upto", range(1, len(PIPELINE) + 1))
def test_each_pass_preserves_outputs_on_tiny_models(tiny, upto):
    """Stage by stage: the graph after PIPELINE[:upto] computes what the graph before it did."""
    c, w = tiny
    before = run_pipeline(build_graph(c), PIPELINE[:upto - 1]).graph
    text = format_graph(before)
    after = PIPELINE[upto - 1].fn(before)
    verify(after)
    assert format_graph(before) == text, f"{PIPELINE[upto - 1].name} mutated its input"
    for x, y in zip(_model_outputs(before, w), _model_outputs(after, w)):
        np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("entry", OPTIONAL, ids=lambda e: e.name)
def test_optional_passes_preserve_outputs_after_the_pipeline(tiny, entry):
    c, w = tiny
    before = run_pipeline(build_graph(c)).graph
    text = format_graph(before)
    after = entry.fn(before)
    verify(after)
    assert format_graph(before) == text
    assert len(after) < len(before)
    for x, y in zip(_model_outputs(before, w), _model_outputs(after, w)):
        np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-12)


def test_fold_rmsnorm_counts_on_qwen25_05b():
    g = run_pipeline(build_graph(qwen25_05b()), [*PIPELINE, *OPTIONAL]).graph
    assert g.op_counts() == {"embed": 1, "rms_linear_qkv_rope": 24, "attention_packed": 24,
                             "linear_add": 48, "rms_linear_swiglu": 24, "take_rows": 1, "rms_linear": 1}


def test_logit_rows_select_only_requested_rows(tiny):
    c, w = tiny
    full = _model_outputs(build_graph(c), w)
    last = _model_outputs(run_pipeline(build_graph(c)).graph, w, rows_last=True)
    for f, l in zip(full, last):
        assert l.shape == (1, c.vocab_size)
        np.testing.assert_allclose(l, f[-1:], rtol=1e-12, atol=1e-12)


def test_pipeline_reaches_the_seed_figures_then_goes_past_them():
    res = run_pipeline(build_graph(qwen25_05b()))
    stages = dict(res.stages[:SEED_PASSES + 1])
    # node counts include the embedding lookup the seed did not count
    assert stages["input"] - 1 == 435
    assert stages["fuse_rmsnorm"] - 1 == 435 - 49
    assert stages["fuse_swiglu"] - 1 == 362
    g = res.graph
    assert g.op_counts() == {"embed": 1, "rmsnorm": 49, "linear_qkv_rope": 24, "attention_packed": 24,
                             "linear_add": 48, "linear_swiglu": 24, "take_rows": 1, "linear": 1}
    assert len(g) - 1 == 24 * 7 + 3


def test_seed_fusions_alone_give_362():
    g = run_pipeline(build_graph(qwen25_05b()), PIPELINE[:SEED_PASSES]).graph
    assert len(g) - g.op_counts()["embed"] == 362
    assert g.op_counts()["rmsnorm"] == 49 and g.op_counts()["swiglu"] == 24


def test_failed_check_means_no_match():
    b = GraphBuilder("t")
    x = b.input("x", f32("T", 4))
    s = b.op("silu", x, name="s")
    m = b.op("mul", s, x, name="m")
    b.output("out", m)
    b.output("gate", s)           # the silu is an output: fusing it away would lose it
    g = b.finish()
    assert [n.op for n in fuse_swiglu(g).nodes] == ["silu", "mul"]

    b = GraphBuilder("t")
    x = b.input("x", f32("T", 4))
    y = b.op("linear", x, b.weight("w", f32(4, 4)), name="y")
    b.output("out", b.op("add", x, y, name="r"))
    b.output("extra", b.op("silu", y, name="s"))    # the product has a second reader
    assert [n.op for n in fuse_residual(b.finish()).nodes] == ["linear", "add", "silu"]


def test_dce_keeps_cache_writes_and_drops_dead_values():
    g = build_graph(tiny_config())
    b = GraphBuilder("t")
    vmap = b.declare_like(g)
    for n in g.nodes:
        vmap[n.out] = b.op(n.op, *(vmap[v] for v in n.inputs), name=n.name, **n.attrs)
    b.op("silu", vmap[g.nodes[3].out], name="dead")
    b.output("logits", vmap[g.nodes[-2].out])      # the lm_head is dead now, attention is not
    out = dce(b.finish())
    names = [n.name for n in out.nodes]
    assert "dead" not in names and "output" not in names
    assert sum(n.op == "attention" for n in out.nodes) == 2


def test_pipeline_errors_name_the_pass_and_those_before_it():
    def broken(g):
        h = g.copy()
        h.nodes[1].out.users.clear()
        return h

    passes = select_passes(["dce", "fuse_rmsnorm"]) + [PassEntry("broken", broken, "test")]
    with pytest.raises(PassError, match=r"pass 'broken' failed \(after dce, fuse_rmsnorm\).*users"):
        run_pipeline(build_graph(tiny_config()), passes)

    def raising(g):
        raise KeyError("boom")
    with pytest.raises(PassError, match=r"'raising' failed \(after no passes\): KeyError"):
        run_pipeline(build_graph(tiny_config()), [PassEntry("raising", raising, "test")])
    with pytest.raises(PassError, match="unknown pass"):
        select_passes(["fuse_everything"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), steps=st.integers(1, 14), rows=st.integers(1, 5))
def test_every_pass_preserves_random_graphs(seed, steps, rows):
    g, w = random_graph(seed, steps)
    rng = np.random.default_rng(seed)
    T = 5
    x = rng.standard_normal((T, g.inputs["x"].type.shape[1]))
    sel = rng.integers(0, T, rows).astype(np.int32)
    want = run(g, w, {"x": x}, cache=KVCache({}, {}, 1))
    for name in PASS_NAMES:
        h = PASSES[name](g)
        verify(h)
        inputs = {"x": x, "rows": sel} if "rows" in h.inputs else {"x": x}
        got = run(h, w, inputs, cache=KVCache({}, {}, 1))
        for k in want:
            ref = want[k][sel] if h.outputs[k].type.shape[0] == "R" else want[k]
            np.testing.assert_allclose(got[k], ref, rtol=1e-12, atol=1e-12, err_msg=f"{name}: {k}")
    full = run_pipeline(g).graph
    assert len(full) <= len(g) + len(g.outputs)      # at most one take_rows per output added


# --- golden printed IR -----------------------------------------------------------------------------

@pytest.mark.parametrize("label, config", [("tiny_qwen2", tiny_config()), ("qwen2.5-0.5b", qwen25_05b())])
def test_golden_printed_ir(label, config):
    g = build_graph(config)
    check_golden(f"{label}.ir", format_graph(g, weights=False))
    check_golden(f"{label}.seed.ir", format_graph(run_pipeline(g, PIPELINE[:SEED_PASSES]).graph, weights=False))
    check_golden(f"{label}.opt.ir", format_graph(run_pipeline(g).graph))
