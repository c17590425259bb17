"""GGUF -> Hugging Face directory import, on small synthetic GGUFs written with the `gguf` package's
own writer (and quantizers): every quant type the registry uses, the Llama Q/K un-permutation,
atomicity, and refusal of malformed files. References are `gguf`'s writer and dequantizer."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ignis.errors import GGUFError
from ignis.loader import gguf_import
from ignis.loader.config import GenerationConfig, ModelConfig
from ignis.loader.gguf_import import ImportTargetExistsError, import_gguf
from ignis.loader.safetensors import load_checkpoint
from ignis.models import FAMILIES

# dim and hidden are multiples of 256 so the K-quants (256-element blocks) can hold every matrix.
DIM, HIDDEN, HEADS, KV_HEADS, VOCAB, LAYERS = 256, 512, 4, 2, 64, 2
HEAD_DIM = DIM // HEADS


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py `permute` does to q/k rows (written from its
    description: rows viewed as (n_head, 2, head_dim/2) with the last two row axes swapped)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant_bytes(rng: np.random.Generator, qtype: QT, rows: int, cols: int) -> np.ndarray:
    """Valid random rows of a type gguf can dequantize but not quantize (RANDOM_BLOCK_TYPES): random
    bytes with the f16 (super-)block scales set to small finite values."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    scale = lambda n: rng.uniform(1e-3, 2e-2, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype in (QT.Q4_K, QT.Q5_K):      # d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
        b[:, 0:2] = scale(len(b))
        b[:, 2:4] = scale(len(b))
    elif qtype in (QT.Q6_K, QT.Q3_K):     # ql[128], qh[64], scales[16], d / hmask, qs, scales, d
        b[:, -2:] = scale(len(b))
    elif qtype == QT.IQ4_NL:    # d, qs[16]
        b[:, 0:2] = scale(len(b))
    elif qtype == QT.Q2_K:      # scales[16], qs[64], d, dmin
        b[:, -4:-2] = scale(len(b))
        b[:, -2:] = scale(len(b))
    elif qtype in (QT.IQ4_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S):
        b[:, 0:2] = scale(len(b))           # d first; grid indices and signs: any bytes
    elif qtype == QT.IQ1_M:     # qs[32], qh[16], scales[8]: d's 16 bits in the top nibbles
        d = scale(len(b)).view(np.uint16)[:, 0]
        sc = b[:, 48:56].view(np.uint16).copy()
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        b[:, 48:56] = sc.view(np.uint8)
    else:
        raise ValueError(qtype)
    return b.reshape(rows, cols // block * size)


# the types ignis imports through f32 (no layout holds them), each with its random-block maker
IQ_TYPES = (QT.IQ4_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M)
RANDOM_BLOCK_TYPES = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, *IQ_TYPES)


def hf_tensors(arch: str, *, tied: bool, layers: int = LAYERS, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.05
    t = {"model.embed_tokens.weight": r(VOCAB, DIM), "model.norm.weight": 1 + r(DIM)}
    if not tied:
        t["lm_head.weight"] = r(VOCAB, DIM)
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({
            p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, DIM),
            p + "self_attn.k_proj.weight": r(KV_HEADS * HEAD_DIM, DIM),
            p + "self_attn.v_proj.weight": r(KV_HEADS * HEAD_DIM, DIM),
            p + "self_attn.o_proj.weight": r(DIM, HEADS * HEAD_DIM),
            p + "input_layernorm.weight": 1 + r(DIM),
            p + "post_attention_layernorm.weight": 1 + r(DIM),
            p + "mlp.gate_proj.weight": r(HIDDEN, DIM),
            p + "mlp.up_proj.weight": r(HIDDEN, DIM),
            p + "mlp.down_proj.weight": r(DIM, HIDDEN),
        })
        if arch == "qwen3":
            t.update({p + "self_attn.q_norm.weight": 1 + r(HEAD_DIM),
                      p + "self_attn.k_norm.weight": 1 + r(HEAD_DIM)})
        if arch == "qwen2":
            t.update({p + "self_attn.q_proj.bias": r(HEADS * HEAD_DIM),
                      p + "self_attn.k_proj.bias": r(KV_HEADS * HEAD_DIM),
                      p + "self_attn.v_proj.bias": r(KV_HEADS * HEAD_DIM)})
    return t


# HF -> GGUF names, written out here (not taken from ignis) so a wrong mapping in ignis shows.
_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    mod, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{_TO_GGUF[mod]}.{kind}"


def write_gguf(path: Path, arch: str = "qwen2", *, tied: bool = True, qtype: QT = QT.F32,
               qtypes: dict[str, QT] | None = None, drop_keys: tuple[str, ...] = (),
               drop_tensors: tuple[str, ...] = (), extra_tensors: dict[str, np.ndarray] | None = None,
               layers: int = LAYERS, metadata: dict[str, object] | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Write a tiny model; return the HF-layout float tensors it was made from (pre-quantization)."""
    rng = np.random.default_rng(seed + 1)
    hf = hf_tensors(arch, tied=tied, layers=layers, seed=seed)
    w = gguf.GGUFWriter(path, arch)
    kv: dict[str, object] = {
        f"{arch}.block_count": layers, f"{arch}.context_length": 4096,
        f"{arch}.embedding_length": DIM, f"{arch}.feed_forward_length": HIDDEN,
        f"{arch}.attention.head_count": HEADS, f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.rope.freq_base": 1_000_000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 3,
    }
    kv.update(metadata or {})
    for k, v in kv.items():
        if k in drop_keys:
            continue
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    if "tokenizer.ggml.tokens" not in drop_keys:
        # A byte-level BPE vocabulary: single letters, two merged pairs, filler tokens.
        tokens = [chr(0x41 + i) for i in range(26)] + ["AB", "CD"]
        tokens += [f"t{i}" for i in range(len(tokens), VOCAB)]
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
        w.add_array("tokenizer.ggml.merges", ["A B", "C D"])
    for name, arr in hf.items():
        g = gguf_name(name)
        if g in drop_tensors:
            continue
        data = arr
        if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
            data = llama_permute(arr, HEADS if ".attn_q." in g else KV_HEADS)
        t = (qtypes or {}).get(g, qtype if arr.ndim == 2 else QT.F32)
        if t == QT.F32:
            w.add_tensor(g, np.ascontiguousarray(data))
        elif t == QT.F16:
            w.add_tensor(g, data.astype(np.float16))
        elif t == QT.F64:
            w.add_tensor(g, data.astype(np.float64))
        elif t in RANDOM_BLOCK_TYPES:
            w.add_tensor(g, random_kquant_bytes(rng, t, *data.shape), raw_dtype=t)
        else:
            w.add_tensor(g, gguf.quants.quantize(data, t), raw_dtype=t)
    for g, arr in (extra_tensors or {}).items():
        w.add_tensor(g, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def reference_tensors(path: Path) -> dict[str, np.ndarray]:
    """gguf's own dequantization of every tensor, by GGUF name, in numpy (= HF) dim order."""
    r = gguf.GGUFReader(path)
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
        tuple(reversed(t.shape.tolist()))) for t in r.tensors}


# --- the happy paths --------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q6_K, QT.Q8_0],
                         ids=lambda q: q.name)
def test_every_registry_quant_type_matches_gguf_dequantize(tmp_path, qtype):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", qtype=qtype, tied=False)
    out = import_gguf(src, tmp_path / "out", progress=False)
    ref = reference_tensors(src)
    with load_checkpoint(out) as ws:
        assert len(ws) == len(ref)
        for name in ws:
            a = ws[name]
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, ref[gguf_name(name)], err_msg=name)
    prov = json.loads((out / "ignis_import.json").read_text())
    assert prov["tensors"]["model.layers.0.mlp.up_proj.weight"]["gguf_type"] == qtype.name
    assert prov["tensors"]["model.norm.weight"]["gguf_type"] == "F32"


def test_quantized_import_is_close_to_the_original_weights(tmp_path):
    # Guards against a test above that compares two identically wrong arrays (e.g. both zeros).
    src = tmp_path / "m.gguf"
    hf = write_gguf(src, "qwen2", qtype=QT.Q8_0)
    with load_checkpoint(import_gguf(src, tmp_path / "out", progress=False)) as ws:
        for name, orig in hf.items():
            np.testing.assert_allclose(ws[name], orig, atol=2e-3, err_msg=name)


def test_config_and_generation_config(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", tied=True)
    defaults = {"eos_token_id": [2, 5], "do_sample": True, "temperature": 0.7, "top_p": 0.8,
                "top_k": 20, "repetition_penalty": 1.05}
    out = import_gguf(src, tmp_path / "out", progress=False, generation_defaults=defaults,
                      sha256="ab" * 32, model_name="tiny")
    c = ModelConfig.from_file(out / "config.json")
    assert (c.arch, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == \
        ("qwen2", DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM)
    assert c.vocab_size == VOCAB and c.tie_word_embeddings and c.attention_bias
    assert c.rope_theta == 1e6 and c.rms_norm_eps == 1e-6      # float32 metadata, clean decimals
    assert c.max_position_embeddings == 4096
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["Qwen2ForCausalLM"]
    g = GenerationConfig.from_file(out / "generation_config.json")
    assert g.eos_token_ids == (2, 5) and g.bos_token_id == 1 and g.pad_token_id == 3
    assert (g.do_sample, g.temperature, g.top_p, g.top_k, g.repetition_penalty) == (True, 0.7, 0.8, 20, 1.05)
    prov = json.loads((out / "ignis_import.json").read_text())
    assert prov["source"] == {"file": "m.gguf", "path": str(src.resolve()), "sha256": "ab" * 32,
                              "size": src.stat().st_size}
    assert prov["model"] == "tiny" and len(prov["tensors"]) == 2 + LAYERS * 12
    with load_checkpoint(out) as ws:
        assert "lm_head.weight" not in ws


def test_untied_model_gets_lm_head(tmp_path):
    src = tmp_path / "m.gguf"
    hf = write_gguf(src, "qwen2", tied=False)
    out = import_gguf(src, tmp_path / "out", progress=False)
    assert ModelConfig.from_file(out / "config.json").tie_word_embeddings is False
    with load_checkpoint(out) as ws:
        np.testing.assert_array_equal(ws["lm_head.weight"], hf["lm_head.weight"])
        assert set(ws) == set(hf)


def test_llama_qk_permutation_is_undone_exactly(tmp_path):
    src = tmp_path / "llama.gguf"
    hf = write_gguf(src, "llama", tied=True)
    out = import_gguf(src, tmp_path / "out", progress=False)
    c = ModelConfig.from_file(out / "config.json")
    assert c.arch == "llama" and not c.attention_bias
    with load_checkpoint(out) as ws:
        assert set(ws) == set(hf)
        for name, orig in hf.items():       # F32 storage: exact, including q (4 heads) and k (2)
            np.testing.assert_array_equal(ws[name], orig, err_msg=name)
    stored = reference_tensors(src)["blk.0.attn_q.weight"]
    assert not np.array_equal(stored, hf["model.layers.0.self_attn.q_proj.weight"])  # really permuted


def test_llama_permutation_with_quantized_rows(tmp_path):
    # Row permutation commutes with row-wise block quantization: the import must equal gguf's
    # dequantization with the rows put back.
    src = tmp_path / "llama.gguf"
    write_gguf(src, "llama", qtype=QT.Q4_1)
    ref = reference_tensors(src)
    inv = lambda w, h: w.reshape(h, w.shape[0] // h // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
    with load_checkpoint(import_gguf(src, tmp_path / "out", progress=False)) as ws:
        np.testing.assert_array_equal(ws["model.layers.1.self_attn.q_proj.weight"],
                                      inv(ref["blk.1.attn_q.weight"], HEADS))
        np.testing.assert_array_equal(ws["model.layers.1.self_attn.k_proj.weight"],
                                      inv(ref["blk.1.attn_k.weight"], KV_HEADS))
        np.testing.assert_array_equal(ws["model.layers.1.self_attn.v_proj.weight"],
                                      ref["blk.1.attn_v.weight"])


def test_qwen2_is_not_unpermuted(tmp_path):
    src = tmp_path / "m.gguf"
    hf = write_gguf(src, "qwen2")
    with load_checkpoint(import_gguf(src, tmp_path / "out", progress=False)) as ws:
        np.testing.assert_array_equal(ws["model.layers.0.self_attn.q_proj.weight"],
                                      hf["model.layers.0.self_attn.q_proj.weight"])


def test_tokenizer_files_load_in_hf_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    out = import_gguf(src, tmp_path / "out", progress=False)
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB
    assert tok.encode("ABCDE").ids == [26, 27, 4]      # "AB", "CD" merged, then "E"
    assert isinstance(json.loads((out / "tokenizer_config.json").read_text()), dict)


# --- atomicity --------------------------------------------------------------------------------

@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()],
                         ids=["exception", "keyboard-interrupt"])
def test_interrupted_import_leaves_nothing(tmp_path, monkeypatch, exc):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    real = gguf_import._read_tensor
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise exc
        return real(*a, **k)

    monkeypatch.setattr(gguf_import, "_read_tensor", failing)
    dest = tmp_path / "models" / "out"
    with pytest.raises(type(exc)):
        import_gguf(src, dest, progress=False)
    assert calls["n"] == 5
    assert not dest.exists()
    assert list((tmp_path / "models").iterdir()) == []      # no temp dir, no temp file


def test_existing_target_refused_unless_overwrite(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("x")
    with pytest.raises(ImportTargetExistsError):
        import_gguf(src, dest, progress=False)
    assert (dest / "keep").exists()
    import_gguf(src, dest, progress=False, overwrite=True)
    assert not (dest / "keep").exists() and (dest / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]   # old copy removed


# --- refusals ---------------------------------------------------------------------------------

def _refused(tmp_path: Path, src: Path, *match: str) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        import_gguf(src, tmp_path / "out", progress=False)
    msg = str(ei.value)
    assert src.name in msg, msg
    for m in match:
        assert m in msg, msg
    assert not (tmp_path / "out").exists()
    return ei.value


def test_bad_magic(tmp_path):
    src = tmp_path / "bad.gguf"
    src.write_bytes(b"GGML" + b"\0" * 64)
    _refused(tmp_path, src, "magic")


def test_empty_file(tmp_path):
    src = tmp_path / "empty.gguf"
    src.write_bytes(b"")
    _refused(tmp_path, src, "too short")


@pytest.mark.parametrize("keep", [0.002, 0.3, 0.9, 0.9999])
def test_truncated(tmp_path, keep):
    full = tmp_path / "full.gguf"
    write_gguf(full, "qwen2", qtype=QT.Q8_0)
    data = full.read_bytes()
    src = tmp_path / "cut.gguf"
    src.write_bytes(data[:max(8, int(len(data) * keep))])
    _refused(tmp_path, src)


def test_unsupported_version(tmp_path):
    full = tmp_path / "full.gguf"
    write_gguf(full, "qwen2")
    data = bytearray(full.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    src = tmp_path / "v99.gguf"
    src.write_bytes(bytes(data))
    _refused(tmp_path, src, "version")


@pytest.mark.parametrize("arch", ["gpt2", "phi3"])
def test_unsupported_architecture(tmp_path, arch):
    src = tmp_path / f"{arch}.gguf"
    w = gguf.GGUFWriter(src, arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _refused(tmp_path, src, arch, "not supported", "llama", "qwen2")


@pytest.mark.parametrize("key", ["qwen2.block_count", "qwen2.attention.head_count_kv",
                                 "qwen2.rope.freq_base", "qwen2.attention.layer_norm_rms_epsilon",
                                 "qwen2.context_length", "qwen2.feed_forward_length"])
def test_missing_metadata_key(tmp_path, key):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", drop_keys=(key,))
    _refused(tmp_path, src, repr(key), "missing")


def test_bad_tokenizer_metadata_names_the_file(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", metadata={"tokenizer.ggml.model": "t5"})   # Unigram: unsupported
    _refused(tmp_path, src, "t5")


def test_wrong_metadata_type(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", metadata={"qwen2.block_count": "two"})
    _refused(tmp_path, src, "qwen2.block_count")


def test_unknown_tensor_name(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", extra_tensors={"blk.0.attn_qkv.weight": np.zeros((8, 256), np.float32)})
    _refused(tmp_path, src, "blk.0.attn_qkv.weight", "unknown tensor")


def test_tensor_beyond_block_count(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", extra_tensors={"blk.7.attn_norm.weight": np.ones(DIM, np.float32)})
    _refused(tmp_path, src, "blk.7.attn_norm.weight")


def test_missing_tensor(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", drop_tensors=("blk.1.ffn_up.weight",))
    _refused(tmp_path, src, "missing", "model.layers.1.mlp.up_proj.weight")


def test_qwen2_without_biases_refused(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", drop_tensors=("blk.0.attn_k.bias",))
    _refused(tmp_path, src, "self_attn.k_proj.bias")


def test_shape_mismatch(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", metadata={"qwen2.feed_forward_length": HIDDEN * 2})
    _refused(tmp_path, src, "shape", "does not match")


def test_unsupported_tensor_type(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", qtypes={"blk.1.ffn_down.weight": QT.F64})
    _refused(tmp_path, src, "blk.1.ffn_down.weight", "F64", "not supported", "IQ4_XS", "Q4_K")


@pytest.mark.parametrize("qtype", [*IQ_TYPES, QT.TQ1_0, QT.TQ2_0, QT.MXFP4, QT.BF16],
                         ids=lambda q: q.name)
def test_types_without_a_layout_import_through_f32_with_a_warning(tmp_path, qtype, monkeypatch):
    """IQ4_XS, IQ3_*, IQ2_*, IQ1_*, TQ*, MXFP4 (and BF16, widened exactly): the gguf package's own
    dequantization, bit for bit, on the f32 path; every quantized one said once, with its cost."""
    import warnings
    src = tmp_path / "m.gguf"
    mats = ("blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.1.attn_q.weight")
    write_gguf(src, "qwen2", qtypes={m: qtype for m in mats})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = import_gguf(src, tmp_path / "out", progress=False)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if qtype == QT.BF16:
        assert said == []
    else:
        [line] = said
        assert f"3 tensors of type {qtype.name} (3)" in line and "run as f32" in line
        assert all(m in line for m in mats) and "MiB instead of" in line
    ref = reference_tensors(src)
    prov = json.loads((out / "ignis_import.json").read_text())
    with load_checkpoint(out) as ws:
        for hf, rec in prov["tensors"].items():
            if rec["gguf_name"] in mats:
                want = ref[rec["gguf_name"]]
                assert np.all(np.isfinite(want)) and np.abs(want).max() > 0
                np.testing.assert_array_equal(ws[hf], want.astype(np.float32), err_msg=hf)
    assert {prov["tensors"][n]["gguf_type"] for n in prov["tensors"]
            if prov["tensors"][n]["gguf_name"] in mats} == {qtype.name}
    # a model that runs: the gguf format keeps these on the f32 path (the rest in their blocks)
    from ignis.loader.resolve import open_dir
    from ignis.runtime import Engine
    files = open_dir(out, name="tiny")
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))     # a fresh conversion cache
    a = Engine(files, n_ctx=16, threads=1, weight_format="gguf").forward(np.array([1, 5, 9], np.int32))
    b = Engine(files, n_ctx=16, threads=1).forward(np.array([1, 5, 9], np.int32))
    np.testing.assert_array_equal(a, b)       # every matrix here is F32 or on the f32 path


def test_non_finite_weights_refused(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    data = bytearray(src.read_bytes())
    r = gguf.GGUFReader(src)
    t = next(t for t in r.tensors if t.name == "output_norm.weight")
    del r
    data[t.data_offset:t.data_offset + 4] = np.array([np.inf], np.float32).tobytes()
    src.write_bytes(bytes(data))
    _refused(tmp_path, src, "output_norm.weight", "NaN or infinite")


def test_hf_tensor_name_mapping():
    def m(name):
        return gguf_import.hf_tensor_name(name, FAMILIES["qwen2"])

    assert m("token_embd.weight") == "model.embed_tokens.weight"
    assert m("output.weight") == "lm_head.weight"
    assert m("output_norm.weight") == "model.norm.weight"
    assert m("blk.11.attn_output.weight") == "model.layers.11.self_attn.o_proj.weight"
    assert m("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert m("blk.0.attn_v.bias") == "model.layers.0.self_attn.v_proj.bias"
    for bad in ("blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q", "rope_freqs.weight",
                "blk.0.attn_qkv.weight"):
        assert m(bad) is None, bad


def test_absurd_block_count_is_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.gguf"
    write_gguf(path, metadata={"qwen2.block_count": 4_000_000_000})
    with pytest.raises(GGUFError, match="block_count 4000000000 needs at least"):
        gguf_import.open_gguf(path)


def test_huge_array_count_is_refused_not_looped_past_the_end(tmp_path):
    # Found by tests/test_fuzz_loaders.py: gguf's reader reads empty arrays past the end of the
    # file, so a scalar array whose count says 2**62 made it loop until memory ran out.
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    data = bytearray(src.read_bytes())
    key = b"tokenizer.ggml.token_type"
    at = data.index(key) + len(key) + 4 + 4          # value type, item type, then the count
    assert int.from_bytes(data[at:at + 8], "little") == VOCAB
    data[at:at + 8] = (2**62).to_bytes(8, "little")
    src.write_bytes(bytes(data))
    _refused(tmp_path, src, "runs past the end of the file")


@pytest.mark.parametrize("key,value", [
    ("tokenizer.ggml.add_bos_token", "false"),      # was read as bool("false"): True
    ("tokenizer.ggml.unknown_token_id", True),      # was read as token id 1
    ("tokenizer.chat_template", 7),
    ("tokenizer.ggml.pre", 2),
], ids=["add_bos-string", "unk-bool", "template-int", "pre-int"])
def test_tokenizer_metadata_of_the_wrong_type_is_refused(tmp_path, key, value):
    # Found by tests/test_fuzz_loaders.py: the tokenizer conversion used each value whatever its
    # GGUF type (a float token_type list was a bare TypeError).
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", metadata={key: value})
    _refused(tmp_path, src, repr(key), "must be")


@pytest.mark.parametrize("edit,match", [
    ((b"blk.0.attn_k.weight", b"blk.0.attn_q.weight"), "listed twice"),
    ((b"blk.0.attn_k.weight", b"blk.0.attn_\xff.weight"), "not valid UTF-8"),
], ids=["duplicate-name", "non-utf8-name"])
def test_tensor_table_names_are_checked(tmp_path, edit, match):
    # The tensor table used to decode names with errors="replace" and keep the last of two equal
    # names: a corrupt name silently stood for another tensor.
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2")
    data = src.read_bytes()
    assert data.count(edit[0]) == 1          # tensor names appear once, in the tensor table
    src.write_bytes(data.replace(*edit))
    _refused(tmp_path, src, match)


# --- Qwen3 and Llama 3 --------------------------------------------------------------------------

def test_qwen3_import_maps_the_head_norms(tmp_path):
    src = tmp_path / "q3.gguf"
    hf = write_gguf(src, "qwen3", tied=False)
    out = import_gguf(src, tmp_path / "out", progress=False)
    c = ModelConfig.from_file(out / "config.json")
    assert c.arch == "qwen3" and not c.attention_bias and not c.tie_word_embeddings
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    with load_checkpoint(out) as ws:
        assert set(ws) == set(hf)
        for name, orig in hf.items():       # not permuted (llama.cpp stores Qwen3 as HF does)
            np.testing.assert_array_equal(ws[name], orig, err_msg=name)
        assert ws["model.layers.1.self_attn.k_norm.weight"].shape == (HEAD_DIM,)


def test_qwen3_biases_are_unknown_tensors(tmp_path):
    src = tmp_path / "q3.gguf"
    write_gguf(src, "qwen3", extra_tensors={"blk.0.attn_q.bias": np.zeros(DIM, np.float32)})
    _refused(tmp_path, src, "blk.0.attn_q.bias", "unknown tensor")


def _llama3_factors() -> np.ndarray:
    return np.array([1.0] * 12 + [1.5, 3.0] + [8.0] * (HEAD_DIM // 2 - 14), np.float32)


def test_llama3_rope_freqs_become_the_config_rope_scaling(tmp_path):
    src = tmp_path / "l3.gguf"
    factors = _llama3_factors()
    hf = write_gguf(src, "llama", tied=True, extra_tensors={"rope_freqs.weight": factors})
    out = import_gguf(src, tmp_path / "out", progress=False)
    c = ModelConfig.from_file(out / "config.json")
    assert c.tie_word_embeddings and c.rope_scaling.type == "freq_factors"
    assert np.array_equal(np.array(c.rope_scaling.freq_factors, np.float32), factors)   # exact
    from ignis.models.rope import inv_freq, plain_inv_freq
    assert np.array_equal(inv_freq(c), plain_inv_freq(1e6, HEAD_DIM) / factors)
    with load_checkpoint(out) as ws:        # a rope setting, not a weight
        assert set(ws) == set(hf)


@pytest.mark.parametrize("arr,words", [
    (np.ones(HEAD_DIM, np.float32), f"shape [{HEAD_DIM // 2}]"),
    (np.ones(HEAD_DIM // 2, np.float16), "must be F32"),
    (np.array([0.0] + [1.0] * (HEAD_DIM // 2 - 1), np.float32), "positive and finite"),
])
def test_bad_rope_freqs_refused(tmp_path, arr, words):
    src = tmp_path / "l3.gguf"
    write_gguf(src, "llama", extra_tensors={"rope_freqs.weight": arr})
    _refused(tmp_path, src, "rope_freqs.weight", words)


def test_linear_rope_scaling_read_and_others_refused(tmp_path):
    src = tmp_path / "lin.gguf"
    write_gguf(src, "llama", metadata={"llama.rope.scaling.type": "linear",
                                       "llama.rope.scaling.factor": 4.0})
    c = ModelConfig.from_file(import_gguf(src, tmp_path / "lin", progress=False) / "config.json")
    assert c.rope_scaling.type == "linear" and c.rope_scaling.factor == 4.0
    src = tmp_path / "yarn.gguf"
    write_gguf(src, "llama", metadata={"llama.rope.scaling.type": "yarn",
                                       "llama.rope.scaling.factor": 4.0})
    _refused(tmp_path, src, "'yarn'", "not supported", "linear", "rope_freqs.weight")
    src = tmp_path / "both.gguf"
    write_gguf(src, "llama", metadata={"llama.rope.scaling.type": "linear",
                                       "llama.rope.scaling.factor": 4.0},
               extra_tensors={"rope_freqs.weight": _llama3_factors()})
    _refused(tmp_path, src, "two rope scalings")
