"""IR tests: op table and type propagation errors at build time, printer, verifier (each kind of
malformed graph), interpreter input errors."""
from __future__ import annotations

import numpy as np
import pytest

from ignis.errors import IgnisError
from ignis.ir import (OPS, GraphBuilder, InterpreterInputError, IRBuildError, IRTypeError,
                      IRVerifyError, f32, format_graph, i32, verify)
from ignis.ir.interp import _IMPLS, KVCache, run
from ignis.models import build_graph
from random_models import random_weights, tiny_config


def small_graph():
    b = GraphBuilder("t")
    x = b.input("x", f32("T", 8))
    w = b.weight("w", f32(8))
    m = b.weight("m", f32(4, 8))
    h = b.op("rmsnorm", x, w, name="norm", eps=1e-6)
    y = b.op("linear", h, m, name="proj")
    z = b.op("silu", y, name="act")
    b.output("out", z)
    return b.finish()


# --- op table --------------------------------------------------------------------------------------

def test_op_table_is_complete_and_consistent():
    assert set(OPS) == set(_IMPLS), "every op needs NumPy semantics in ir/interp.py"
    opcodes = [o.opcode for o in OPS.values()]
    assert len(set(opcodes)) == len(opcodes)
    for o in OPS.values():
        assert o.doc, o.name
        for j in o.inplace:
            assert j < max(o.arity) and (o.weights_from is None or j < o.weights_from), o.name
    assert not OPS["attention"].pure and OPS["add"].pure


@pytest.mark.parametrize("build, message", [
    (lambda b, x: b.op("linear", x, b.weight("w", f32(4, 9)), name="n"), "in_features"),
    (lambda b, x: b.op("linear", x, b.weight("w", f32(4, 8)), b.weight("b", f32(5)), name="n"), "bias"),
    (lambda b, x: b.op("rmsnorm", x, b.weight("w", f32(7)), name="n", eps=1e-6), "weight length"),
    (lambda b, x: b.op("rmsnorm", x, b.weight("w", f32(8)), name="n"), "attributes"),
    (lambda b, x: b.op("rmsnorm", x, b.weight("w", f32(8)), name="n", eps="small"), "eps"),
    (lambda b, x: b.op("rmsnorm", x, b.weight("w", f32(8)), name="n", eps=-1.0), "positive"),
    (lambda b, x: b.op("rope", x, b.input("p", i32("T")), name="n", n_heads=0, head_dim=4, theta=1e4),
     "in 1\\.\\."),
    (lambda b, x: b.op("silu", x, x, name="n"), "takes 1"),
    (lambda b, x: b.op("frobnicate", x, name="n"), "unknown op"),
    (lambda b, x: b.op("add", x, b.op("take_rows", x, b.input("r", i32("R")), name="tr"), name="n"),
     "one type"),
    (lambda b, x: b.op("rope", x, b.input("p", f32("T")), name="n", n_heads=2, head_dim=4, theta=1e4),
     "positions"),
    (lambda b, x: b.op("rope", x, b.input("p", i32("T")), name="n", n_heads=2, head_dim=3, theta=1e4),
     "even"),
    (lambda b, x: b.op("attention", x, x, x, b.input("p", i32("T")), name="n", layer=0, n_heads=2,
                       n_kv_heads=2, head_dim=3), "n_heads\\*head_dim"),
    (lambda b, x: b.op("attention", x, x, x, b.input("p", i32("T")), name="n", layer=0, n_heads=3,
                       n_kv_heads=2, head_dim=4), "multiple"),
    (lambda b, x: b.op("embed", x, b.weight("e", f32(10, 8)), name="n"), "token ids"),
    # the executor holds int attributes in 32 bits: a window past that would wrap to "none"
    (lambda b, x: b.op("attention_window", x, x, x, b.input("p", i32("T")), name="n", layer=0,
                       n_heads=2, n_kv_heads=2, head_dim=4, window=2**31, scale=0.5),
     "window=2147483648 must be in 0..2147483647"),
])
def test_type_errors_are_raised_at_build_time(build, message):
    b = GraphBuilder("t")
    x = b.input("x", f32("T", 8))
    with pytest.raises(IRTypeError, match=message) as e:
        build(b, x)
    assert isinstance(e.value, IgnisError) and isinstance(e.value, TypeError)


def test_symbolic_and_concrete_sizes_do_not_unify():
    b = GraphBuilder("t")
    x = b.input("x", f32("T", 8))
    y = b.input("y", f32(1, 8))
    with pytest.raises(IRTypeError):
        b.op("add", x, y, name="n")


def test_builder_rejects_foreign_values_duplicate_names_and_misplaced_weights():
    b = GraphBuilder("t")
    x = b.input("x", f32("T", 8))
    other = GraphBuilder("u").input("x", f32("T", 8))
    with pytest.raises(IRBuildError, match="not a value of this graph"):
        b.op("silu", other, name="a")
    b.op("silu", x, name="a")
    with pytest.raises(IRBuildError, match="used twice"):
        b.op("silu", x, name="a")
    with pytest.raises(IRBuildError, match="must be a weight"):
        b.op("scale", x, b.input("v", f32(8)), name="s")
    b.weight("w", f32(8))
    with pytest.raises(IRBuildError, match="declared as"):
        b.weight("w", f32(9))


# --- printer ---------------------------------------------------------------------------------------

def test_printer_is_one_line_per_node_and_deterministic():
    g = small_graph()
    text = format_graph(g)
    assert text == format_graph(g.copy())
    lines = text.splitlines()
    assert "  %0 = rmsnorm(%x, w) eps=1e-06 :: f32[T,8]  # norm" in lines
    assert "  %1 = linear(%0, m) :: f32[T,4]  # proj" in lines
    assert lines[-1] == "  output out = %2"
    assert sum(1 for ln in lines if ln.startswith("  %")) == len(g.nodes)


def test_printed_model_line_matches_style():
    g = build_graph(tiny_config())
    assert ("%12 = scale(%11, model.layers.0.post_attention_layernorm.weight) :: f32[T,64]"
            "  # blk.0.ffn_norm") in str(g)


# --- verifier: one test per kind of malformed graph ------------------------------------------------

def test_verifier_accepts_built_graphs():
    verify(small_graph())
    verify(build_graph(tiny_config()))


def _broken(kind):
    g = small_graph()
    norm, proj, act = g.nodes
    if kind == "order":
        g.nodes[1], g.nodes[2] = act, proj
    elif kind == "foreign":
        stranger = small_graph().nodes[0].out
        proj.inputs = (stranger, proj.inputs[1])
    elif kind == "ssa":
        g.nodes.append(act)
    elif kind == "type":
        from ignis.ir.types import TensorType
        proj.out.type = TensorType(("T", 5))
    elif kind == "users":
        norm.out.users.clear()
    elif kind == "extra_user":
        act.out.users.append(norm)
    elif kind == "unknown_op":
        act.op = "gelu"
    elif kind == "duplicate_name":
        act.name = "proj"
    elif kind == "weight_slot":
        proj.inputs = (proj.inputs[0], g.inputs["x"])
    elif kind == "attrs":
        norm.attrs = {}
    elif kind == "output":
        g.outputs["out"] = small_graph().nodes[2].out
    elif kind == "no_outputs":
        g.outputs.clear()
    elif kind == "back_pointer":
        act.out.node = proj
    elif kind == "input_name":
        g.inputs["y"] = g.inputs.pop("x")
    return g


@pytest.mark.parametrize("kind, message", [
    ("order", "topological"), ("foreign", "not defined"), ("ssa", "twice"), ("type", "derives"),
    ("users", "users"), ("extra_user", "users"), ("unknown_op", "unknown op"),
    ("duplicate_name", "name used twice"), ("weight_slot", "must be a weight"), ("attrs", "attributes"),
    ("output", "output 'out'"), ("no_outputs", "no outputs"), ("back_pointer", "point back"),
    ("input_name", "graph input 'y'"),
])
def test_verifier_catches_each_kind_of_malformed_graph(kind, message):
    with pytest.raises(IRVerifyError, match=message):
        verify(_broken(kind))


# --- interpreter input checking --------------------------------------------------------------------

def _tiny():
    c = tiny_config()
    g = build_graph(c)
    return g, random_weights(c), KVCache.for_graph(g, 8)


def test_interpreter_rejects_bad_inputs_weights_and_positions():
    g, w, cache = _tiny()
    ids = np.array([1, 2], np.int32)
    with pytest.raises(InterpreterInputError, match="missing graph inputs"):
        run(g, w, {"tokens": ids}, cache=cache)
    with pytest.raises(InterpreterInputError, match="disagrees"):
        run(g, w, {"tokens": ids, "pos": np.array([0, 1, 2], np.int32)}, cache=cache)
    with pytest.raises(InterpreterInputError, match="must be i32"):
        run(g, w, {"tokens": ids, "pos": np.zeros((2, 1), np.int32)}, cache=cache)
    bad = dict(w)
    del bad["model.norm.weight"]
    with pytest.raises(InterpreterInputError, match="model.norm.weight"):
        run(g, bad, {"tokens": ids, "pos": np.array([0, 1], np.int32)}, cache=cache)
    bad = dict(w, **{"model.norm.weight": np.ones(3, np.float32)})
    with pytest.raises(InterpreterInputError, match="shape"):
        run(g, bad, {"tokens": ids, "pos": np.array([0, 1], np.int32)}, cache=cache)
    with pytest.raises(InterpreterInputError, match="KV cache"):
        run(g, w, {"tokens": ids, "pos": np.array([7, 8], np.int32)}, cache=cache)


def test_interpreter_decode_uses_the_cache():
    # the same token at the same position gives different logits with different history
    g, w, _ = _tiny()
    outs = []
    for first in (3, 4):
        cache = KVCache.for_graph(g, 8)
        run(g, w, {"tokens": np.array([first], np.int32), "pos": np.array([0], np.int32)}, cache=cache)
        outs.append(run(g, w, {"tokens": np.array([5], np.int32), "pos": np.array([1], np.int32)},
                        cache=cache)["logits"])
    assert not np.allclose(outs[0], outs[1])
    # and prefill of both tokens equals prefill-then-decode on the last row
    cache = KVCache.for_graph(g, 8)
    both = run(g, w, {"tokens": np.array([4, 5], np.int32), "pos": np.array([0, 1], np.int32)},
               cache=cache)["logits"]
    np.testing.assert_allclose(both[1:], outs[1], rtol=1e-12, atol=1e-12)
