"""Gemma 3 against references nobody here wrote: tiny random-weight checkpoints made by transformers'
own Gemma3ForCausalLM (Gemma3TextConfig with sliding windows shorter than the prompt, sliding and
global layers mixed, each with its rope, a query_pre_attn_scalar that is not head_dim, tied
embeddings), saved with save_pretrained and loaded by ignis's loader: f32 logits at every position
(a prefill, then one token per step, past the window) and greedy continuations against transformers
f32, on the interpreter and the C executor. The same weights through a GGUF written as llama.cpp's
converter writes Gemma 3 (norms stored as 1 + w) and ignis's import. Config refusals."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ignis.errors import ConfigError
from ignis.loader.config import ModelConfig, RopeScaling
from ignis.loader.resolve import open_dir
from ignis.models import FAMILIES
from hf_compare import N_CTX, PROMPT, Compiled, Interpreted
from hf_compare import all_positions as _all_positions, greedy as _greedy
from hf_compare import hf_greedy as _hf_greedy, reference as _reference, spread_weights

torch = pytest.importorskip("torch", reason="torch not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

VOCAB = 97
N_NEW = 20
MAX_ABS_LOGIT_DIFF = 1e-4       # f32 against f32: the two sum in different orders

SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, max_position_embeddings=256,
             rms_norm_eps=1e-6)
CASES = {
    # layer_types given; window 7 over a 40-token sequence; 24 is not head_dim 32
    "gemma3-mixed": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         sliding_window=7, query_pre_attn_scalar=24,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                      "sliding_attention"],
                         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                          "sliding_attention": {"rope_type": "default",
                                                                "rope_theta": 1e4}}),
    # the layer types from sliding_window_pattern (every 3rd layer global), linear rope scaling on
    # the global layers only, MQA, window 5
    "gemma3-pattern": dict(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16, sliding_window=5, query_pre_attn_scalar=16,
                           sliding_window_pattern=3,
                           rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                               "rope_theta": 1e5},
                                            "sliding_attention": {"rope_type": "default",
                                                                  "rope_theta": 1e4}}),
}


def _hf_model(case: str, **over):
    cfg = transformers.Gemma3TextConfig(**SIZES, **{**CASES[case], **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(sorted(CASES).index(case))
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    # Gemma's norms scale by 1 + w (norm=0); the embedding is multiplied by sqrt(hidden) = 8
    return spread_weights(model, norm=0.0, embed=0.1)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(case name, the transformers model, its save_pretrained directory)."""
    model = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


def test_config_reads_what_transformers_saved(case):
    name, model, path = case
    files = open_dir(path, name=name)
    try:
        c, hf = files.config, model.config
        assert c.arch == "gemma3" and c.tie_word_embeddings and "lm_head.weight" not in files.weights
        assert c.layer_types == tuple(hf.layer_types)
        assert c.sliding_window == hf.sliding_window
        assert c.query_pre_attn_scalar == hf.query_pre_attn_scalar
        assert c.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"]
        assert c.rope_local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
        if name == "gemma3-pattern":
            assert c.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
            assert c.rope_scaling == RopeScaling("linear", factor=4.0)
    finally:
        files.weights.close()


def test_interpreter_logits_match_transformers_at_every_position(case):
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Interpreted(files.config, files.weights), ids, len(PROMPT))
        greedy = _greedy(Interpreted(files.config, files.weights), N_NEW)
    finally:
        files.weights.close()
    diff = float(np.abs(got - want).max())
    print(f"\n{name}: interpreter max abs logit diff vs transformers over {len(ids)} positions: "
          f"{diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF
    assert greedy == ids[len(PROMPT):]


@pytest.mark.parametrize("kernels", [None, "generic"])
def test_engine_f32_logits_and_greedy_match_transformers(case, kernels):
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Compiled(files, kernels=kernels), ids, len(PROMPT))
        one = _all_positions(Compiled(files, kernels=kernels, threads=1), ids, len(PROMPT))
        greedy = _greedy(Compiled(files, kernels=kernels), N_NEW)
    finally:
        files.weights.close()
    diff = float(np.abs(got - want).max())
    print(f"\n{name} engine f32 ({kernels or 'best'} kernels): max abs logit diff vs transformers "
          f"over {len(ids)} positions: {diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF
    assert np.array_equal(got.view(np.uint32), one.view(np.uint32))    # threads change no bit
    assert greedy == ids[len(PROMPT):]


def test_sliding_layers_keep_a_ring_and_agree_bit_for_bit(case):
    """With steps of at most 4 tokens, a sliding layer's KV cache is a ring of window + 4 positions
    (memory grows with the context on global layers only), wrapped several times over the 40
    positions: logits within 1e-4 of transformers, greedy identical, and bit for bit those of an
    engine that keeps every position (the keys are read in the same order), 1 and N threads."""
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    files = open_dir(path, name=name)
    try:
        c = files.config
        ring = _all_positions(Compiled(files, max_batch_tokens=4), ids, len(PROMPT))
        one = _all_positions(Compiled(files, max_batch_tokens=4, threads=1), ids, len(PROMPT))
        full = _all_positions(Compiled(files), ids, len(PROMPT))       # 7 + 64 > 64: no ring
        greedy = _greedy(Compiled(files, max_batch_tokens=4), N_NEW)
        from ignis.runtime import Engine
        small, large = (Engine(files, n_ctx=n, max_batch_tokens=4).nbytes for n in (64, 128))
    finally:
        files.weights.close()
    diff = float(np.abs(ring - _reference(model, ids)).max())
    print(f"\n{name} engine f32 with ring caches: max abs logit diff vs transformers over "
          f"{len(ids)} positions: {diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF and greedy == ids[len(PROMPT):]
    assert np.array_equal(ring.view(np.uint32), full.view(np.uint32))
    assert np.array_equal(ring.view(np.uint32), one.view(np.uint32))
    # 64 more positions cost KV memory on the global layers only (and a score row per head)
    n_global = sum(t == "full_attention" for t in c.layer_types)
    per_position = 2 * c.kv_dim * 4
    assert large - small <= 64 * (n_global * per_position + 4 * c.n_heads) + 4096
    assert large - small < 64 * c.n_layers * per_position


def test_kv_cache_size_check_counts_the_rings_as_the_executor_allocates_them(case, monkeypatch):
    """check_n_ctx's estimate (kv_cache_bytes) grows with n_ctx exactly as the C executor's
    allocation does: only the global layers grow once the sliding layers are rings; and a machine
    too small for the cache is told the largest n_ctx that fits, counting the rings."""
    from ignis.runtime import Engine
    from ignis.runtime import engine as engine_mod
    from ignis.runtime.errors import RuntimeInputError
    name, model, path = case
    files = open_dir(path, name=name)
    try:
        c = files.config
        sizes = {n: Engine(files, n_ctx=n, max_batch_tokens=4, kv_dtype="f32").nbytes
                 for n in (64, 128)}
        est = {n: engine_mod.kv_cache_bytes(c, n, max_batch_tokens=4) for n in (64, 128)}
        rows = engine_mod.kv_cache_rows(c, 128, max_batch_tokens=4)
        # window + max_batch_tokens, in whole blocks of 16 rows (the key cache's layout)
        ring = -(-(c.sliding_window + 4) // 16) * 16
        assert rows == [128 if t == "full_attention" else ring for t in c.layer_types]
        # the executor's block also holds a score row per head and position: bound it
        grow = (sizes[128] - sizes[64]) - (est[128] - est[64])
        assert 0 <= grow <= 64 * 4 * c.n_heads + 4096
        have = est[128] + 2 * c.kv_dim * 4 * 20       # room for 20 more global positions (1 layer)
        monkeypatch.setattr(engine_mod, "machine_memory_bytes", lambda: have)
        n_global = sum(t == "full_attention" for t in c.layer_types)
        # the global layers grow by whole blocks of 16 positions
        fits = 128 + 16 * (20 // (16 * n_global))
        with pytest.raises(RuntimeInputError, match=rf"use n_ctx <= {fits}\b") as ei:
            Engine(files, n_ctx=200, max_batch_tokens=4, kv_dtype="f32")
        assert "sliding-window layers x" in str(ei.value)
    finally:
        files.weights.close()


def test_a_ring_engine_steps_back_only_as_far_as_its_rings_allow(case):
    """truncate: back by at most max_batch_tokens positions the rings still hold the window, and
    the continuation equals a fresh run bit for bit; further back the engine keeps nothing
    (n_past 0) instead of reading overwritten rows."""
    from ignis.runtime import Engine
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    files = open_dir(path, name=name)
    try:
        fresh = Engine(files, n_ctx=N_CTX, max_batch_tokens=4)
        want = fresh.forward(np.array(ids, np.int32), logits_for="all")
        eng = Engine(files, n_ctx=N_CTX, max_batch_tokens=4)
        eng.forward(np.array(ids, np.int32))
        eng.truncate(len(ids) - 4)
        assert eng.n_past == len(ids) - 4
        got = eng.forward(np.array(ids[-4:], np.int32), logits_for="all")
        assert np.array_equal(got.view(np.uint32), want[-4:].view(np.uint32))
        eng.truncate(len(ids) - 5)
        assert eng.n_past == 0
    finally:
        files.weights.close()


def test_the_window_is_what_makes_the_sliding_layers_agree(case):
    """Guards the tests above: read with the window off (every layer global), the same weights are
    far from transformers past the window; with every layer as the global layers' rope, too."""
    import dataclasses
    name, model, path = case
    files = open_dir(path, name=name)
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    try:
        c = files.config
        no_window = dataclasses.replace(c, sliding_window=10 ** 6)
        one_rope = dataclasses.replace(c, rope_local_theta=c.rope_theta)
        for wrong in (no_window, one_rope):
            got = _all_positions(Interpreted(wrong, files.weights), ids, len(PROMPT))
            assert float(np.abs(got - want).max()) > 100 * MAX_ABS_LOGIT_DIFF
    finally:
        files.weights.close()


@pytest.mark.parametrize("fmt", ["bf16", "q8"])
def test_engine_narrow_formats_agree_with_transformers(case, fmt):
    """tests/test_runtime_model.py's bounds: top-1 agreement >= 0.95 at every position."""
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Compiled(files, weight_format=fmt), ids, len(PROMPT))
    finally:
        files.weights.close()
    rate = float((got.argmax(1) == want.argmax(1)).mean())
    print(f"\n{name} engine {fmt}: top-1 agreement {rate:.3f}, max abs logit diff "
          f"{float(np.abs(got - want).max()):.2e}")
    assert rate >= 0.95


# --- the same weights through GGUF --------------------------------------------------------------

_GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gemma3_gguf(model, path: Path, qtype=None) -> None:
    """The model as llama.cpp's converter writes Gemma 3 (Gemma3Model in convert_hf_to_gguf.py):
    norm weights stored as w + 1, the window in attention.sliding_window, the layer pattern and
    the local rope base left to the runtime (llama.cpp: every 6th layer global, base 10000), a
    SentencePiece-style vocabulary. Matrices in `qtype` when given."""
    import gguf
    c = model.config
    w = gguf.GGUFWriter(path, "gemma3")
    for key, v in [("block_count", c.num_hidden_layers), ("context_length", c.max_position_embeddings),
                   ("embedding_length", c.hidden_size), ("feed_forward_length", c.intermediate_size),
                   ("attention.head_count", c.num_attention_heads),
                   ("attention.head_count_kv", c.num_key_value_heads),
                   ("attention.key_length", c.head_dim), ("attention.value_length", c.head_dim),
                   ("attention.sliding_window", c.sliding_window)]:
        w.add_uint32(f"gemma3.{key}", v)
    w.add_float32("gemma3.rope.freq_base", c.rope_parameters["full_attention"]["rope_theta"])
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "default")
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"▁t{i}" for i in range(4, VOCAB)]
    w.add_array("tokenizer.ggml.tokens", toks)
    w.add_array("tokenizer.ggml.scores", [0.0] * 4 + [-float(i) for i in range(4, VOCAB)])
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3, 2] + [1] * (VOCAB - 4))
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        a = t.numpy().astype(np.float32)
        top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        if name in top:
            g = top[name]
        else:
            _, _, i, rest = name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            g = f"blk.{i}.{_GGUF_LAYER[mod]}.{kind}"
        if name.endswith("norm.weight"):
            a = a + np.float32(1.0)         # llama.cpp: data_torch + 1 for Gemma's norms
        if qtype is not None and a.ndim == 2:
            w.add_tensor(g, gguf.quants.quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_model():
    """A model whose attention llama.cpp's fixed choices describe: 6 layers, the 6th global, local
    rope base 10000, query_pre_attn_scalar = head_dim; window 6 over the 40 positions."""
    return _hf_model("gemma3-mixed", num_hidden_layers=6, layer_types=None, sliding_window_pattern=6,
                     sliding_window=6, query_pre_attn_scalar=32)


def test_gguf_import_logits_and_greedy_match_transformers(tmp_path):
    from ignis.loader.gguf_import import import_gguf
    model = _gguf_model()
    write_gemma3_gguf(model, tmp_path / "m.gguf")
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(out, name="gemma3-gguf")
    try:
        c = files.config
        assert c.arch == "gemma3" and c.layer_types == tuple(model.config.layer_types)
        assert (c.sliding_window, c.rope_local_theta, c.query_pre_attn_scalar) == (6, 1e4, 32.0)
        interp = _all_positions(Interpreted(c, files.weights), ids, len(PROMPT))
        engine = _all_positions(Compiled(files), ids, len(PROMPT))
        greedy = _greedy(Compiled(files), N_NEW)
    finally:
        files.weights.close()
    for what, got in (("interpreter", interp), ("engine", engine)):
        diff = float(np.abs(got - want).max())
        print(f"\ngemma3 via GGUF, {what}: max abs logit diff vs transformers over {len(ids)} "
              f"positions: {diff:.2e}")
        assert diff <= MAX_ABS_LOGIT_DIFF
    assert greedy == ids[len(PROMPT):]


def test_gguf_norms_are_imported_as_transformers_reads_them(tmp_path):
    """The import subtracts the 1 llama.cpp added, in f32 (transformers' Gemma2TensorProcessor),
    so the imported checkpoint holds the weights transformers loads from the same file."""
    from ignis.loader.gguf_import import import_gguf
    from ignis.loader.safetensors import load_checkpoint
    model = _gguf_model()
    write_gemma3_gguf(model, tmp_path / "m.gguf")
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    state = model.state_dict()
    with load_checkpoint(out) as ws:
        for name in ws:
            a = state[name].numpy()
            want = (a + np.float32(1)) - np.float32(1) if name.endswith("norm.weight") else a
            assert np.array_equal(np.asarray(ws[name]), want), name


def test_engine_runs_a_q8_0_gemma3_gguf_in_its_own_blocks(tmp_path):
    """The matrices as Q8_0 blocks: the file's own blocks (weight_format="gguf") against
    transformers on the dequantized weights, within test_models_hf's bound for them, greedy
    identical."""
    import gguf
    from ignis.loader.gguf_import import import_gguf
    from ignis.loader.safetensors import load_checkpoint
    model = _gguf_model()
    write_gemma3_gguf(model, tmp_path / "m.gguf", qtype=gguf.GGMLQuantizationType.Q8_0)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    deq = _gguf_model()
    with load_checkpoint(out) as ws:
        deq.load_state_dict({k: torch.from_numpy(np.array(ws[k])) for k in ws}, strict=False)
    ids = PROMPT + _hf_greedy(deq, N_NEW)
    want = _reference(deq, ids)
    files = open_dir(out, name="gemma3-q8_0")
    try:
        f32 = _all_positions(Compiled(files), ids, len(PROMPT))
        blocks = _all_positions(Compiled(files, weight_format="gguf"), ids, len(PROMPT))
        greedy = _greedy(Compiled(files, weight_format="gguf"), N_NEW)
    finally:
        files.weights.close()
    d32, dblk = float(np.abs(f32 - want).max()), float(np.abs(blocks - want).max())
    print(f"\ngemma3 Q8_0 GGUF: engine f32 {d32:.2e}, engine gguf blocks {dblk:.2e} max abs logit diff")
    assert d32 <= MAX_ABS_LOGIT_DIFF and dblk <= 5e-3
    assert greedy == ids[len(PROMPT):]


# --- config.json ----------------------------------------------------------------------------

def _cfg(**over):
    d = transformers.Gemma3TextConfig(**SIZES, **CASES["gemma3-mixed"]).to_dict()
    d["architectures"] = ["Gemma3ForCausalLM"]
    d.update(over)
    return d


def test_the_real_270m_config_keys_are_all_known():
    """The keys of the released gemma-3-270m config.json (transformers 4 spelling: rope_theta,
    rope_local_base_freq, rope_scaling null, sliding_window_pattern)."""
    import warnings
    d = {"_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
         "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
         "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
         "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
         "intermediate_size": 2048, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
         "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
         "num_hidden_layers": 6, "num_key_value_heads": 1, "pad_token_id": 0,
         "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
         "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
         "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0", "use_bidirectional_attention": False,
         "use_cache": True, "vocab_size": 262144}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = ModelConfig.from_dict(d)
    assert (c.rope_theta, c.rope_local_theta, c.sliding_window) == (1e6, 1e4, 512)
    assert c.layer_types[5] == "full_attention" and c.query_pre_attn_scalar == 256


def test_a_rope_base_given_twice_alike_is_fine():
    c = ModelConfig.from_dict(_cfg(rope_theta=_cfg()["rope_parameters"]["full_attention"]["rope_theta"],
                                   rope_local_base_freq=_cfg()["rope_parameters"]["sliding_attention"]
                                   ["rope_theta"]))
    assert c == ModelConfig.from_dict(_cfg())


def test_what_transformers_writes_round_trips():
    c = ModelConfig.from_dict(_cfg(torch_dtype="float32"))
    again = ModelConfig.from_dict(c.to_hf_dict())
    assert again == c


@pytest.mark.parametrize("over,match", [
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping 30.0 asks for final logit softcapping"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping 50.0 asks for attention logit"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention True asks for bidirectional"),
    (dict(hidden_activation="gelu"), "hidden_activation 'gelu' is not supported on a gemma3 model"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings false on a Gemma 3 model"),
    (dict(attention_bias=True), "attention_bias True on a Gemma 3 model"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                 "rope_theta": 1e4}}),
     "a rope scaling on the sliding-window layers is not implemented"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}}),
     "rope_parameters.full_attention asks for rope_type 'yarn'"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types has 3 entries for 4 layers"),
    # one base given twice with different values: transformers 4 and 5 would pick different ones
    (dict(rope_theta=5e5), r"full_attention layers' rope base twice .*rope_theta=500000.0"),
    (dict(rope_local_base_freq=2e4), r"sliding_attention layers' rope base twice"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                           "foo": {}}), r"mixes layer types \(full_attention\) with other keys \(foo\)"),
    (dict(sliding_window=0), "'sliding_window' must be a positive integer"),
])
def test_config_refusals_name_what_ignis_does_not_run(over, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(_cfg(**over))


def test_another_architecture_is_refused_in_one_line():
    from ignis.errors import UnsupportedArchitectureError
    with pytest.raises(UnsupportedArchitectureError, match="architecture 'Gemma2ForCausalLM' is not "
                                                           "supported; ignis supports: .*Gemma3ForCausalLM"):
        ModelConfig.from_dict(_cfg(architectures=["Gemma2ForCausalLM"], model_type="gemma2"))


# --- the registry entry, and a model without a chat template -----------------------------------

def test_registry_entry_is_the_file_the_tokenizer_tests_pin():
    from gemma_gguf import GEMMA3_270M
    from ignis.loader import registry
    e = registry.REGISTRY["gemma3-270m"]
    assert (e.arch, e.parts, e.size, e.sha256) == (GEMMA3_270M.arch, GEMMA3_270M.parts,
                                                   GEMMA3_270M.size, GEMMA3_270M.sha256)
    assert e.arch in FAMILIES and "Gemma Terms of Use" in e.description


def test_chat_on_a_model_without_a_template_names_what_is_missing(tiny_chat_dir, tmp_path):
    """A base model (Gemma 3 270M has no chat template) completes raw text; chat messages get one
    clear error naming the model and the missing template, as a 400-class parameter error."""
    import json
    import shutil
    import ignis
    from ignis.generate.errors import InvalidParameterError
    base = tmp_path / "base-model"
    shutil.copytree(tiny_chat_dir, base)
    tc = json.loads((base / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(tc))
    m = ignis.load(str(base), n_ctx=64, threads=1)
    try:
        assert not m.tokenizer.chat_template
        assert m.generate("hello", max_tokens=2, temperature=0).token_ids
        with pytest.raises(InvalidParameterError, match="has no chat template") as e:
            m.chat([{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.code == "no_chat_template" and e.value.param == "messages"
        assert "'base-model'" in str(e.value)
    finally:
        m.weights.close()


def test_every_field_of_the_installed_gemma3_config_is_classified():
    """As test_loader_hardening does for Qwen2/Qwen3/Llama: a key a new transformers adds to
    Gemma3TextConfig fails here until it is read, refused or known harmless."""
    import dataclasses
    from ignis.loader.config import CONFIG_KEYS_HARMLESS, CONFIG_KEYS_IMPLEMENTED, CONFIG_KEYS_REFUSED
    known = (CONFIG_KEYS_IMPLEMENTED | CONFIG_KEYS_HARMLESS | CONFIG_KEYS_REFUSED.keys()
             | FAMILIES["gemma3"].config_keys)
    cls = transformers.Gemma3TextConfig
    fields = {f.name for f in dataclasses.fields(cls)} | set(cls().to_dict())
    fields |= set(transformers.GenerationConfig._get_default_generation_params())
    assert not sorted(fields - known)
    assert not FAMILIES["gemma3"].config_keys & CONFIG_KEYS_REFUSED.keys() - {"query_pre_attn_scalar"}


def test_prefix_reuse_on_a_ring_engine_recomputes_what_the_rings_lost(case):
    """The generation loop's prefix cache (generate/loop.py) asks the engine to step back to the
    longest common prefix; on a ring engine it continues from what the engine kept: logits of
    each prompt equal a fresh engine's, bit for bit."""
    from ignis.generate.loop import KVSession
    from ignis.runtime import Engine
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    files = open_dir(path, name=name)
    try:
        session = KVSession(Engine(files, n_ctx=N_CTX, max_batch_tokens=4))
        for prompt in (ids, ids[:-2] + [5, 6], ids[:12] + [7] * 9, ids[:13]):
            got = session.prefill(prompt)
            want = Engine(files, n_ctx=N_CTX, max_batch_tokens=4).forward(np.array(prompt, np.int32))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert session.last_reused == 0           # 12 of the 21 cached: too far back for the rings
    finally:
        files.weights.close()


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_a_copied_ring_slot_continues_bit_for_bit(case, kv_dtype):
    """copy_slot on a ring engine (window + 4 rows per sliding layer, wrapped by the 20-token
    prompt): the copied slot then decodes bit for bit as a slot that ran the prompt itself; a
    source that ran on past what its rings keep of the prefix is refused."""
    from ignis.runtime import Engine, RuntimeInputError
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, 6)
    files = open_dir(path, name=name)
    try:
        n = len(PROMPT)
        eng = Engine(files, n_ctx=N_CTX, max_batch_tokens=4, n_seq=3, kv_dtype=kv_dtype)
        ref = Engine(files, n_ctx=N_CTX, max_batch_tokens=4, kv_dtype=kv_dtype)
        assert eng._ring
        eng.forward(np.array(ids[:9], np.int32), seq=1)      # slot 1 held another sequence
        eng.forward(np.array(PROMPT[:-1], np.int32), seq=0)
        eng.copy_slot(1, 0, n - 1)
        want = ref.forward(np.array(PROMPT[:-1], np.int32))
        want = ref.forward(np.array(ids[n - 1:], np.int32), logits_for="all")
        got = eng.forward(np.array(ids[n - 1:], np.int32), logits_for="all", seq=1)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        eng.forward(np.array(ids[n - 1:], np.int32), seq=0)  # slot 0 ran 7 past n - 1
        with pytest.raises(RuntimeInputError, match="ring that no longer has all of the first"):
            eng.copy_slot(2, 0, n - 4)
        eng.copy_slot(2, 0, len(ids) - 4)                    # 4 back: the rings still hold it
        got = eng.forward(np.array(ids[-4:], np.int32), logits_for="all", seq=2)
        assert np.array_equal(got.view(np.uint32), want[-4:].view(np.uint32))
    finally:
        files.weights.close()
