"""weight_format="auto", the default of ignis.load, Client, the CLI and the server: a model imported
from a GGUF file runs in the file's own blocks, a float checkpoint in q8, and a CPU whose kernel
table has no fast kernel for that pick gets the fastest format it has, said once."""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_gguf_import import write_gguf

import ignis
from ignis import _core
from ignis.api.cli import main
from ignis.loader.gguf_import import import_gguf
from ignis.loader.resolve import open_dir
from ignis.runtime import Engine
from ignis.runtime.engine import choose_weight_format

IDS = np.array([3, 17, 5, 9, 1], np.int32)
ACTIVE = _core.active_kernels()


def _fast(fmt: str, table: str) -> bool:
    from ignis.formats import FORMATS
    info = next(t for t in _core.kernel_tables() if t["name"] == table)
    return not set(info["portable"]) & set(FORMATS[fmt].matmuls)


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))      # a fresh conversion cache


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf-auto")
    src = d / "tiny.gguf"
    write_gguf(src, "qwen2", tied=False, qtype=QT.Q4_K)
    import_gguf(src, d / "model", progress=False)
    return d / "model"


def test_a_gguf_import_runs_in_its_own_blocks(imported):
    if not _fast("gguf", ACTIVE):
        pytest.skip(f"the {ACTIVE} table has no gguf kernel: the fallback test covers it")
    files = open_dir(imported, name="tiny")
    auto = Engine(files, n_ctx=32, threads=1, weight_format="auto")
    own = Engine(files, n_ctx=32, threads=1, weight_format="gguf")
    assert auto.options.weight_format == "gguf" and auto.weight_choice.name == "gguf"
    assert "GGUF" in auto.weight_choice.reason and not auto.weight_choice.fallback
    np.testing.assert_array_equal(auto.forward(IDS), own.forward(IDS))


def test_a_float_checkpoint_runs_in_q8_and_f32_stays_exact(tiny_qwen2_dir):
    files = open_dir(tiny_qwen2_dir, name="tiny")
    choice = choose_weight_format(files)
    assert choice.name == "q8" and "f32" in choice.reason
    auto = Engine(files, n_ctx=32, threads=1, weight_format="auto")
    q8 = Engine(files, n_ctx=32, threads=1, weight_format="q8")
    np.testing.assert_array_equal(auto.forward(IDS), q8.forward(IDS))
    assert Engine(files, n_ctx=32, threads=1).options.weight_format == "f32"   # Engine: exact


def test_load_defaults_to_auto_and_says_what_it_chose(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=32, threads=1, progress=False)
    exact = ignis.load(str(tiny_chat_dir), n_ctx=32, threads=1, progress=False, weight_format="f32")
    try:
        assert m.weight_format == "q8" and exact.weight_format == "f32"
        # f32 weights keep an f32 cache; f16 where the attention reads it at f32's speed
        assert m.kv_dtype == ("f16" if ACTIVE.startswith("avx512") else "f32")
        assert exact.kv_dtype == "f32"
        assert m.engine.weight_choice.reason.startswith("a float checkpoint")
    finally:
        m.weights.close()
        exact.weights.close()


def test_a_table_without_the_kernel_falls_back_to_its_fastest_and_says_so_once(imported):
    files = open_dir(imported, name="tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eng = Engine(files, n_ctx=32, threads=1, weight_format="auto", kernels="generic")
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    # generic has no kernel of its own for any format: its portable q8 is the fastest of them
    assert eng.options.weight_format == "q8" and eng.weight_choice.fallback
    assert said == ["weight_format='auto': 'gguf' has no generic kernel on this CPU (its portable C "
                    "code is several times slower): 'q8' instead"]
    # a table with a gguf kernel keeps the file's blocks; one without picks one it has
    for t in _core.kernel_tables():
        if t["eligible"]:
            got = choose_weight_format(files, t["name"]).name
            assert got == "gguf" if _fast("gguf", t["name"]) else got != "gguf"


def test_auto_kv_cache_is_f16_only_where_the_attention_reads_it_fast():
    from ignis.runtime.engine import choose_kv_dtype
    assert choose_kv_dtype("gguf", "avx512_vnni") == choose_kv_dtype("q8", "avx512") == "f16"
    assert choose_kv_dtype("q4", "avx2") == "f16"
    assert choose_kv_dtype("f32", "avx512_vnni") == choose_kv_dtype("f32", "avx2") == "f32"
    assert choose_kv_dtype("gguf", "generic") == choose_kv_dtype("gguf", "neon_dotprod") == "f32"


def test_bad_weight_formats_are_refused_by_name(tiny_qwen2_dir):
    files = open_dir(tiny_qwen2_dir, name="tiny")
    for bad in ("Auto", "q3", "", None, 8):
        with pytest.raises(ignis.RuntimeInputError, match="weight_format must be 'auto' or one of"):
            Engine(files, n_ctx=32, threads=1, weight_format=bad)
        with pytest.raises(ignis.RuntimeInputError, match="kv_dtype must be 'auto', 'f32' or 'f16'"):
            Engine(files, n_ctx=32, threads=1, kv_dtype=bad)
    r = subprocess.run([sys.executable, "-m", "ignis", "run", str(tiny_qwen2_dir), "hi",
                        "--weights", "fast"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice: 'fast'" in r.stderr and "auto" in r.stderr


def test_show_and_verbose_say_what_auto_runs(tiny_chat_dir, imported, capsys):
    assert main(["show", str(tiny_chat_dir), "-q"]) == 0
    assert "runs as      q8 by default (a float checkpoint" in capsys.readouterr().out
    assert main(["show", str(imported), "-q"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("runs as"))
    assert line.startswith("runs as      gguf by default" if _fast("gguf", ACTIVE) else "runs as      q8")
    assert main(["run", str(tiny_chat_dir), "hi", "--max-tokens", "2", "--threads", "1", "-q",
                 "--verbose"]) == 0
    err = capsys.readouterr().err
    kv = "f16" if ACTIVE.startswith("avx512") else "f32"
    assert "weights:          q8 (a float checkpoint" in err
    assert f"KV cache {kv}; kernels {ACTIVE}, threads 1" in err


def test_auto_does_not_pick_blocks_it_cannot_read(tmp_path, monkeypatch):
    """A GGUF import whose file is gone (and not a registry model's, which is assembled again) or
    whose matrices have no block layout runs q8, saying why; an explicit gguf still names the file."""
    src = tmp_path / "gone.gguf"
    write_gguf(src, "qwen2", tied=False, qtype=QT.Q4_K)
    gone = import_gguf(src, tmp_path / "gone", progress=False)
    src.unlink()
    choice = choose_weight_format(open_dir(gone, name="tiny"))
    assert choice.name == "q8" and "is gone" in choice.reason and str(src) in choice.reason
    eng = Engine(open_dir(gone, name="tiny"), n_ctx=16, threads=1, weight_format="auto")
    assert eng.options.weight_format == "q8"
    with pytest.raises(ignis.RuntimeInputError, match="missing"):
        Engine(open_dir(gone, name="tiny"), n_ctx=16, threads=1, weight_format="gguf")

    f16 = tmp_path / "f16.gguf"
    write_gguf(f16, "qwen2", tied=False, qtype=QT.F16)
    choice = choose_weight_format(open_dir(import_gguf(f16, tmp_path / "f16", progress=False),
                                           name="tiny"))
    assert choice.name == "q8" and "without block types" in choice.reason
