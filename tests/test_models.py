"""Frontend tests: the Qwen2/Llama/Qwen3 builder's granularity and figures, and the interpreter
running its graph against two references nobody here wrote: a NumPy Qwen2 (with Qwen3's q/k norms
and Llama 3's rope scaling) transcribed in this file from the Hugging Face modeling formulas, and
(when installed) transformers itself (tests/test_models_hf.py: checkpoints transformers wrote)."""
from __future__ import annotations

import numpy as np
import pytest

from ignis.errors import UnsupportedArchitectureError
from ignis.ir import verify
from ignis.ir.interp import KVCache, run
from ignis.loader.config import ModelConfig, RopeScaling
from ignis.models import build_graph, weight_shapes
from reference_configs import qwen25_05b
from random_models import random_weights, tiny_config
from ignis.passes import PIPELINE, run_pipeline

# prefill 5 tokens, then two decode steps, then a 3-token chunk: exercises the cache both ways
STEPS = [[3, 5, 7, 11, 13], [17], [19], [23, 29, 31]]


# --- independent reference, from transformers' modeling_qwen2.py formulas --------------------------

def _hf_rmsnorm(x, w, eps):
    var = np.mean(x ** 2, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def _hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return np.concatenate((-x2, x1), axis=-1)


def _hf_inv_freq(c: ModelConfig):
    # _compute_default_rope_parameters: inv_freq = 1 / theta^(arange(0, d, 2)/d)
    d = c.head_dim
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = c.rope_scaling
    if s is None:
        return inv_freq
    assert s.type == "llama3"
    # _compute_llama3_parameters
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    llama = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * llama / s.factor + smooth * llama
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, llama)


def _hf_rope(x, position_ids, inv_freq):
    # x: [heads, seq, head_dim]; emb = cat(freqs, freqs)
    freqs = np.outer(position_ids, inv_freq)
    emb = np.concatenate((freqs, freqs), axis=-1)
    return x * np.cos(emb)[None] + _hf_rotate_half(x) * np.sin(emb)[None]


class ReferenceQwen2:
    """Straight transcription of Qwen2ForCausalLM.forward with a growing (concatenated) KV cache."""

    def __init__(self, c: ModelConfig, w: dict[str, np.ndarray]):
        self.c, self.w = c, {k: v.astype(np.float64) for k, v in w.items()}
        self.past = [(np.zeros((c.n_kv_heads, 0, c.head_dim)), np.zeros((c.n_kv_heads, 0, c.head_dim)))
                     for _ in range(c.n_layers)]

    def step(self, ids):
        c, w = self.c, self.w
        past_len = self.past[0][0].shape[1]
        T = len(ids)
        position_ids = np.arange(past_len, past_len + T)
        h = w["model.embed_tokens.weight"][np.asarray(ids)]
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            x = _hf_rmsnorm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)

            def proj(name):
                y = x @ w[p + f"self_attn.{name}.weight"].T
                b = w.get(p + f"self_attn.{name}.bias")
                return y if b is None else y + b

            q = proj("q_proj").reshape(T, c.n_heads, c.head_dim)
            k = proj("k_proj").reshape(T, c.n_kv_heads, c.head_dim)
            if p + "self_attn.q_norm.weight" in w:      # Qwen3: RMSNorm over each head's head_dim
                q = _hf_rmsnorm(q, w[p + "self_attn.q_norm.weight"], c.rms_norm_eps)
                k = _hf_rmsnorm(k, w[p + "self_attn.k_norm.weight"], c.rms_norm_eps)
            q, k = q.transpose(1, 0, 2), k.transpose(1, 0, 2)
            v = proj("v_proj").reshape(T, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
            inv_freq = _hf_inv_freq(c)
            q, k = _hf_rope(q, position_ids, inv_freq), _hf_rope(k, position_ids, inv_freq)
            k = np.concatenate([self.past[i][0], k], axis=1)
            v = np.concatenate([self.past[i][1], v], axis=1)
            self.past[i] = (k, v)
            k = np.repeat(k, c.n_heads // c.n_kv_heads, axis=0)     # repeat_kv
            v = np.repeat(v, c.n_heads // c.n_kv_heads, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(c.head_dim)
            S = k.shape[1]
            causal = np.triu(np.full((T, S), -np.inf), k=past_len + 1)
            scores = scores + causal[None]
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            attn = (probs @ v).transpose(1, 0, 2).reshape(T, c.n_heads * c.head_dim)
            h = h + attn @ w[p + "self_attn.o_proj.weight"].T
            x = _hf_rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = x @ w[p + "mlp.gate_proj.weight"].T
            up = x @ w[p + "mlp.up_proj.weight"].T
            act = gate / (1.0 + np.exp(-gate))
            h = h + (act * up) @ w[p + "mlp.down_proj.weight"].T
        h = _hf_rmsnorm(h, w["model.norm.weight"], c.rms_norm_eps)
        lm = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
        return h @ lm.T


def _ignis_steps(g, w, steps, dtype=np.float64):
    cache = KVCache.for_graph(g, 32, dtype)
    out, p = [], 0
    for ids in steps:
        inputs = {"tokens": np.array(ids, np.int32), "pos": np.arange(p, p + len(ids), dtype=np.int32)}
        if "rows" in g.inputs:
            inputs["rows"] = np.arange(len(ids), dtype=np.int32)
        out.append(run(g, w, inputs, cache=cache, dtype=dtype)["logits"])
        p += len(ids)
    return out


# llama3 scaling with a short original context: every region of it matters at the test positions
LLAMA3 = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=64)
CONFIGS = {
    "qwen2-tied": tiny_config("qwen2"),
    "llama-untied": tiny_config("llama", tie_word_embeddings=False, n_kv_heads=1),
    # head_dim 32 x 4 heads: q wider than the model, as in Qwen3-0.6B
    "qwen3-tied": tiny_config("qwen3", head_dim=32, rope_theta=1e6),
    "llama3-tied": tiny_config("llama", head_dim=32, n_heads=2, n_kv_heads=1, rope_theta=5e5,
                               rope_scaling=LLAMA3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("optimised", [False, True])
def test_interpreter_matches_independent_numpy_reference(name, optimised):
    c = CONFIGS[name]
    w = random_weights(c, seed=7)
    g = build_graph(c)
    if optimised:
        g = run_pipeline(g).graph
    ref = ReferenceQwen2(c, w)
    # a rope scaling is an f32 table (models/rope.py), the reference's is float64
    tol = 1e-10 if c.rope_scaling is None else 1e-6
    for got, ids in zip(_ignis_steps(g, w, STEPS), STEPS):
        want = ref.step(ids)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_interpreter_matches_transformers(name):
    torch = pytest.importorskip("torch", reason="torch not installed: pip install torch==2.13.0")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    c = CONFIGS[name]
    w = random_weights(c, seed=11)
    hf_cfg = dict(c.to_hf_dict(), torch_dtype="float32")
    kind = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}[c.arch]
    cfg_cls, model_cls = getattr(transformers, f"{kind}Config"), getattr(transformers, f"{kind}ForCausalLM")
    hf_cfg.pop("architectures"), hf_cfg.pop("model_type")
    config = cfg_cls(**hf_cfg)
    config._attn_implementation = "eager"
    model = model_cls(config).double().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.astype(np.float64))
                                                 for k, v in w.items()}, strict=False)
    assert not unexpected
    assert set(missing) <= ({"lm_head.weight"} if c.tie_word_embeddings else set())
    ours = _ignis_steps(run_pipeline(build_graph(c)).graph, w, STEPS)
    import inspect
    # transformers 5.x renamed past_key_values to cache
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    past = None
    with torch.no_grad():
        for got, ids in zip(ours, STEPS):
            out = model(input_ids=torch.tensor([ids]), use_cache=True, **{key: past})
            past = getattr(out, key)
            # transformers computes RMSNorm and the rotary angles in float32 even in a float64
            # model, so agreement is float32-tight, not float64-tight
            np.testing.assert_allclose(got, out.logits[0].numpy(), rtol=1e-4, atol=1e-5)


def test_qwen25_05b_has_the_seed_granularity():
    g = build_graph(qwen25_05b())
    verify(g)
    counts = g.op_counts()
    # the seed counts every op but the embedding lookup
    assert len(g) - counts["embed"] == 435 == 18 * 24 + 2 + 1
    assert counts == {"embed": 1, "rms_normalize": 49, "scale": 49, "linear": 24 * 7 + 1,
                      "rope": 48, "attention": 24, "add": 48, "silu": 24, "mul": 24}
    per_layer = [n for n in g.nodes if n.name.startswith("blk.3.")]
    assert [n.op for n in per_layer] == [
        "rms_normalize", "scale", "linear", "linear", "linear", "rope", "rope", "attention", "linear",
        "add", "rms_normalize", "scale", "linear", "linear", "silu", "mul", "linear", "add"]
    assert g.outputs["logits"].type.shape == ("T", 151936)
    assert "lm_head.weight" in g.weights


def test_llama_builds_without_biases_and_tied_head():
    c = tiny_config("llama")
    g = build_graph(c)
    verify(g)
    assert not [k for k in g.weights if k.endswith(".bias")]
    assert g.node("output").inputs[1].name == "model.embed_tokens.weight"
    assert set(g.weights) == set(weight_shapes(c))


def test_weight_shapes_use_hf_names_and_layouts():
    s = weight_shapes(qwen25_05b())
    assert s["model.layers.0.self_attn.k_proj.weight"] == (128, 896)
    assert s["model.layers.23.mlp.down_proj.weight"] == (896, 4864)
    assert s["model.layers.5.self_attn.q_proj.bias"] == (896,)
    assert s["lm_head.weight"] == (151936, 896)
    assert len(s) == 1 + 24 * 12 + 1 + 1


def test_unknown_architecture_is_a_typed_error():
    import dataclasses
    c = dataclasses.replace(tiny_config(), arch="mamba")
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        build_graph(c)


def test_pipeline_is_a_list_with_reasons():
    for e in PIPELINE:
        assert e.reason, e.name
        mod = __import__(e.fn.__module__, fromlist=["x"])
        assert mod.__doc__ and "Requires" in mod.__doc__ and "Guarantees" in mod.__doc__, e.name


@pytest.mark.parametrize("fixture", ["tiny_qwen2_dir", "tiny_llama_dir"])
def test_graph_runs_on_weights_from_the_loader(fixture, request):
    """The tiny Hugging Face-layout models the loader tests use: the names the builder asks for
    are the names the checkpoint has, and the compiled graph computes the reference."""
    from ignis.loader.resolve import open_dir
    path = request.getfixturevalue(fixture)
    m = open_dir(path, name=fixture)
    try:
        w = {k: np.asarray(m.weights[k]) for k in weight_shapes(m.config)}
        assert {k: v.shape for k, v in w.items()} == weight_shapes(m.config)
        g = run_pipeline(build_graph(m.config)).graph
        ref = ReferenceQwen2(m.config, w)
        for got, ids in zip(_ignis_steps(g, w, STEPS), STEPS):
            np.testing.assert_allclose(got, ref.step(ids), rtol=1e-10, atol=1e-10)
    finally:
        m.weights.close()


def test_qwen3_norms_each_head_before_rope_and_the_qkv_fusion_leaves_it():
    c = CONFIGS["qwen3-tied"]
    g = build_graph(c)
    verify(g)
    assert [n.op for n in g.nodes if n.name.startswith("blk.1.")] == [
        "rms_normalize", "scale", "linear", "linear", "linear", "rmsnorm_heads", "rmsnorm_heads",
        "rope", "rope", "attention", "linear", "add", "rms_normalize", "scale", "linear", "linear",
        "silu", "mul", "linear", "add"]
    assert g.node("blk.0.attn_k_norm").inputs[1].name == "model.layers.0.self_attn.k_norm.weight"
    assert not [k for k in g.weights if k.endswith(".bias")] and not g.constants
    # the norm sits between projection and rope: the q/k/v fusion does not match there (a follow-up
    # may fuse it); the others do
    counts = run_pipeline(g).graph.op_counts()
    assert counts["rmsnorm_heads"] == 2 * c.n_layers and counts["rope"] == 2 * c.n_layers
    assert "linear_qkv_rope" not in counts and counts["linear_swiglu"] == c.n_layers


def test_llama3_rope_reads_the_config_table_through_every_fusion():
    from ignis.models.qwen2 import INV_FREQ
    from ignis.models.rope import inv_freq
    from ignis.passes import select_passes
    c = CONFIGS["llama3-tied"]
    g = build_graph(c)
    assert list(g.constants) == [INV_FREQ] and np.array_equal(g.constants[INV_FREQ], inv_freq(c))
    assert all(n.inputs[2].name == INV_FREQ for n in g.nodes if n.op == "rope")
    assert "constant model.rotary_emb.inv_freq :: f32[16]" in str(g)
    opt = run_pipeline(g).graph
    fused = [n for n in opt.nodes if n.op == "linear_qkv_rope"]
    assert len(fused) == c.n_layers and all(n.inputs[-1].name == INV_FREQ for n in fused)
    folded = run_pipeline(g, [*PIPELINE[:-1], *select_passes(["fold_rmsnorm", "dce"])]).graph
    assert all(n.inputs[-1].name == INV_FREQ for n in folded.nodes if n.op == "rms_linear_qkv_rope")
    assert list(folded.constants) == [INV_FREQ]
    # plain RoPE needs no table: the kernels derive theta^(-2j/d) themselves
    assert not build_graph(CONFIGS["qwen2-tied"]).constants


def test_ropes_with_different_tables_do_not_fuse_and_the_tape_carries_the_table():
    from ignis.compiler import compile_step
    from ignis.ir.graph import GraphBuilder
    from ignis.ir.types import TensorType, i32
    from ignis.passes.fuse_qkv import fuse_qkv
    b = GraphBuilder("two-tables")
    h, pos = b.input("h", TensorType(("T", 8))), b.input("pos", i32("T"))
    gqa = dict(n_heads=2, n_kv_heads=1, head_dim=4)
    lin = {n: b.op("linear", h, b.weight(n, TensorType((8 if n == "q" else 4, 8))), name=n + ".l")
           for n in ("q", "k", "v")}
    q = b.op("rope", lin["q"], pos, b.constant("fa", np.ones(2)), name="rq", n_heads=2, head_dim=4,
             theta=1e4)
    k = b.op("rope", lin["k"], pos, b.constant("fb", np.full(2, 0.5)), name="rk", n_heads=1,
             head_dim=4, theta=1e4)
    b.output("y", b.op("attention", q, k, lin["v"], pos, name="attn", layer=0, **gqa))
    assert "attention_packed" not in fuse_qkv(b.finish()).op_counts()    # no match, no error
    step = compile_step(CONFIGS["llama3-tied"], max_batch_tokens=4, n_ctx=16)
    from ignis.models.qwen2 import INV_FREQ
    assert list(step.tape.constants) == [INV_FREQ] and INV_FREQ in step.tape.weights
    assert f"={INV_FREQ}" in step.tape.format().splitlines()[3]
