"""The compiled-step cache (ignis.step_cache): a tape read from the cache is the tape compile_step
makes (same text, same records, same constants and graph facts), an Engine on it gives bit-identical
logits, the key separates every input that changes the step, and a damaged, truncated, stale or
unwritable cache costs a warning and a compile, never an error or a wrong tape."""
from __future__ import annotations

import json
import os
import time
import warnings
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ignis import step_cache
from ignis.compiler import compile_step
from ignis.loader.config import RopeScaling
from ignis.loader.resolve import open_dir
from ignis.runtime import Engine
from reference_configs import qwen25_05b

TINY = replace(qwen25_05b(), dim=64, hidden_dim=128, n_layers=2, n_heads=4, n_kv_heads=2,
               head_dim=16, vocab_size=300)
CONFIGS = {
    "qwen2": TINY,
    # a graph constant (the llama3 rope table) goes through the payload
    "llama3": replace(TINY, arch="llama", attention_bias=False,
                      rope_scaling=RopeScaling("llama3", factor=8.0, original_max_position_embeddings=64)),
    # attention windows (the Engine's ring rule reads them) and a constant
    "gemma3": replace(TINY, arch="gemma3", attention_bias=False, tie_word_embeddings=True,
                      layer_types=("sliding_attention", "full_attention"), sliding_window=16,
                      rope_local_theta=10000.0, query_pre_attn_scalar=16),
}
OPTS = dict(max_batch_tokens=8, n_ctx=64, logit_rows=8)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("IGNIS_HOME", str(h))
    monkeypatch.delenv(step_cache.ENV, raising=False)
    return h


def files(home: Path) -> list[Path]:
    d = home / "steps"
    return sorted(d.glob("*.bin")) if d.is_dir() else []


def assert_same(a: step_cache.LoweredStep, b: step_cache.LoweredStep) -> None:
    assert a.tape.format() == b.tape.format()
    assert a.tape.to_records().tobytes() == b.tape.to_records().tobytes()
    assert a.tape == replace(b.tape, constants=a.tape.constants)      # every field, instrs included
    assert a.tape.constants.keys() == b.tape.constants.keys()
    for k, v in a.tape.constants.items():
        w = b.tape.constants[k]
        assert v.dtype == w.dtype and v.shape == w.shape and v.tobytes() == w.tobytes()
    assert (a.weight_shapes, a.windows, a.planned) == (b.weight_shapes, b.windows, b.planned)


def fresh(config, **opts) -> step_cache.LoweredStep:
    return step_cache.lowered(compile_step(config, **{**OPTS, **opts}))


def test_reading_a_cached_step_marks_its_last_use(home):
    step_cache.load_or_compile(TINY, **OPTS)
    (f,) = files(home)
    old = time.time() - 40 * 86400
    os.utime(f, (old, old))
    assert step_cache.load_or_compile(TINY, **OPTS).cached
    assert time.time() - f.stat().st_mtime < 3600     # what `ignis prune --days` reads


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_cached_step_is_the_compiled_step(home, name):
    config = CONFIGS[name]
    first = step_cache.load_or_compile(config, **OPTS)
    assert not first.cached and len(files(home)) == 1
    second = step_cache.load_or_compile(config, **OPTS)
    assert second.cached
    assert_same(second, fresh(config))
    assert_same(first, second)
    if name == "gemma3":
        assert second.windows == (16, 0)
    if name != "qwen2":
        assert second.tape.constants


def test_off_switch_neither_reads_nor_writes(home, monkeypatch):
    monkeypatch.setenv(step_cache.ENV, "0")
    s = step_cache.load_or_compile(TINY, **OPTS)
    assert not s.cached and files(home) == []
    assert not step_cache.load_or_compile(TINY, **OPTS, cache=False).cached


@pytest.mark.parametrize("change", [
    dict(n_ctx=128), dict(max_batch_tokens=4), dict(logit_rows=1), dict(output="hidden"),
    dict(passes=["dce"]), dict(plan=False), dict(config=replace(TINY, rms_norm_eps=1e-5)),
    dict(config=replace(TINY, n_layers=3)),
])
def test_every_input_of_the_step_has_its_own_file(home, change):
    base = step_cache.load_or_compile(TINY, **OPTS)
    opts = {**OPTS, **{k: v for k, v in change.items() if k != "config"}}
    config = change.get("config", TINY)
    other = step_cache.load_or_compile(config, **opts)
    assert not other.cached and len(files(home)) == 2
    assert_same(other, step_cache.lowered(compile_step(config, **opts)))
    again = step_cache.load_or_compile(TINY, **OPTS)
    assert again.cached
    assert_same(again, base)


def test_the_planner_switch_is_part_of_the_key(home, monkeypatch):
    planned = step_cache.load_or_compile(TINY, **OPTS)
    monkeypatch.setenv("IGNIS_NO_PLAN", "1")
    unplanned = step_cache.load_or_compile(TINY, **OPTS)
    assert not unplanned.cached and not unplanned.planned and planned.planned
    assert unplanned.tape.arena_bytes > planned.tape.arena_bytes


def test_other_code_never_reads_an_old_file_and_removes_it_once_unused(home, monkeypatch):
    step_cache.load_or_compile(TINY, **OPTS)
    [old] = files(home)
    assert old.stat().st_mode & 0o777 == 0o644          # an ordinary file, not mkstemp's 0600
    monkeypatch.setattr(step_cache, "code_hash", lambda: "0" * 32)     # as after editing a pass
    s = step_cache.load_or_compile(TINY, **OPTS)
    assert not s.cached
    # another install sharing this home may still read the old file: kept while it is recent
    assert sorted(files(home)) == sorted([old, old.with_name(old.name.rsplit("-", 1)[0] + "-" + "0" * 32 + ".bin")])
    assert step_cache.load_or_compile(TINY, **OPTS).cached
    day_ago = old.stat().st_mtime - step_cache.OTHER_CODE_KEPT_S - 60
    os.utime(old, (day_ago, day_ago))
    monkeypatch.setattr(step_cache, "code_hash", lambda: "1" * 32)
    assert not step_cache.load_or_compile(TINY, **OPTS).cached
    names = sorted(p.name.rsplit("-", 1)[1] for p in files(home))
    assert names == ["0" * 32 + ".bin", "1" * 32 + ".bin"]     # the day-old file went


def test_another_users_file_is_neither_read_nor_replaced(home, monkeypatch):
    step_cache.load_or_compile(TINY, **OPTS)
    [path] = files(home)
    before = path.read_bytes()
    uid = os.getuid()
    monkeypatch.setattr(step_cache.os, "getuid", lambda: uid + 1)   # as another user sees it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = step_cache.load_or_compile(TINY, **OPTS)
    assert not s.cached
    assert_same(s, fresh(TINY))
    assert files(home) == [path] and path.read_bytes() == before


def test_code_hash_covers_the_passes_and_the_op_table():
    root = Path(step_cache.__file__).parent
    hashed = set()
    for s in step_cache.SOURCES:
        p = root / s
        hashed |= set(p.glob("*.py")) if p.is_dir() else {p}
    for f in ("passes/pipeline.py", "passes/fuse_qkv.py", "ir/ops.py", "ir/verify.py",
              "plan/arena.py", "plan/tape.py", "models/qwen2.py", "models/rope.py", "compiler.py"):
        assert root / f in hashed


def _header_len(path: Path) -> int:
    return step_cache._PREFIX.unpack_from(path.read_bytes())[2]


def _header(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(data[step_cache._PREFIX.size:step_cache._PREFIX.size + _header_len(path)])


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flipped":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "magic":
        path.write_bytes(b"NOTASTEP" + data[8:])
    elif how == "version":
        path.write_bytes(data[:8] + (99).to_bytes(4, "little") + data[12:])
    elif how == "other key":            # a whole, checksummed file written for another step
        path.write_bytes(step_cache.serialize(fresh(TINY, n_ctx=32), "another-key"))
    elif how == "bad header":           # checksummed, but the JSON does not fit together
        body = ('{"key": "%s", "instrs": [[1, "x"]]}' % path.stem).encode()
        path.write_bytes(step_cache._PREFIX.pack(step_cache.MAGIC, step_cache.FORMAT_VERSION,
                                                 len(body), zlib.crc32(body)) + body)
    elif how == "deep header":          # json.loads gives up with a RecursionError
        body = b"[" * 200_000 + b"]" * 200_000
        path.write_bytes(step_cache._PREFIX.pack(step_cache.MAGIC, step_cache.FORMAT_VERSION,
                                                 len(body), zlib.crc32(body)) + body)
    elif how == "constants not a dict":
        head = _header(path)
        head["constants"] = [1, 2]
        body = json.dumps(head).encode()
        payload = path.read_bytes()[step_cache._PREFIX.size + _header_len(path):]
        rest = body + payload
        path.write_bytes(step_cache._PREFIX.pack(step_cache.MAGIC, step_cache.FORMAT_VERSION,
                                                 len(body), zlib.crc32(rest)) + rest)
    elif how == "directory":
        path.unlink()
        path.mkdir()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["flipped", "truncated", "empty", "magic", "version", "other key",
                                 "bad header", "deep header", "constants not a dict"])
def test_a_damaged_or_stale_file_is_compiled_again_and_replaced(home, how):
    good = step_cache.load_or_compile(TINY, **OPTS)
    [path] = files(home)
    _damage(path, how)
    with pytest.warns(RuntimeWarning, match="step cache"):
        s = step_cache.load_or_compile(TINY, **OPTS)
    assert not s.cached
    assert_same(s, good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = step_cache.load_or_compile(TINY, **OPTS)     # the file was written again
    assert again.cached
    assert_same(again, good)


def test_an_unreadable_or_unwritable_cache_only_warns(home):
    home.mkdir(parents=True)
    (home / "steps").write_text("a file where the directory should be")
    with pytest.warns(RuntimeWarning, match="could not store the compiled step"):
        s = step_cache.load_or_compile(TINY, **OPTS)
    assert not s.cached
    assert_same(s, fresh(TINY))


def test_a_directory_in_place_of_the_file_only_warns(home):
    step_cache.load_or_compile(TINY, **OPTS)
    [path] = files(home)
    _damage(path, "directory")
    with pytest.warns(RuntimeWarning):
        s = step_cache.load_or_compile(TINY, **OPTS)
    assert_same(s, fresh(TINY))


@pytest.mark.parametrize("weight_format", ["f32", "q8"])
def test_engine_logits_are_bit_identical_with_and_without_the_cache(home, monkeypatch,
                                                                    tiny_qwen2_dir, weight_format):
    model = open_dir(tiny_qwen2_dir, name="tiny-qwen2")
    ids = np.array([1, 5, 9, 2, 7, 3, 11, 4, 6, 8], np.int32)

    def logits() -> tuple[np.ndarray, Engine]:
        eng = Engine(model, n_ctx=64, max_batch_tokens=8, weight_format=weight_format, threads=2)
        return eng.forward(ids, logits_for="all"), eng

    monkeypatch.setenv(step_cache.ENV, "0")
    off, e_off = logits()
    assert not e_off.step_info.cached and files(home) == []
    monkeypatch.delenv(step_cache.ENV)
    written, e_w = logits()
    hit, e_hit = logits()
    assert not e_w.step_info.cached and e_hit.step_info.cached
    assert off.tobytes() == written.tobytes() == hit.tobytes()
    assert e_hit.options == e_off.options and e_hit._ring == e_off._ring
    model.weights.close()


def test_engine_on_a_windowed_model_keeps_its_ring_rule(home):
    from ignis.runtime.engine import compile_engine_step
    config = CONFIGS["gemma3"]
    direct = compile_engine_step(config, n_ctx=64, max_batch_tokens=8)
    s = step_cache.load_or_compile(config, max_batch_tokens=8, n_ctx=64, logit_rows=8)
    s = step_cache.load_or_compile(config, max_batch_tokens=8, n_ctx=64, logit_rows=8)
    assert s.cached
    assert s.windows == tuple(n.attrs["window"] for n in direct.graph.nodes
                              if n.op == "attention_window")
    assert os.path.getsize(files(home)[0]) > 0
