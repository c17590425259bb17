"""Model files that must not load silently (issue 13, items 15 and 16): a config.json that does not
describe its checkpoint, n_ctx values the model or the machine cannot hold, and config keys that
change the arithmetic. Checkpoints written by the installed transformers are loaded and compared
with transformers' own logits (the reference), or refused by name."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ignis
from ignis.api.cli import main
from ignis.errors import ConfigError, ModelFormatError
from ignis.loader.config import (CONFIG_KEYS_HARMLESS, CONFIG_KEYS_IMPLEMENTED, CONFIG_KEYS_REFUSED,
                                 ModelConfig)
from ignis.loader.resolve import open_model
from ignis.loader.safetensors import SINGLE_FILE, SafetensorsWriter, load_checkpoint
from ignis.runtime import engine as engine_mod
from ignis.runtime.engine import Engine, kv_cache_bytes, machine_memory_bytes
from ignis.runtime.errors import RuntimeInputError
from tiny_models import tensor_shapes, tiny_config


def _write_checkpoint(directory: Path, config: dict, *, tensors_config: dict | None = None,
                      extra: dict[str, np.ndarray] | None = None, seed: int = 0) -> Path:
    """config.json = `config`; model.safetensors holds the tensors `tensors_config` implies (default:
    the config's own) plus `extra`: a checkpoint and a config that may not belong together."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    tensors = {n: (rng.standard_normal(s) / 8).astype(np.float32)
               for n, s in tensor_shapes(tensors_config or config).items()}
    tensors.update(extra or {})
    with SafetensorsWriter(directory / SINGLE_FILE,
                           [(n, "F32", a.shape) for n, a in tensors.items()], {"format": "pt"}) as w:
        for n, a in tensors.items():
            w.write(n, a)
    return directory


def _with_tokenizer(model_dir: Path, tiny_chat_dir: Path) -> Path:
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_chat_dir / f, model_dir / f)
    return model_dir


# --- #15: the checkpoint holds exactly what the config describes ---------------------------------

def test_config_with_2_layers_over_a_24_layer_checkpoint_is_refused(tmp_path: Path,
                                                                     tiny_chat_dir: Path) -> None:
    big = {**tiny_config("qwen2"), "num_hidden_layers": 24}
    d = _with_tokenizer(_write_checkpoint(tmp_path / "m", tiny_config("qwen2"), tensors_config=big),
                        tiny_chat_dir)
    with pytest.raises(ModelFormatError) as ei:
        ignis.load(str(d), progress=False)
    msg = str(ei.value)
    # 22 unused layers of 12 tensors (q/k/v/o, 3 biases, 2 norms, gate/up/down), named and counted
    assert "264 tensors" in msg and "model.layers.2.input_layernorm.weight" in msg
    assert "and 260 more" in msg
    assert "num_hidden_layers=2" in msg and "layers up to 23" in msg


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_unused_tensors_are_named_and_counted(arch: str, tmp_path: Path) -> None:
    extra = {f"model.layers.0.self_attn.{x}_norm.weight": np.ones(16, np.float32) for x in "qk"}
    extra.update({f"model.extra.{i}": np.zeros(2, np.float32) for i in range(4)})
    d = _write_checkpoint(tmp_path / "m", tiny_config(arch), extra=extra)
    with pytest.raises(ModelFormatError, match="6 tensors") as ei:
        open_model(d)
    msg = str(ei.value)
    assert "model.extra.0, model.extra.1, model.extra.2, model.extra.3 and 2 more" in msg
    assert "another architecture" in msg


def test_llama_attention_bias_with_o_proj_bias_is_refused(tmp_path: Path) -> None:
    # transformers' Llama puts attention_bias on o_proj too; ignis applies q/k/v biases only
    cfg = {**tiny_config("llama"), "attention_bias": True}
    extra = {f"model.layers.{i}.self_attn.o_proj.bias": np.zeros(64, np.float32) for i in range(2)}
    with pytest.raises(ModelFormatError, match="o_proj") as ei:
        open_model(_write_checkpoint(tmp_path / "m", cfg, extra=extra))
    assert "model.layers.0.self_attn.o_proj.bias" in str(ei.value)
    # without the o_proj bias (ignis's own GGUF import of a Llama with q/k/v biases) it loads
    open_model(_write_checkpoint(tmp_path / "ok", cfg)).weights.close()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_mlp_or_unasked_biases_are_refused(arch: str, tmp_path: Path) -> None:
    extra = {"model.layers.1.mlp.down_proj.bias": np.zeros(64, np.float32)}
    with pytest.raises(ModelFormatError, match="MLP"):
        open_model(_write_checkpoint(tmp_path / "mlp", tiny_config(arch), extra=extra))
    if arch == "llama":     # q/k/v biases in the files, attention_bias false in config.json
        with_bias = {**tiny_config("llama"), "attention_bias": True}
        with pytest.raises(ModelFormatError, match="attention_bias: true"):
            open_model(_write_checkpoint(tmp_path / "qkv", tiny_config("llama"),
                                         tensors_config=with_bias))


def test_rotary_caches_are_the_allowed_extra(tmp_path: Path) -> None:
    extra = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)
             for i in range(2)}
    files = open_model(_write_checkpoint(tmp_path / "m", tiny_config("llama"), extra=extra))
    files.weights.close()


def test_tied_embeddings_with_a_different_lm_head_are_refused(tmp_path: Path) -> None:
    cfg = tiny_config("qwen2")                                  # tie_word_embeddings: true
    lm_head = np.full((cfg["vocab_size"], cfg["hidden_size"]), 0.5, np.float32)
    with pytest.raises(ModelFormatError, match="tie_word_embeddings") as ei:
        open_model(_write_checkpoint(tmp_path / "m", cfg, extra={"lm_head.weight": lm_head}))
    assert ei.value.tensor == "lm_head.weight"
    # an lm_head.weight equal to the embedding is what tying means: accepted
    d = _write_checkpoint(tmp_path / "same", cfg)
    with load_checkpoint(d) as ws:
        embed = np.array(ws["model.embed_tokens.weight"])
    d = _write_checkpoint(tmp_path / "same2", cfg, extra={"lm_head.weight": embed})
    open_model(d).weights.close()


def test_untied_config_without_lm_head_says_so(tmp_path: Path) -> None:
    cfg = tiny_config("llama")                                  # tie_word_embeddings: false
    tied = {**cfg, "tie_word_embeddings": True}
    with pytest.raises(ModelFormatError, match="tie_word_embeddings: false") as ei:
        open_model(_write_checkpoint(tmp_path / "m", cfg, tensors_config=tied))
    assert "lm_head.weight" in str(ei.value)


def test_head_dim_that_does_not_match_the_checkpoint_is_refused(tmp_path: Path) -> None:
    cfg = {**tiny_config("llama"), "head_dim": 32}        # the files hold 4 heads of 16
    with pytest.raises(ModelFormatError, match="does not match config.json") as ei:
        open_model(_write_checkpoint(tmp_path / "m", cfg, tensors_config=tiny_config("llama")))
    assert ei.value.tensor.endswith("self_attn.q_proj.weight")


def test_model_type_and_architectures_disagree(tmp_path: Path) -> None:
    cfg = {**tiny_config("qwen2"), "model_type": "llama"}
    with pytest.raises(ConfigError, match="contradicts itself") as ei:
        open_model(_write_checkpoint(tmp_path / "m", cfg, tensors_config=tiny_config("qwen2")))
    assert ei.value.field == "model_type"


# --- #15: n_ctx ----------------------------------------------------------------------------------

def test_n_ctx_2_to_the_62_is_a_typed_error(tiny_chat_dir: Path, tiny_qwen2_dir: Path) -> None:
    with pytest.raises(RuntimeInputError, match="max_position_embeddings") as ei:
        ignis.load(str(tiny_chat_dir), n_ctx=2**62, progress=False)
    assert isinstance(ei.value, ValueError) and "512" in str(ei.value)
    files = open_model(tiny_qwen2_dir)
    try:
        with pytest.raises(RuntimeInputError, match="max_position_embeddings"):
            Engine(files, n_ctx=2**62)
    finally:
        files.weights.close()


@pytest.mark.parametrize("n_ctx", [0, -1, 1.5, "512", True, [512]])
def test_bad_n_ctx_refused_before_anything_is_opened(n_ctx: object) -> None:
    with pytest.raises(RuntimeInputError, match="positive integer"):
        ignis.load("/no/such/model", n_ctx=n_ctx, progress=False)


def test_n_ctx_up_to_max_position_embeddings(tiny_chat_dir: Path) -> None:
    with pytest.raises(RuntimeInputError, match=r"n_ctx=513 exceeds the 512 positions") as ei:
        ignis.load(str(tiny_chat_dir), n_ctx=513, progress=False)
    assert "Use n_ctx <= 512" in str(ei.value)
    m = ignis.load(str(tiny_chat_dir), n_ctx=512, threads=1, progress=False)
    assert m.n_ctx == 512
    m.close()


def _long_context_model(tmp_path: Path, tiny_chat_dir: Path) -> Path:
    cfg = {**tiny_config("qwen2"), "max_position_embeddings": 2**31 - 1}
    return _with_tokenizer(_write_checkpoint(tmp_path / "long", cfg), tiny_chat_dir)


def test_n_ctx_whose_kv_cache_cannot_fit_is_refused_with_the_number(
        tmp_path: Path, tiny_chat_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _long_context_model(tmp_path, tiny_chat_dir)
    cfg = ModelConfig.from_file(d / "config.json")
    per_pos = 2 * 2 * 2 * 16 * 4                    # layers x (k, v) x kv heads x head_dim x f32
    # the executor keeps rows in whole blocks of 16 (the key cache's layout)
    assert kv_cache_bytes(cfg, 1) == kv_cache_bytes(cfg, 16) == 16 * per_pos
    assert kv_cache_bytes(cfg, 17) == 32 * per_pos
    monkeypatch.setattr(engine_mod, "machine_memory_bytes", lambda: 2**30)
    with pytest.raises(RuntimeInputError) as ei:
        ignis.load(str(d), n_ctx=2**22, kv_dtype="f32", progress=False)
    msg = str(ei.value)
    assert f"needs {2**22 * per_pos} bytes" in msg and "1073741824 bytes" in msg
    assert f"use n_ctx <= {2**30 // per_pos}" in msg and "kv_dtype='f16'" in msg
    # every slot counts; f16 halves it
    with pytest.raises(RuntimeInputError, match="4 slots"):
        ignis.load(str(d), n_ctx=2**20, parallel=4, kv_dtype="f32", progress=False)
    m = ignis.load(str(d), n_ctx=2**21, kv_dtype="f16", threads=1, progress=False)
    assert m.n_ctx == 2**21
    m.close()


def test_n_ctx_beyond_this_machine_is_refused(tmp_path: Path, tiny_chat_dir: Path) -> None:
    have = machine_memory_bytes()
    assert have is None or have > 2**26
    d = _long_context_model(tmp_path, tiny_chat_dir)
    most = engine_mod.MAX_CTX
    if have is None or kv_cache_bytes(ModelConfig.from_file(d / "config.json"), most) <= have:
        pytest.skip("this machine could hold a 1 TiB KV cache")
    with pytest.raises(RuntimeInputError, match="RAM and swap"):
        ignis.load(str(d), n_ctx=most, progress=False)
    with pytest.raises(RuntimeInputError, match=f"32-bit positions: at most {most}"):
        ignis.load(str(d), n_ctx=2**31 - 1, progress=False)    # the executor's KV blocks
    huge = {**tiny_config("qwen2"), "max_position_embeddings": 2**62}
    d = _with_tokenizer(_write_checkpoint(tmp_path / "huge", huge), tiny_chat_dir)
    with pytest.raises(RuntimeInputError, match="32-bit"):
        ignis.load(str(d), n_ctx=2**62, progress=False)


@pytest.mark.parametrize("ctx,words", [(str(2**62), "max_position_embeddings"),
                                       ("513", "max_position_embeddings"),
                                       ("0", "positive integer")])
def test_cli_ctx_is_a_one_line_error(ctx: str, words: str, tiny_chat_dir: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(tiny_chat_dir), "Hi", "--ctx", ctx, "--threads", "1", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ignis run: error: --ctx") and words in err     # the flag, not n_ctx
    assert err.count("\n") == 1 and "Traceback" not in err


# --- #16: checkpoints written by the installed transformers -------------------------------------

@pytest.fixture(scope="module")
def hf():
    """transformers with torch (CI installs both; skip cleanly where they are absent)."""
    torch = pytest.importorskip("torch", reason="torch is not installed: the comparison with "
                                                "transformers needs it (CI installs it)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    return torch, transformers


SIZES = dict(vocab_size=272, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _save_hf(hf, directory: Path, family: str, seed: int = 0, **config):
    """save_pretrained of a tiny random model of the family, its weights at scales that keep logits
    well separated (the default init gives near-ties); returns the torch model (eval, f32)."""
    torch, transformers = hf
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**{**SIZES, "tie_word_embeddings": True, **config})
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**{**SIZES, **config})
        model = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif "embed_tokens" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(r / p.shape[1] ** 0.5)
    model.eval()
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("family,rope_theta,extra", [
    ("qwen2", 1e6, {}),
    ("llama", 500000.0, {}),
    ("llama", 500000.0, {"head_dim": 32}),              # head_dim is not hidden_size / heads
    ("qwen2", 1e6, {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
], ids=["qwen2", "llama", "llama-head_dim", "qwen2-no-layer-slides"])
def test_transformers_5_checkpoint_agrees_with_transformers(hf, family: str, rope_theta: float,
                                                            extra: dict, tmp_path: Path) -> None:
    torch, _ = hf
    ref = _save_hf(hf, tmp_path, family, rope_parameters={"rope_type": "default",
                                                          "rope_theta": rope_theta}, **extra)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "rope_theta" not in written and written["rope_parameters"]["rope_theta"] == rope_theta
    files = open_model(tmp_path)
    assert files.config.rope_theta == rope_theta
    eng = Engine(files, n_ctx=512, threads=1)
    rng = np.random.default_rng(1)
    try:
        for length in (5, 97, 300):
            ids = rng.integers(0, SIZES["vocab_size"], length)
            eng.reset()
            got = eng.forward(ids, logits_for="all")
            with torch.no_grad():
                want = ref(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()
            err = float(np.abs(got - want).max())
            assert err < 1e-4 * max(1.0, float(np.abs(want).max())), (length, err)
            agree = got.argmax(-1) == want.argmax(-1)
            assert agree.all(), f"top-1 differs at positions {np.flatnonzero(~agree)[:10]}"
    finally:
        files.weights.close()


def test_transformers_rope_scaling_read_or_refused_by_name(hf, tmp_path: Path) -> None:
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    _save_hf(hf, tmp_path / "llama3", "llama", rope_parameters=llama3)
    m = open_model(tmp_path / "llama3")     # read (tests/test_models_hf.py: agrees with transformers)
    assert m.config.rope_scaling.type == "llama3"
    m.weights.close()
    _save_hf(hf, tmp_path / "yarn", "llama", rope_parameters={
        "rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
        "original_max_position_embeddings": 128})
    with pytest.raises(ConfigError) as ei:
        open_model(tmp_path / "yarn")
    assert ei.value.field == "rope_parameters"
    assert "rope_parameters" in str(ei.value) and "'yarn'" in str(ei.value)


def test_transformers_qwen2_sliding_window_where_used_is_refused(hf, tmp_path: Path) -> None:
    _save_hf(hf, tmp_path / "slides", "qwen2", use_sliding_window=True, sliding_window=16,
             max_window_layers=1)
    with pytest.raises(ConfigError, match=r"layers \[1\] use a window of 16"):
        open_model(tmp_path / "slides")
    # with no layer past max_window_layers it slides nowhere: it loads (and agrees with transformers,
    # test_transformers_5_checkpoint_agrees_with_transformers[qwen2-no-layer-slides])


def test_every_field_of_the_installed_transformers_configs_is_classified() -> None:
    # a key a new transformers adds (as 5.0 added rope_parameters) fails here until it is classified
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    known = CONFIG_KEYS_IMPLEMENTED | CONFIG_KEYS_HARMLESS | CONFIG_KEYS_REFUSED.keys()
    for cls in (transformers.Qwen2Config, transformers.Qwen3Config, transformers.LlamaConfig):
        fields = {f.name for f in dataclasses.fields(cls)} | set(cls().to_dict())
        fields |= set(transformers.GenerationConfig._get_default_generation_params())
        missing = sorted(fields - known)
        assert not missing, f"{cls.__name__} fields ignis has not classified: {missing}"
    assert not CONFIG_KEYS_IMPLEMENTED & CONFIG_KEYS_HARMLESS
    assert not (CONFIG_KEYS_IMPLEMENTED | CONFIG_KEYS_HARMLESS) & CONFIG_KEYS_REFUSED.keys()
