"""ModelConfig / GenerationConfig from config.json and generation_config.json as Hugging Face
ships them (field sets copied from the published Qwen2.5 and SmolLM2 configs), and every refusal."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ignis.errors import ConfigError, UnsupportedArchitectureError
from ignis.loader.config import GenerationConfig, ModelConfig, RopeScaling

# Qwen2.5-Coder-0.5B-Instruct's config.json (values as published).
QWEN2_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.44.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# SmolLM2-135M-Instruct's config.json (Llama architecture).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}

# Qwen2.5-Coder-Instruct's generation_config.json.
QWEN2_GENERATION = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "transformers_version": "4.44.0",
}


def write_json(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj, indent=2))
    return path


# --- good configs --------------------------------------------------------------------------------

def test_qwen2_from_file(tmp_path: Path) -> None:
    cfg = ModelConfig.from_file(write_json(tmp_path / "config.json", QWEN2_CONFIG))
    assert (cfg.arch, cfg.dim, cfg.hidden_dim, cfg.n_layers) == ("qwen2", 896, 4864, 24)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == (14, 2, 64, 151936)
    assert cfg.kv_group == 7 and cfg.q_dim == 896 and cfg.kv_dim == 128
    assert cfg.rope_theta == 1e6 and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is True and cfg.attention_bias is True
    assert cfg.max_position_embeddings == 32768
    assert cfg.bos_token_id == 151643 and cfg.eos_token_ids == (151645,)
    assert cfg.torch_dtype == "bfloat16"


def test_llama_from_dict() -> None:
    cfg = ModelConfig.from_dict(LLAMA_CONFIG)
    assert (cfg.arch, cfg.dim, cfg.hidden_dim, cfg.n_layers) == ("llama", 576, 1536, 30)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.attention_bias is False and cfg.rope_theta == 100000.0
    assert isinstance(cfg.rope_theta, float) and cfg.rms_norm_eps == 1e-5
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1


def test_config_is_frozen() -> None:
    cfg = ModelConfig.from_dict(QWEN2_CONFIG)
    with pytest.raises(AttributeError):
        cfg.dim = 1         # type: ignore[misc]


def test_tiny_fixture_configs(tiny_qwen2_dir: Path, tiny_llama_dir: Path) -> None:
    q = ModelConfig.from_file(tiny_qwen2_dir / "config.json")
    lm = ModelConfig.from_file(tiny_llama_dir / "config.json")
    assert (q.head_dim, q.attention_bias, q.tie_word_embeddings) == (16, True, True)
    assert (lm.head_dim, lm.attention_bias, lm.tie_word_embeddings) == (16, False, False)
    g = GenerationConfig.from_file(tiny_qwen2_dir / "generation_config.json")
    assert len(g.eos_token_ids) == 2 and g.do_sample


def test_head_dim_default_and_explicit() -> None:
    assert ModelConfig.from_dict({**QWEN2_CONFIG, "head_dim": None}).head_dim == 64
    # head_dim may differ from hidden_size / n_heads (e.g. Gemma-style configs); taken as given
    cfg = ModelConfig.from_dict({**LLAMA_CONFIG, "head_dim": 128})
    assert cfg.head_dim == 128 and cfg.q_dim == 9 * 128


def test_kv_heads_default_to_heads() -> None:
    d = dict(LLAMA_CONFIG)
    del d["num_key_value_heads"]
    cfg = ModelConfig.from_dict(d)
    assert cfg.n_kv_heads == cfg.n_heads == 9 and cfg.kv_group == 1


def test_model_type_alone_is_enough() -> None:
    d = dict(QWEN2_CONFIG)
    del d["architectures"]
    assert ModelConfig.from_dict(d).arch == "qwen2"


def test_defaults_for_optional_fields() -> None:
    d = {k: v for k, v in LLAMA_CONFIG.items()
         if k not in ("rope_theta", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                      "eos_token_id", "torch_dtype", "hidden_act", "attention_bias")}
    cfg = ModelConfig.from_dict(d)
    assert cfg.rope_theta == 10000.0 and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is False and cfg.attention_bias is False
    assert cfg.bos_token_id is None and cfg.eos_token_ids == () and cfg.torch_dtype is None


def test_eos_list_in_config() -> None:
    cfg = ModelConfig.from_dict({**QWEN2_CONFIG, "eos_token_id": [151645, 151643, 151645]})
    assert cfg.eos_token_ids == (151645, 151643)        # order kept, duplicates dropped


@pytest.mark.parametrize("base", [QWEN2_CONFIG, LLAMA_CONFIG], ids=["qwen2", "llama"])
def test_to_hf_dict_round_trip(base: dict, tmp_path: Path) -> None:
    cfg = ModelConfig.from_dict(base)
    hf = cfg.to_hf_dict()
    assert ModelConfig.from_dict(hf) == cfg
    # and through a real file, as the GGUF importer writes it
    assert ModelConfig.from_file(write_json(tmp_path / "config.json", hf)) == cfg
    assert hf["architectures"] == base["architectures"]
    for hf_name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "max_position_embeddings"):
        assert hf[hf_name] == base[hf_name]


# --- refusals ------------------------------------------------------------------------------------

REQUIRED = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "vocab_size", "max_position_embeddings"]


@pytest.mark.parametrize("field", REQUIRED)
@pytest.mark.parametrize("base", [QWEN2_CONFIG, LLAMA_CONFIG], ids=["qwen2", "llama"])
def test_missing_required_field(field: str, base: dict, tmp_path: Path) -> None:
    d = dict(base)
    del d[field]
    path = write_json(tmp_path / "config.json", d)
    with pytest.raises(ConfigError) as ei:
        ModelConfig.from_file(path)
    assert ei.value.field == field
    assert repr(field) in str(ei.value) and "missing" in str(ei.value)
    assert str(path) in str(ei.value)


@pytest.mark.parametrize("field,value,words", [
    ("hidden_size", "896", "must be an integer"),
    ("hidden_size", 896.0, "must be an integer"),
    ("hidden_size", True, "must be an integer"),
    ("hidden_size", 0, "must be >= 1"),
    ("num_hidden_layers", -2, "must be >= 1"),
    ("vocab_size", None, "must be an integer"),
    ("num_key_value_heads", 0, "positive integer"),
    ("num_key_value_heads", "2", "positive integer"),
    ("num_key_value_heads", 3, "multiple of"),          # 14 query heads, 3 kv heads
    ("head_dim", 63, "positive even integer"),
    ("head_dim", "64", "positive even integer"),
    ("rope_theta", -1.0, "positive number"),
    ("rope_theta", "1e6", "positive number"),
    ("rms_norm_eps", 0, "positive number"),
    ("rms_norm_eps", float("inf"), "positive number"),
    ("tie_word_embeddings", "true", "true or false"),
    ("tie_word_embeddings", 1, "true or false"),
    ("bos_token_id", -1, "token id"),
    ("eos_token_id", "151645", "token id"),
    ("eos_token_id", [151645, None], "token id"),
    ("architectures", [], "non-empty list"),
    ("architectures", "Qwen2ForCausalLM", "non-empty list"),
    ("hidden_act", "gelu", "not supported"),
    ("rope_scaling", {"type": "yarn", "factor": 4.0}, "rope_scaling"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope_scaling"),
    ("use_sliding_window", "yes", "true or false"),
    ("sliding_window", 0, "positive integer"),
    ("layer_types", ["full_attention"] * 23 + ["chunked_attention"], "full attention"),
])
def test_bad_field_refused_by_name(field: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as ei:
        ModelConfig.from_dict({**QWEN2_CONFIG, field: value})
    assert ei.value.field == field


def test_head_dim_not_derivable() -> None:
    with pytest.raises(ConfigError, match="not divisible") as ei:
        ModelConfig.from_dict({**LLAMA_CONFIG, "hidden_size": 577, "head_dim": None})
    assert ei.value.field == "head_dim"


def test_default_rope_scaling_accepted() -> None:
    cfg = ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": {"rope_type": "default"}})
    assert cfg == ModelConfig.from_dict(LLAMA_CONFIG)
    assert ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": {}}) == cfg


def test_llama_mlp_bias_refused() -> None:
    with pytest.raises(ConfigError, match="mlp_bias"):
        ModelConfig.from_dict({**LLAMA_CONFIG, "mlp_bias": True})


def test_llama_attention_bias_honoured() -> None:
    assert ModelConfig.from_dict({**LLAMA_CONFIG, "attention_bias": True}).attention_bias is True


@pytest.mark.parametrize("change", [
    {"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
    {"architectures": ["GPT2LMHeadModel"]},
])
def test_unsupported_architecture_lists_supported(change: dict) -> None:
    with pytest.raises(UnsupportedArchitectureError) as ei:
        ModelConfig.from_dict({**LLAMA_CONFIG, **change})
    msg = str(ei.value)
    assert change["architectures"][0] in msg
    assert "LlamaForCausalLM" in msg and "Qwen2ForCausalLM" in msg
    assert isinstance(ei.value, ConfigError)


def test_unsupported_model_type_lists_supported() -> None:
    d = {k: v for k, v in QWEN2_CONFIG.items() if k != "architectures"}
    with pytest.raises(UnsupportedArchitectureError, match="Qwen2ForCausalLM") as ei:
        ModelConfig.from_dict({**d, "model_type": "gemma2"})
    assert ei.value.field == "model_type" and "gemma2" in str(ei.value)


def test_no_architecture_at_all() -> None:
    d = {k: v for k, v in QWEN2_CONFIG.items() if k not in ("architectures", "model_type")}
    with pytest.raises(ConfigError, match="neither 'architectures' nor 'model_type'"):
        ModelConfig.from_dict(d)


def test_second_listed_architecture_is_used() -> None:
    cfg = ModelConfig.from_dict({**QWEN2_CONFIG, "architectures": ["Foo", "Qwen2ForCausalLM"]})
    assert cfg.arch == "qwen2"


@pytest.mark.parametrize("content,words", [
    (b"[1, 2]", "JSON object"),
    (b'"config"', "JSON object"),
    (b"{not json", "not valid UTF-8 JSON"),
    (b'{"hidden_size": \xff}', "not valid UTF-8 JSON"),
])
def test_bad_config_file(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=words) as ei:
        ModelConfig.from_file(path)
    assert str(path) in str(ei.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json not found"):
        ModelConfig.from_file(tmp_path / "config.json")


# --- generation_config.json ---------------------------------------------------------------------

def test_generation_config_qwen(tmp_path: Path) -> None:
    g = GenerationConfig.from_file(write_json(tmp_path / "generation_config.json", QWEN2_GENERATION))
    assert g.eos_token_ids == (151645, 151643)
    assert g.bos_token_id == 151643 and g.pad_token_id == 151643
    assert g.do_sample is True and g.temperature == 0.7 and g.top_p == 0.8 and g.top_k == 20
    assert g.repetition_penalty == 1.1 and g.min_p == 0.0 and g.max_new_tokens is None
    assert g.extra == {"transformers_version": "4.44.0"}


def test_generation_config_int_eos_and_defaults() -> None:
    g = GenerationConfig.from_dict({"bos_token_id": 1, "eos_token_id": 2})
    assert g.eos_token_ids == (2,) and g.bos_token_id == 1
    assert (g.do_sample, g.temperature, g.top_k, g.top_p, g.repetition_penalty) == \
        (False, 1.0, 0, 1.0, 1.0)
    assert GenerationConfig.from_dict({}).eos_token_ids == ()


def test_generation_config_nulls_mean_default() -> None:
    g = GenerationConfig.from_dict({"top_k": None, "temperature": None, "eos_token_id": None})
    assert g == GenerationConfig()


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", "hot"), ("top_p", 1.5), ("top_p", -0.1),
    ("min_p", 2.0), ("top_k", -1), ("top_k", 2.5), ("top_k", True), ("repetition_penalty", -1.0),
    ("max_new_tokens", 0), ("max_new_tokens", "10"), ("do_sample", "yes"), ("do_sample", 1),
    ("eos_token_id", -5), ("eos_token_id", [1, "2"]), ("eos_token_id", 2.0), ("pad_token_id", "0"),
    ("bos_token_id", [1, 2]),
])
def test_generation_config_bad_values(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as ei:
        GenerationConfig.from_dict({**QWEN2_GENERATION, field: value})
    assert ei.value.field == field and repr(field) in str(ei.value)


def test_generation_config_not_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="JSON object"):
        GenerationConfig.from_file(write_json(tmp_path / "generation_config.json", [1]))


@pytest.mark.parametrize("d", [QWEN2_GENERATION, {"eos_token_id": 7},
                               {"eos_token_id": [3, 4], "do_sample": False, "max_new_tokens": 9,
                                "repetition_penalty": 1.2}])
def test_generation_config_round_trip(d: dict) -> None:
    g = GenerationConfig.from_dict(d)
    assert GenerationConfig.from_dict(g.to_hf_dict()) == g


def test_deeply_nested_or_unreadable_config_is_a_config_error(tmp_path):
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        ModelConfig.from_file(deep)
    adir = tmp_path / "dir.json"
    adir.mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        ModelConfig.from_file(adir)


# --- issue 13 #15/#16: every key that changes the arithmetic is read or refused by name -----------

# What transformers 5 writes (save_pretrained of a Qwen2 with rope_theta 1e6): no top-level
# rope_theta, a rope_parameters object instead, and layer_types.
QWEN2_CONFIG_V5 = {
    **{k: v for k, v in QWEN2_CONFIG.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")},
    "dtype": "bfloat16", "layer_types": ["full_attention"] * 24, "pad_token_id": None,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": None,
    "transformers_version": "5.24.0",
}


def test_rope_parameters_of_transformers_5_are_read() -> None:
    cfg = ModelConfig.from_dict(QWEN2_CONFIG_V5)
    assert cfg.rope_theta == 1e6
    assert cfg == ModelConfig.from_dict(QWEN2_CONFIG)          # both spellings: one model
    llama = {k: v for k, v in LLAMA_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    cfg = ModelConfig.from_dict({**llama, "rope_parameters": {"rope_type": "default",
                                                              "rope_theta": 500000.0}})
    assert cfg.rope_theta == 500000.0


@pytest.mark.parametrize("rope", [
    {"full_attention": {"rope_type": "default", "rope_theta": 1e6}},     # nested by layer type
    {"type": "default", "rope_theta": 1e6},                              # the old name of rope_type
    {"rope_theta": 1e6, "partial_rotary_factor": 1.0},
])
def test_rope_parameters_other_shapes(rope: dict) -> None:
    assert ModelConfig.from_dict({**QWEN2_CONFIG_V5, "rope_parameters": rope}).rope_theta == 1e6


def test_rope_theta_in_both_spellings_must_agree() -> None:
    same = {**QWEN2_CONFIG_V5, "rope_theta": 1e6}
    assert ModelConfig.from_dict(same).rope_theta == 1e6
    with pytest.raises(ConfigError, match="rope_theta more than once") as ei:
        ModelConfig.from_dict({**QWEN2_CONFIG_V5, "rope_theta": 10000.0})
    assert "rope_parameters.rope_theta=1000000.0" in str(ei.value)
    with pytest.raises(ConfigError, match="rope_theta more than once"):
        ModelConfig.from_dict({**QWEN2_CONFIG_V5, "rope_scaling": {"rope_type": "default",
                                                                   "rope_theta": 5e5}})


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope", "proportional", "su"])
@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_rope_scaling_types_refused_by_name(rope_type: str, key: str) -> None:
    rope = {"rope_type": rope_type, "factor": 8.0, "rope_theta": 500000.0}
    with pytest.raises(ConfigError) as ei:
        ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": None, key: rope})
    msg = str(ei.value)
    assert ei.value.field == key and key in msg and repr(rope_type) in msg
    assert "\n" not in msg and all(repr(t) in msg for t in ("default", "linear", "llama3"))


# Llama 3.2 1B's config.json (values as published, transformers 4 spelling).
LLAMA32_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def test_llama32_config_reads_its_rope_scaling() -> None:
    c = ModelConfig.from_dict(LLAMA32_CONFIG)
    assert (c.arch, c.head_dim, c.rope_theta, c.tie_word_embeddings) == ("llama", 64, 5e5, True)
    assert c.rope_scaling == RopeScaling("llama3", factor=32.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=8192)
    # the transformers 5 spelling says the same; the written config.json reads back the same
    v5 = {k: v for k, v in LLAMA32_CONFIG.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {**LLAMA32_CONFIG["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_dict(v5) == c
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


def test_llama3_original_context_as_transformers_reads_it() -> None:
    rope = {k: v for k, v in LLAMA32_CONFIG["rope_scaling"].items()
            if k != "original_max_position_embeddings"}
    # absent from the rope object: the top-level key, else max_position_embeddings
    c = ModelConfig.from_dict({**LLAMA32_CONFIG, "rope_scaling": rope,
                               "original_max_position_embeddings": 4096})
    assert c.rope_scaling.original_max_position_embeddings == 4096
    c = ModelConfig.from_dict({**LLAMA32_CONFIG, "rope_scaling": rope})
    assert c.rope_scaling.original_max_position_embeddings == 131072
    with pytest.raises(ConfigError, match="original_max_position_embeddings twice") as ei:
        ModelConfig.from_dict({**LLAMA32_CONFIG, "original_max_position_embeddings": 4096})
    assert ei.value.field == "original_max_position_embeddings"


@pytest.mark.parametrize("change,words", [
    ({"factor": None}, "factor must be a number"),
    ({"low_freq_factor": "1"}, "low_freq_factor must be a number"),
    ({"high_freq_factor": 1.0}, "must be above low_freq_factor"),
    ({"original_max_position_embeddings": 8192.5}, "positive integer"),
    ({"beta_fast": 32}, "'beta_fast', which rope_type 'llama3' does not use"),
])
def test_bad_llama3_parameters_refused(change: dict, words: str) -> None:
    rope = {**LLAMA32_CONFIG["rope_scaling"], **change}
    with pytest.raises(ConfigError, match=words) as ei:
        ModelConfig.from_dict({**LLAMA32_CONFIG, "rope_scaling": rope})
    assert ei.value.field == "rope_scaling"


def test_llama3_parameter_missing_refused() -> None:
    rope = {k: v for k, v in LLAMA32_CONFIG["rope_scaling"].items() if k != "high_freq_factor"}
    with pytest.raises(ConfigError, match="needs 'high_freq_factor'"):
        ModelConfig.from_dict({**LLAMA32_CONFIG, "rope_scaling": rope})


def test_linear_rope_scaling_and_freq_factors_read() -> None:
    c = ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert c.rope_scaling == RopeScaling("linear", factor=2.0)
    ff = [1.0] * 31 + [8.0]                 # SmolLM2's head_dim 64: 32 frequencies
    c = ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": {"rope_type": "freq_factors",
                                                                "freq_factors": ff}})
    assert c.rope_scaling.freq_factors == tuple(ff)
    assert ModelConfig.from_dict(c.to_hf_dict()) == c
    with pytest.raises(ConfigError, match="list of 32 positive numbers"):
        ModelConfig.from_dict({**LLAMA_CONFIG, "rope_scaling": {"rope_type": "freq_factors",
                                                                "freq_factors": ff[:-1]}})


def test_two_different_rope_scalings_refused() -> None:
    v5 = {**LLAMA32_CONFIG, "rope_parameters": {**LLAMA32_CONFIG["rope_scaling"], "factor": 8.0}}
    with pytest.raises(ConfigError, match="rope scaling more than once"):
        ModelConfig.from_dict(v5)


# Qwen3-0.6B's config.json (values as published): head_dim 128 with 16 heads over hidden 1024.
QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen3_config() -> None:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = ModelConfig.from_dict(QWEN3_CONFIG)
    assert (c.arch, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.q_dim) == \
        ("qwen3", 1024, 16, 8, 128, 2048)
    assert not c.attention_bias and c.tie_word_embeddings and c.rope_scaling is None
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


def test_qwen3_attention_bias_refused() -> None:
    with pytest.raises(ConfigError, match="o_proj") as ei:
        ModelConfig.from_dict({**QWEN3_CONFIG, "attention_bias": True})
    assert ei.value.field == "attention_bias"



@pytest.mark.parametrize("rope,words", [
    ({"rope_type": "default", "rope_theta": 1e6, "factor": 4.0}, "'factor'"),
    ({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}, "partial_rotary"),
    ({"rope_type": "default", "type": "linear", "rope_theta": 1e6}, "two rope types"),
    ({"rope_type": "default", "rope_theta": None}, "positive number"),
    ({"rope_type": "default", "rope_theta": "1e6"}, "positive number"),
    ([1e6], "must be an object"),
])
def test_bad_rope_parameters_refused(rope: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as ei:
        ModelConfig.from_dict({**QWEN2_CONFIG_V5, "rope_parameters": rope})
    assert ei.value.field == "rope_parameters"


@pytest.mark.parametrize("key,value", [
    ("partial_rotary_factor", 0.5), ("rope_interleaved", True), ("attn_logit_softcapping", 50.0),
    ("final_logit_softcapping", 30.0), ("query_pre_attn_scalar", 256), ("embedding_multiplier", 12.0),
    ("residual_multiplier", 0.22), ("attention_multiplier", 0.015625), ("logits_scaling", 8.0),
    ("logit_scale", 0.0625), ("use_qk_norm", True), ("qk_layernorm", True),
    ("use_parallel_residual", True), ("num_experts", 8), ("num_local_experts", 8),
    ("pruned_heads", {"0": [1]}), ("quantization_config", {"quant_method": "gptq", "bits": 4}),
    ("mlp_bias", True), ("hidden_act", "gelu_pytorch_tanh"),
])
@pytest.mark.parametrize("base", [QWEN2_CONFIG, LLAMA_CONFIG], ids=["qwen2", "llama"])
def test_unimplemented_arithmetic_refused_by_name(base: dict, key: str, value: object) -> None:
    with pytest.raises(ConfigError) as ei:
        ModelConfig.from_dict({**base, key: value})
    assert ei.value.field == key and key in str(ei.value)


@pytest.mark.parametrize("key,value", [
    ("partial_rotary_factor", 1.0), ("rope_interleaved", False), ("attn_logit_softcapping", None),
    ("embedding_multiplier", 1.0), ("num_experts", 0), ("pruned_heads", {}),
    ("quantization_config", None), ("mlp_bias", False), ("hidden_act", "swish"),
])
def test_neutral_values_accepted(key: str, value: object) -> None:
    assert ModelConfig.from_dict({**LLAMA_CONFIG, key: value}) == ModelConfig.from_dict(LLAMA_CONFIG)


@pytest.mark.parametrize("change,field", [
    # transformers 5 Qwen2: layers from max_window_layers on slide when use_sliding_window is set
    ({"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 12}, "use_sliding_window"),
    ({"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0}, "use_sliding_window"),
    ({"use_sliding_window": True, "sliding_window": 4096,
      "layer_types": ["full_attention"] * 23 + ["sliding_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 24}, "layer_types"),         # a window of no stated size
])
def test_qwen2_sliding_window_where_used_refused(change: dict, field: str) -> None:
    with pytest.raises(ConfigError, match="sliding-window attention is not implemented") as ei:
        ModelConfig.from_dict({**QWEN2_CONFIG, **change})
    assert ei.value.field == field


@pytest.mark.parametrize("change", [
    {"use_sliding_window": True},                       # window 32768 = max_position_embeddings
    {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 24},  # no layer slides
    {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 0},  # switched off
    {"sliding_window": None, "max_window_layers": 28},
])
def test_qwen2_sliding_window_that_cannot_bite_accepted(change: dict) -> None:
    assert ModelConfig.from_dict({**QWEN2_CONFIG, **change}) == ModelConfig.from_dict(QWEN2_CONFIG)


def test_llama_sliding_window_refused() -> None:
    with pytest.raises(ConfigError, match="window") as ei:
        ModelConfig.from_dict({**LLAMA_CONFIG, "sliding_window": 4096})
    assert ei.value.field == "sliding_window"
    assert ModelConfig.from_dict({**LLAMA_CONFIG, "sliding_window": None}).arch == "llama"


@pytest.mark.parametrize("change", [
    {"architectures": ["Qwen2ForCausalLM"], "model_type": "llama"},
    {"architectures": ["LlamaForCausalLM"], "model_type": "qwen2"},
    {"architectures": ["LlamaForCausalLM"], "model_type": "mistral"},
    {"architectures": ["LlamaForCausalLM"], "model_type": ["llama"]},
])
def test_model_type_and_architectures_must_agree(change: dict) -> None:
    with pytest.raises(ConfigError, match="contradicts itself") as ei:
        ModelConfig.from_dict({**LLAMA_CONFIG, **change})
    assert ei.value.field == "model_type" and repr(change["model_type"]) in str(ei.value)


def test_unknown_key_warns_by_name() -> None:
    from ignis.loader.config import UnknownConfigKeyWarning
    with pytest.warns(UnknownConfigKeyWarning, match="'my_new_scaling'"):
        cfg = ModelConfig.from_dict({**QWEN2_CONFIG, "my_new_scaling": 2.0})
    assert cfg == ModelConfig.from_dict(QWEN2_CONFIG)


@pytest.mark.parametrize("field,value", [("repetition_penalty", 0), ("temperature", 10**400),
                                         ("top_p", -0.5), ("repetition_penalty", float("inf"))])
def test_generation_config_numbers_out_of_range_are_refused(field, value) -> None:
    """A repetition penalty of 0 would divide by zero; an integer past the float range is no
    number a sampler can use (transformers requires a strictly positive penalty too)."""
    with pytest.raises(ConfigError) as e:
        GenerationConfig.from_dict({field: value})
    assert e.value.field == field
