"""Qwen3 and Llama 3 against references nobody here wrote: tiny random-weight checkpoints made by
transformers' own classes (Qwen3ForCausalLM; LlamaForCausalLM with llama3 rope scaling, tied and
untied), saved with save_pretrained, loaded by ignis's loader: f32 logits at every position and
greedy continuations against transformers f32. The same weights through a GGUF written with the
`gguf` package (llama.cpp's q/k row order and rope_freqs.weight, as its converter writes them) and
ignis's import. Also the rope frequency tables against transformers' own functions."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ignis.loader.config import ModelConfig, RopeScaling
from ignis.loader.resolve import open_dir
from ignis.models.rope import inv_freq, plain_inv_freq, scaled_inv_freq
from hf_compare import PROMPT, Compiled, Interpreted
from hf_compare import all_positions as _all_positions, greedy as _greedy
from hf_compare import hf_greedy as _hf_greedy, reference as _reference, spread_weights

torch = pytest.importorskip("torch", reason="torch not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

VOCAB = 97
N_NEW = 20
MAX_ABS_LOGIT_DIFF = 1e-4       # f32 against f32: the two sum in different orders

# llama3 scaling with a short original context, so that at the test's positions all three regions
# matter: high frequencies kept, low ones divided by `factor`, the middle ones interpolated
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             max_position_embeddings=256, rms_norm_eps=1e-6)
CASES = {
    # head_dim 32 with 4 heads: q is 128 wide over a 64-wide model (independent of hidden/heads)
    "qwen3-tied": ("Qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3-untied": ("Qwen3", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                   tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "llama3-tied": ("Llama", dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                  tie_word_embeddings=True, rope_parameters=dict(LLAMA3_ROPE))),
    "llama3-untied": ("Llama", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE))),
}


def _hf_model(case: str):
    kind, kw = CASES[case]
    cfg = getattr(transformers, f"{kind}Config")(**SIZES, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(sorted(CASES).index(case))
    model = getattr(transformers, f"{kind}ForCausalLM")(cfg).eval()
    return spread_weights(model, norm=1.0, embed=0.5)


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
        c = files.config
        hf = model.config
        assert (c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == (
            hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
        assert c.tie_word_embeddings == hf.tie_word_embeddings
        assert ("lm_head.weight" in files.weights) != c.tie_word_embeddings
        if name.startswith("llama3"):
            assert c.arch == "llama" and c.rope_scaling == RopeScaling(
                "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
        else:
            assert c.arch == "qwen3" and c.rope_scaling is None and not c.attention_bias
    finally:
        files.weights.close()


def test_interpreter_logits_match_transformers_at_every_position(case):
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Interpreted(files.config, files.weights), ids, len(PROMPT))
    finally:
        files.weights.close()
    diff = float(np.abs(got - want).max())
    print(f"\n{name}: max abs logit diff vs transformers over {len(ids)} positions: {diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF


def test_interpreter_greedy_matches_transformers(case):
    name, model, path = case
    files = open_dir(path, name=name)
    try:
        got = _greedy(Interpreted(files.config, files.weights), N_NEW)
    finally:
        files.weights.close()
    assert got == _hf_greedy(model, N_NEW)


def test_the_rope_scaling_is_what_makes_llama3_agree(tmp_path):
    """Guards the test above against a scaling too weak to show: the same model read as plain
    RoPE is far from transformers at these positions."""
    import dataclasses
    model = _hf_model("llama3-tied")
    model.save_pretrained(tmp_path)
    files = open_dir(tmp_path, name="llama3")
    try:
        plain = dataclasses.replace(files.config, rope_scaling=None)
        got = _all_positions(Interpreted(plain, files.weights), PROMPT, 4)
    finally:
        files.weights.close()
    assert float(np.abs(got - _reference(model, PROMPT)).max()) > 100 * MAX_ABS_LOGIT_DIFF


# --- rope frequency tables --------------------------------------------------------------------

@pytest.mark.parametrize("theta", [1e4, 5e5, 1e6])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_plain_table_is_transformers_within_two_ulp(theta, head_dim):
    """The plain table is rounded as the C rope kernels round it (power in double, one rounding);
    torch's f32 power (transformers) differs by at most 2 ulp on some entries."""
    want = (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))).numpy()
    got = plain_inv_freq(theta, head_dim)
    assert got.dtype == np.float32
    assert np.abs(got.view(np.int32) - want.view(np.int32)).max() <= 2


def test_plain_table_is_the_c_kernels_arithmetic():
    # csrc/ops/nn.c: e = (float)(2j) / (float)d; inv = 1.0f / (float)pow((double)theta, (double)e)
    for theta in (1e4, 1e6, 5e5, 75000.0, 1234.5):
        for d in range(2, 258, 2):
            want = [np.float32(1) / np.float32(math.pow(float(np.float32(theta)),
                                                        float(np.float32(2 * j) / np.float32(d))))
                    for j in range(d // 2)]
            assert np.array_equal(plain_inv_freq(theta, d), np.array(want, np.float32)), (theta, d)


@pytest.mark.parametrize("rope_type,params", [
    ("llama3", dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)),
    ("llama3", dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)),
    ("llama3", dict(factor=8.0, low_freq_factor=0.5, high_freq_factor=3.0,
                    original_max_position_embeddings=64)),
    ("linear", dict(factor=4.0)),
])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_scaled_table_is_transformers_bitwise_from_the_same_base(rope_type, params, head_dim):
    """From the same plain table, the scaled one is transformers' _compute_<type>_parameters to
    the bit: each f32 operation in its order."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    theta = 500000.0
    cfg = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                   max_position_embeddings=131072,
                                   rope_parameters={"rope_type": rope_type, "rope_theta": theta, **params})
    want, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    assert scale == 1.0
    base = (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))).numpy()
    got = scaled_inv_freq(base, RopeScaling(rope_type, **params))
    assert np.array_equal(got, want.numpy())


def test_llama3_table_from_a_config():
    c = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 32, "vocab_size": 8,
        "max_position_embeddings": 256, "rope_parameters": dict(LLAMA3_ROPE)})
    t = inv_freq(c)
    base = plain_inv_freq(500000.0, 32)
    wavelen = 2 * np.pi / base.astype(np.float64)
    assert np.array_equal(t[wavelen < 16], base[wavelen < 16])              # kept
    assert np.array_equal(t[wavelen > 64], base[wavelen > 64] / np.float32(8))   # divided
    mid = (wavelen >= 16) & (wavelen <= 64)
    assert mid.any() and np.all((t[mid] < base[mid]) & (t[mid] > base[mid] / 8))


# --- the same weights through GGUF --------------------------------------------------------------

def _llama_cpp_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors for rope_type llama3,
    transcribed (its torch f32 base table, per-frequency factors, stored as F32). The converter
    reads original_max_position_embeddings from the top level of config.json (8192 when absent,
    which is Llama 3.x's value); these tiny models carry theirs in the rope object."""
    base = rope["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


_GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
               "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gguf_of(model, path: Path, qtype=None) -> None:
    """The model as llama.cpp's converter would write it, in F32 or with its matrices in `qtype`
    (names written out here, llama q/k rows permuted, Llama 3's rope_freqs.weight), with a small
    byte-level vocabulary."""
    import gguf
    from test_gguf_import import llama_permute
    c = model.config
    arch = c.model_type
    w = gguf.GGUFWriter(path, arch)
    for key, v in [("block_count", c.num_hidden_layers), ("context_length", c.max_position_embeddings),
                   ("embedding_length", c.hidden_size), ("feed_forward_length", c.intermediate_size),
                   ("attention.head_count", c.num_attention_heads),
                   ("attention.head_count_kv", c.num_key_value_heads),
                   ("attention.key_length", c.head_dim), ("attention.value_length", c.head_dim),
                   ("rope.dimension_count", c.head_dim)]:
        w.add_uint32(f"{arch}.{key}", v)
    w.add_float32(f"{arch}.rope.freq_base", c.rope_parameters["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", [chr(0x41 + i % 26) * (1 + i // 26) for i in range(VOCAB)])
    w.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    w.add_array("tokenizer.ggml.merges", ["A A"])
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if c.rope_parameters["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", _llama_cpp_rope_factors(c.rope_parameters, c.head_dim))
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.numpy().astype(np.float32)
        top = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
               "model.norm.weight": "output_norm.weight"}
        if name in top:
            g = top[name]
        else:
            _, _, i, rest = name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            g = f"blk.{i}.{_GGUF_LAYER[mod]}.{kind}"
            if arch == "llama" and mod in ("self_attn.q_proj", "self_attn.k_proj"):
                a = llama_permute(a, c.num_attention_heads if "q_proj" in mod else c.num_key_value_heads)
        if qtype is not None and a.ndim == 2:
            w.add_tensor(g, gguf.quants.quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_case(case, tmp_path_factory):
    """(case name, the transformers model, the directory ignis imported from its GGUF)."""
    from ignis.loader.gguf_import import import_gguf
    name, model, _ = case
    tmp = tmp_path_factory.mktemp(name + "-gguf")
    write_gguf_of(model, tmp / "m.gguf")
    return name, model, import_gguf(tmp / "m.gguf", tmp / "imported", progress=False)


def test_gguf_import_logits_match_transformers(gguf_case):
    name, model, path = gguf_case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    files = open_dir(path, name=name)
    try:
        c = files.config
        assert c.arch == model.config.model_type
        if name.startswith("llama3"):     # the file's rope_freqs.weight, read as data
            assert c.rope_scaling.type == "freq_factors" and len(c.rope_scaling.freq_factors) == c.head_dim // 2
        got = _all_positions(Interpreted(c, files.weights), ids, len(PROMPT))
        greedy = _greedy(Interpreted(c, files.weights), N_NEW)
    finally:
        files.weights.close()
    diff = float(np.abs(got - _reference(model, ids)).max())
    print(f"\n{name} via GGUF: max abs logit diff vs transformers over {len(ids)} positions: {diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF
    assert greedy == ids[len(PROMPT):]



# --- the compiled step on the C executor, in every weight format ------------------------------

def test_engine_f32_logits_and_greedy_match_transformers(case):
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Compiled(files), ids, len(PROMPT))
        greedy = _greedy(Compiled(files), N_NEW)
    finally:
        files.weights.close()
    diff = float(np.abs(got - _reference(model, ids)).max())
    print(f"\n{name} engine f32: max abs logit diff vs transformers over {len(ids)} positions: {diff:.2e}")
    assert diff <= MAX_ABS_LOGIT_DIFF
    assert greedy == ids[len(PROMPT):]


# weight format: (least top-1 agreement with transformers f32 at the positions, largest relative
# change of the sequence's perplexity): tests/test_runtime_model.py's bounds for the real model
NARROW = {"bf16": (0.95, 0.02), "q8": (0.95, 0.02)}


def _ppl(logits: np.ndarray, ids: list[int]) -> float:
    x = logits[:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


@pytest.mark.parametrize("fmt", list(NARROW))
def test_engine_narrow_formats_agree_with_transformers(case, fmt):
    name, model, path = case
    ids = PROMPT + _hf_greedy(model, N_NEW)
    want = _reference(model, ids)
    files = open_dir(path, name=name)
    try:
        got = _all_positions(Compiled(files, weight_format=fmt), ids, len(PROMPT))
    finally:
        files.weights.close()
    rate = float((got.argmax(1) == want.argmax(1)).mean())
    change = _ppl(got, ids) / _ppl(want, ids) - 1
    print(f"\n{name} engine {fmt}: top-1 agreement {rate:.3f}, perplexity {100 * change:+.2f}%, "
          f"max abs logit diff {float(np.abs(got - want).max()):.2e}")
    assert rate >= NARROW[fmt][0] and abs(change) <= NARROW[fmt][1]


def test_engine_runs_a_q8_0_gguf_in_its_own_blocks(case, tmp_path):
    """The matrices as Q8_0 blocks: the f32 engine on the import equals transformers given the
    same (dequantized) weights within 1e-4; the file's own blocks (weight_format="gguf") within
    tests/test_runtime_model.py's bound for them, greedy identical."""
    import gguf
    from ignis.loader.gguf_import import import_gguf
    from ignis.loader.safetensors import load_checkpoint
    name, model, _ = case
    write_gguf_of(model, tmp_path / "m.gguf", qtype=gguf.GGMLQuantizationType.Q8_0)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    deq = _hf_model(name)
    with load_checkpoint(out) as ws:
        state = {k: torch.from_numpy(np.array(ws[k])) for k in ws}
    missing, unexpected = deq.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = PROMPT + _hf_greedy(deq, N_NEW)
    want = _reference(deq, ids)
    files = open_dir(out, name=name)
    try:
        f32 = _all_positions(Compiled(files), ids, len(PROMPT))
        blocks = _all_positions(Compiled(files, weight_format="gguf"), ids, len(PROMPT))
        greedy = _greedy(Compiled(files, weight_format="gguf"), N_NEW)
    finally:
        files.weights.close()
    d32, dblk = float(np.abs(f32 - want).max()), float(np.abs(blocks - want).max())
    print(f"\n{name} Q8_0 GGUF: engine f32 {d32:.2e}, engine gguf blocks {dblk:.2e} max abs logit diff")
    assert d32 <= MAX_ABS_LOGIT_DIFF and dblk <= 5e-3
    assert greedy == ids[len(PROMPT):]


@pytest.mark.parametrize("which", ["qwen3-tied", "llama3-tied"])
def test_a_checkpoint_directory_generates_through_ignis_load(tmp_path, which):
    """The user's path: a Qwen3 / Llama 3 (llama3 rope scaling, tied embeddings) checkpoint
    directory transformers saved, with a tokenizer beside it, through ignis.load and
    Model.generate (greedy) against transformers' greedy ids."""
    import ignis
    from tiny_models import TOKENIZER_DATA
    import shutil
    kind, kw = CASES[which]
    cfg = getattr(transformers, f"{kind}Config")(**{**SIZES, "vocab_size": 272}, **kw)
    torch.manual_seed(5)
    model = spread_weights(getattr(transformers, f"{kind}ForCausalLM")(cfg).eval(), norm=1.0,
                           embed=0.5)
    model.save_pretrained(tmp_path)
    shutil.copy(TOKENIZER_DATA / "tiny-tokenizer.json", tmp_path / "tokenizer.json")
    shutil.copy(TOKENIZER_DATA / "tiny-tokenizer_config.json", tmp_path / "tokenizer_config.json")
    m = ignis.load(str(tmp_path), n_ctx=64, threads=1)
    try:
        ids = m.tokenize("def main():", add_special_tokens=False)
        r = m.generate(ids, max_tokens=16, temperature=0, ignore_eos=True)
    finally:
        m.weights.close()
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16,
                              do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(ids):]
    assert r.token_ids == want.tolist()
