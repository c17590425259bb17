"""ignis compile and the compiled library's C ABI (ignis/native, csrc/native, ignis_model.h).

The library is held to the in-process engine: the same logits bit for bit (ignis_logits against
Engine.forward, same kernel table and KV storage) and the same greedy ids, in every weight format
on the tiny models (gguf from a tiny GGUF file mixing block types), and on the default model (slow).
A C program (tests/c/native_smoke.c) runs the library with an empty environment; damaged,
truncated and mismatched files are refused with both values named; readelf shows only libc, libm,
libpthread."""
from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from tools_required import require_tool

import ignis
from ignis.native import (ABI_VERSION, CompilerMissingError, NativeCompileError, compile_model)
from ignis.native.blob import pack_blob, unpack_blob
from ignis.native.weights_file import sample_digest, sample_offsets

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[5, 17, 3, 33, 42], [256, 257, 10, 11, 12, 13, 258],
           [int(i) for i in np.random.default_rng(7).integers(0, 250, 150)]]   # > one 128-token chunk
MAX_NEW = 12
FORMATS = ["f32", "q8", "q4", "bf16"]


def _cc() -> str:
    return require_tool("cc", "apt-get install gcc", "the compiled library")


class Lib:
    """ctypes view of a compiled library."""

    def __init__(self, path: Path):
        self.dll = ctypes.CDLL(str(path))
        d = self.dll
        d.ignis_open.restype = ctypes.c_void_p
        d.ignis_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        d.ignis_last_error.restype = ctypes.c_char_p
        d.ignis_close.argtypes = [ctypes.c_void_p]
        d.ignis_generate_ids.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_int]
        d.ignis_logits.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int]
        d.ignis_model_info.restype = ctypes.c_void_p      # a malloc'd string: freed by ignis_free
        d.ignis_model_info.argtypes = [ctypes.c_void_p]
        d.ignis_free.argtypes = [ctypes.c_void_p]

    def open(self, directory, options: str | None = None):
        h = self.dll.ignis_open(None if directory is None else str(directory).encode(),
                                options.encode() if options is not None else None)
        return h, self.dll.ignis_last_error().decode()

    def info(self, h) -> dict:
        p = self.dll.ignis_model_info(h)
        assert p, self.dll.ignis_last_error().decode()
        try:
            return json.loads(ctypes.string_at(p).decode())
        finally:
            self.dll.ignis_free(p)

    def generate(self, h, prompt, max_new=MAX_NEW) -> list[int]:
        p = np.asarray(prompt, np.int32)
        out = np.zeros(max_new, np.int32)
        n = self.dll.ignis_generate_ids(h, p.ctypes.data, p.size, max_new, out.ctypes.data, out.size)
        assert n >= 0, self.dll.ignis_last_error().decode()
        return out[:n].tolist()

    def logits(self, h, prompt, vocab) -> np.ndarray:
        p = np.asarray(prompt, np.int32)
        out = np.zeros(vocab, np.float32)
        n = self.dll.ignis_logits(h, p.ctypes.data, p.size, out.ctypes.data, out.size)
        assert n == vocab, self.dll.ignis_last_error().decode()
        return out


def python_greedy(model, prompt, max_new=MAX_NEW) -> tuple[list[int], np.ndarray]:
    """The in-process engine's greedy ids (argmax over the tokenizer's ids, stop at any EOS) and
    the prompt's last logits."""
    eng = model.engine
    eng.reset()
    x = eng.forward(prompt)[0]
    first = x.copy()
    ids = []
    for _ in range(max_new):
        t = int(np.argmax(np.where(model._valid, x, -np.inf)))
        if t in model.eos_token_ids:
            break
        ids.append(t)
        if eng.n_past >= eng.n_ctx:
            break
        x = eng.forward([t])[0]
    return ids, first


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny GGUF file of several block types (the gguf format runs them as stored)."""
    from gguf import GGMLQuantizationType as QT
    from test_gguf_import import write_gguf
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    write_gguf(path, "qwen2", tied=False, qtype=QT.Q8_0,
               qtypes={"blk.0.ffn_down.weight": QT.Q4_K, "blk.1.attn_q.weight": QT.Q5_0,
                       "blk.1.ffn_up.weight": QT.Q6_K})
    return path


@pytest.fixture(scope="module")
def compiled(tiny_chat_dir, tmp_path_factory):
    """weight format -> (compile result, library); compiled once per module."""
    _cc()
    out = {}

    def get(fmt: str, model=None):
        if fmt not in out:
            d = tmp_path_factory.mktemp(f"compiled-{fmt}")
            r = compile_model(str(model or tiny_chat_dir), d / "out", weights=fmt, progress=False)
            out[fmt] = (r, Lib(r.library))
        return out[fmt]
    return get


@pytest.mark.parametrize("fmt", FORMATS)
def test_library_matches_the_engine(fmt, compiled, tiny_chat_dir):
    r, lib = compiled(fmt)
    assert r.weight_format == fmt and r.library.name == "libignis_tiny-chat.so"
    h, err = lib.open(r.directory)
    assert h, err
    try:
        model = ignis.load(str(tiny_chat_dir), weight_format=fmt, progress=False)
        vocab = model.config.vocab_size
        info = lib.info(h)
        opts = model.engine.options
        assert (info["kernels"], info["kv_dtype"], info["threads"], info["n_ctx"], info["max_batch_tokens"]) \
            == (opts.kernels, opts.kv_dtype, opts.threads, opts.n_ctx, opts.max_batch_tokens)
        c = info["compiled"]
        assert (c["model"], c["weight_format"], c["vocab_size"], c["tokenizer"]) == ("tiny-chat", fmt, vocab, True)
        assert c["eos_token_ids"] == list(model.eos_token_ids)
        assert c["generation"]["temperature"] == model.generation_config.temperature
        for prompt in PROMPTS:
            want_ids, want_logits = python_greedy(model, prompt)
            got = lib.logits(h, prompt, vocab)
            np.testing.assert_array_equal(got, want_logits)          # same kernels: bit for bit
            assert lib.generate(h, prompt) == want_ids
    finally:
        lib.dll.ignis_close(h)


class _EngineModel:
    """What python_greedy reads, for a model without a tokenizer ignis can read (the tiny GGUF's
    made-up vocabulary): every id may be generated, EOS from its generation config."""

    def __init__(self, files, **engine_kwargs):
        from ignis.runtime.engine import Engine
        self.engine = Engine(files, **engine_kwargs)
        self.config = files.config
        self._valid = np.ones(files.config.vocab_size, bool)
        self.eos_token_ids = tuple(files.generation_config.eos_token_ids)


def test_gguf_format_matches_the_engine(compiled, tiny_gguf):
    from ignis import _core
    from ignis.loader.resolve import open_model
    from ignis.runtime.engine import choose_kv_dtype
    with pytest.warns(RuntimeWarning, match="tokenizer cannot be read"):
        r, lib = compiled("gguf", tiny_gguf)
    files = open_model(str(tiny_gguf), progress=False)
    model = _EngineModel(files, weight_format="gguf", kv_dtype=choose_kv_dtype("gguf", _core.active_kernels()))
    h, err = lib.open(r.directory)
    assert h, err
    try:
        for prompt in ([1, 2, 3, 4], [10, 20, 30, 40, 50, 60], [7] * 40):
            want_ids, want_logits = python_greedy(model, prompt)
            np.testing.assert_array_equal(lib.logits(h, prompt, model.config.vocab_size), want_logits)
            assert lib.generate(h, prompt) == want_ids
    finally:
        lib.dll.ignis_close(h)
        files.weights.close()


def test_files_and_versions(compiled):
    r, lib = compiled("q8")
    assert lib.dll.ignis_abi_version() == ABI_VERSION == 1
    manifest = json.loads((r.directory / "manifest.json").read_text())
    data = (r.directory / "weights.bin").read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["size"] == len(data) == r.weights_bytes
    assert (manifest["model"], manifest["architecture"], manifest["weight_format"]) == ("tiny-chat", "qwen2", "q8")
    assert manifest["abi_version"] == 1 and manifest["ignis_version"] == ignis.__version__
    assert (r.directory / "ignis_model.h").read_text() == (ROOT / "csrc/native/ignis_model.h").read_text()
    assert sorted(p.name for p in r.directory.iterdir()) == sorted(
        ["ignis_model.h", "libignis_tiny-chat.so", "manifest.json", "weights.bin"])


def test_one_handle_from_two_threads(compiled):
    """Calls on one handle queue on its mutex: concurrent results equal the serial ones."""
    r, lib = compiled("q8")
    h, err = lib.open(r.directory)
    assert h, err
    try:
        want = [lib.generate(h, p) for p in PROMPTS]
        got = {}

        def work(i):
            got[i] = [lib.generate(h, p) for p in PROMPTS]
        ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert all(got[i] == want for i in range(3))
    finally:
        lib.dll.ignis_close(h)


def _copy(r, tmp_path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(r.directory, d)
    return d


def _refused(lib, d, options=None) -> str:
    h, err = lib.open(d, options)
    if h:
        lib.dll.ignis_close(h)
    assert not h, "opened"
    assert err
    return err


def test_damaged_and_mismatched_files_are_refused(compiled, tmp_path):
    r, lib = compiled("f32")
    sha = json.loads((r.directory / "manifest.json").read_text())["sha256"]
    size = r.weights_bytes
    # a byte flipped in a sampled chunk (the first): refused by the default check
    d = _copy(r, tmp_path)
    w = bytearray((d / "weights.bin").read_bytes())
    w[100] ^= 0x40
    (d / "weights.bin").write_bytes(bytes(w))
    err = _refused(lib, d)
    assert "sampled chunks" in err and sha in err
    # a byte in the middle: this file (< 256 chunks of 4 KiB) is sampled whole, so the default
    # check refuses it too; the full check names the file's actual sha256
    w[100] ^= 0x40
    assert sum(n for _, n in sample_offsets(size)) >= size
    w[size // 2 + 1] ^= 1
    (d / "weights.bin").write_bytes(bytes(w))
    assert "sampled chunks" in _refused(lib, d)
    got_sha = hashlib.sha256(bytes(w)).hexdigest()
    err = _refused(lib, d, '{"verify_weights": true}')
    assert got_sha in err and sha in err
    # truncated: both sizes named
    (d / "weights.bin").write_bytes(bytes(w[:-64]))
    err = _refused(lib, d)
    assert f"{size - 64} bytes" in err and f"{size} bytes" in err
    # weights and manifest of another compile (q8) beside this library
    q8, _ = compiled("q8")
    shutil.copy(q8.directory / "weights.bin", d / "weights.bin")
    shutil.copy(q8.directory / "manifest.json", d / "manifest.json")
    q8_sha = json.loads((q8.directory / "manifest.json").read_text())["sha256"]
    err = _refused(lib, d)
    assert q8_sha in err and sha in err
    # a manifest of another ABI version
    d2 = tmp_path / "abi"
    shutil.copytree(r.directory, d2)
    m = json.loads((d2 / "manifest.json").read_text())
    m["abi_version"] = 999
    (d2 / "manifest.json").write_text(json.dumps(m))
    err = _refused(lib, d2)
    assert "ABI version 999" in err and "ABI version 1" in err
    (d2 / "manifest.json").write_text("{not json")
    assert "not valid JSON" in _refused(lib, d2)
    # the wrong directory
    err = _refused(lib, tmp_path / "nowhere")
    assert "manifest.json" in err and "No such file" in err


def test_embedded_weights(compiled, tiny_chat_dir, tmp_path, capsys):
    """--embed-weights: the same weights bytes inside the library, no weights.bin; it opens with
    its directory (whose manifest is still checked) or with NULL, and answers as the library
    beside a weights.bin does; a damaged embedded copy is refused as a damaged file is."""
    r, lib = compiled("q8")
    from ignis.api.cli import main
    assert main(["compile", str(tiny_chat_dir), "-o", str(tmp_path / "e"), "--weights", "q8",
                 "--embed-weights", "-q"]) == 0
    assert "of q8 weights" in capsys.readouterr().out
    d = tmp_path / "e"
    assert sorted(p.name for p in d.iterdir()) == ["ignis_model.h", "libignis_tiny-chat.so", "manifest.json"]
    m, m0 = (json.loads((x / "manifest.json").read_text()) for x in (d, r.directory))
    assert (m["weights"], m["embedded_weights"], m0["embedded_weights"]) == (None, True, False)
    assert (m["sha256"], m["size"]) == (m0["sha256"], m0["size"])
    so = (d / "libignis_tiny-chat.so").read_bytes()
    at = so.find((r.directory / "weights.bin").read_bytes())
    assert at >= 0 and at % 4096 == 0                  # the very bytes, page-aligned in the file
    elib = Lib(d / "libignis_tiny-chat.so")
    h0, err = lib.open(r.directory)
    assert h0, err
    try:
        vocab = lib.info(h0)["compiled"]["vocab_size"]
        for where in (d, None):
            h, err = elib.open(where)
            assert h, err
            try:
                for prompt in PROMPTS:
                    np.testing.assert_array_equal(elib.logits(h, prompt, vocab), lib.logits(h0, prompt, vocab))
                    assert elib.generate(h, prompt) == lib.generate(h0, prompt)
            finally:
                elib.dll.ignis_close(h)
    finally:
        lib.dll.ignis_close(h0)
    # the client reads the directory as before
    with ignis.Client(native=d) as c:
        out = c.completions.create(model="tiny-chat", prompt="hello", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1
    # a library without embedded weights needs its directory
    assert "--embed-weights" in _refused(lib, None)
    # the manifest beside an embedded library is still held to it
    m["sha256"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    assert "0" * 64 in _refused(elib, d)
    # a byte flipped inside the embedded copy (a sampled chunk): refused at open
    bad = tmp_path / "bad"
    bad.mkdir()
    so = bytearray(so)
    so[at + sample_offsets(m0["size"])[1][0] + 7] ^= 0x10
    (bad / "libignis_tiny-chat.so").write_bytes(bytes(so))
    err = _refused(Lib(bad / "libignis_tiny-chat.so"), None)
    assert "embedded weights" in err and "sampled chunks" in err


def test_options_are_checked(compiled):
    r, lib = compiled("q8")
    for options, words in [("[1]", "must be a JSON object"), ('{"threads": 0}', "threads"),
                           ('{"threads": 1.5}', "threads"), ('{"thread": 2}', 'unknown key "thread"'),
                           ('{"kernels": "nosuch"}', 'kernel table "nosuch" does not exist'),
                           ('{"kv_dtype": "f8"}', "kv_dtype"), ('{"verify_weights": 1}', "true or false"),
                           ('{"threads": {"a": 1}}', "must be a string, number or boolean"),
                           ('{"threads": 2', "not valid JSON"),
                           # json.loads refuses a bad \u escape; a NUL would cut a key or value
                           ('{"kernels": "\\u00g0"}', "not valid JSON"),
                           ('{"threads\\u0000x": 2}', "holds a NUL character"),
                           ('{"kv_dtype": "f32\\u0000x"}', "holds a NUL character")]:
        assert words in _refused(lib, r.directory, options), options
    # a directory name too long for the runtime's path buffer is refused, not cut short
    h, err = lib.open(str(r.directory) + "/" * 4000)
    assert not h and "at most 4000 are taken" in err
    h, err = lib.open(r.directory, '{"threads": 1, "kernels": "generic", "kv_dtype": "f32", '
                                   '"verify_weights": true, "huge_pages": false}')
    assert h, err
    lib.dll.ignis_close(h)
    assert lib.dll.ignis_abi_version() == 1
    bad = np.zeros(4, np.int32)
    h, err = lib.open(r.directory)
    try:
        p = np.array([1, 99999], np.int32)
        assert lib.dll.ignis_generate_ids(h, p.ctypes.data, 2, 4, bad.ctypes.data, 4) == -1
        assert "token id 99999 at index 1" in lib.dll.ignis_last_error().decode()
        assert lib.dll.ignis_generate_ids(h, p.ctypes.data, 0, 4, bad.ctypes.data, 4) == -1
        assert "empty" in lib.dll.ignis_last_error().decode()
        logits = np.zeros(3, np.float32)
        assert lib.dll.ignis_logits(h, p.ctypes.data, 1, logits.ctypes.data, 3) == -1
        assert "holds 3 floats" in lib.dll.ignis_last_error().decode()
    finally:
        lib.dll.ignis_close(h)


def test_options_reader_survives_mangled_json(compiled):
    """Bounded fuzz of the options reader: truncations, byte flips and insertions of a valid
    options object either open (a valid object) or fail with a message, never crash."""
    r, lib = compiled("q8")
    base = b'{"threads": 1, "kv_dtype": "f32", "verify_weights": false, "kernels": "generic"}'
    rng = np.random.default_rng(11)
    alphabet = b'{}[]",:\\ u0123456789abcdeftrunlsx\x00\xff\xc3\xa9'
    opened = 0
    for i in range(300):
        b = bytearray(base)
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(0, len(b) + 1))
            op = int(rng.integers(0, 3))
            if op == 0:
                b = b[:k]
            elif op == 1 and b:
                b[min(k, len(b) - 1)] = alphabet[int(rng.integers(0, len(alphabet)))]
            else:
                b[k:k] = bytes([alphabet[int(rng.integers(0, len(alphabet)))]])
        text = bytes(b).split(b"\0")[0]
        h = lib.dll.ignis_open(str(r.directory).encode(), text)
        if h:
            opened += 1
            lib.dll.ignis_close(h)
        else:
            assert lib.dll.ignis_last_error(), text
    assert opened < 300


def test_library_links_only_libc_libm_libpthread(compiled):
    readelf = require_tool("readelf", "apt-get install binutils", "the library's dependencies")
    r, _ = compiled("q8")
    out = subprocess.run([readelf, "-d", str(r.library)], capture_output=True, text=True, check=True).stdout
    needed = {line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}
    assert needed and needed <= {"libc.so.6", "libm.so.6", "libpthread.so.0"}, needed
    syms = subprocess.run([readelf, "--dyn-syms", "-W", str(r.library)], capture_output=True,
                          text=True, check=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines()
                if " GLOBAL " in line and " DEFAULT " in line and " UND " not in line}
    # the ABI, and one entry for tests outside it (ig_testonly_chat_forced: a chat whose answer's tokens
    # are given, test_native_api's way to hold the answer reader to the Python path's)
    assert exported == {"ignis_abi_version", "ignis_open", "ignis_last_error", "ignis_generate_ids",
                        "ignis_logits", "ignis_model_info", "ignis_free", "ignis_close", "ignis_completions",
                        "ignis_chat_completions", "ignis_embeddings", "ig_testonly_chat_forced"}, exported


def test_c_program_with_an_empty_environment(compiled, tiny_chat_dir, tmp_path):
    cc = _cc()
    r, _ = compiled("q8")
    exe = tmp_path / "native_smoke"
    lib = r.library.name[len("lib"):-len(".so")]
    subprocess.run([cc, "-O1", "-Wall", "-Werror", str(ROOT / "tests/c/native_smoke.c"), f"-I{r.directory}",
                    f"-L{r.directory}", f"-l{lib}", f"-Wl,-rpath,{r.directory}", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    model = ignis.load(str(tiny_chat_dir), weight_format="q8", progress=False)
    for prompt in PROMPTS[:2]:
        p = subprocess.run([str(exe), str(r.directory), str(MAX_NEW), *map(str, prompt)], env={},
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0] == "abi 1"
        assert [int(t) for t in lines[1].split()] == python_greedy(model, prompt)[0]
    p = subprocess.run([str(exe), str(tmp_path), "4", "1"], env={}, capture_output=True, text=True)
    assert p.returncode == 1 and "manifest.json" in p.stderr


def test_sha256_against_hashlib(tmp_path):
    cc = _cc()
    so = tmp_path / "sha.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(ROOT / "csrc/native/sha256.c")],
                   check=True)
    dll = ctypes.CDLL(str(so))
    rng = np.random.default_rng(3)
    for n in (0, 1, 3, 55, 56, 63, 64, 65, 119, 120, 1000, (1 << 20) + 3):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        digest = ctypes.create_string_buffer(32)
        dll.ig_sha256(digest, data, ctypes.c_size_t(n))
        assert digest.raw == hashlib.sha256(data).digest(), n


def test_sample_offsets_cover_the_ends():
    assert sample_offsets(0) == []
    assert sample_offsets(100) == [(0, 100)]
    big = 10**9 + 7
    offs = sample_offsets(big)
    assert len(offs) == 256 and offs[0] == (0, 4096) and offs[-1] == (big - 4096, 4096)
    assert all(b[0] > a[0] for a, b in zip(offs, offs[1:]))
    data = bytes(range(256)) * 40
    h = hashlib.sha256(len(data).to_bytes(8, "little"))
    for off, n in sample_offsets(len(data)):
        h.update(data[off:off + n])
    assert sample_digest(data, len(data)) == h.digest()


def test_blob_round_trip():
    blob = pack_blob({"MODL": b"abc", "CONF": b"{}", "TOKN": bytes(range(200))})
    assert blob[:8] == b"IGNBLOB\0"
    assert unpack_blob(blob) == {"MODL": b"abc", "CONF": b"{}", "TOKN": bytes(range(200))}
    with pytest.raises(ValueError):
        pack_blob({"TOOLONG": b""})
    with pytest.raises(ValueError):
        unpack_blob(b"nope" * 8)


def test_compile_refuses_bad_input(tiny_chat_dir, tmp_path, monkeypatch):
    with pytest.raises(ignis.ModelNotFoundError):
        compile_model("no-such-model", tmp_path / "a", progress=False)
    with pytest.raises(NativeCompileError, match="holds other files"):
        compile_model(str(tiny_chat_dir), tiny_chat_dir, progress=False)
    with pytest.raises(ignis.RuntimeInputError, match="exceeds the 512 positions"):
        compile_model(str(tiny_chat_dir), tmp_path / "b", ctx=100000, progress=False)
    with pytest.raises(ignis.RuntimeInputError, match="positive integer"):
        compile_model(str(tiny_chat_dir), tmp_path / "b", ctx=0, progress=False)
    with pytest.raises(NativeCompileError, match="weights must be"):
        compile_model(str(tiny_chat_dir), tmp_path / "c", weights="q3", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NativeCompileError, match="not a directory"):
        compile_model(str(tiny_chat_dir), tmp_path / "file", progress=False)
    monkeypatch.setenv("CC", "/no/such/cc")
    with pytest.raises(CompilerMissingError, match="not a program"):
        compile_model(str(tiny_chat_dir), tmp_path / "d", progress=False)
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CompilerMissingError, match="apt-get install gcc"):
        compile_model(str(tiny_chat_dir), tmp_path / "d", progress=False)


def test_cli_compile(tiny_chat_dir, tmp_path, capsys):
    _cc()
    from ignis.api.cli import main
    assert main(["compile", str(tiny_chat_dir), "-o", str(tmp_path / "out"), "--weights", "q4",
                 "--ctx", "256", "-q"]) == 0
    out = capsys.readouterr().out
    assert "libignis_tiny-chat.so" in out and "(q4)" in out and "context 256" in out
    assert json.loads((tmp_path / "out/manifest.json").read_text())["n_ctx"] == 256
    # compiling again into the same directory replaces the files
    assert main(["compile", str(tiny_chat_dir), "-o", str(tmp_path / "out"), "--weights", "q8", "-q"]) == 0
    assert json.loads((tmp_path / "out/manifest.json").read_text())["weight_format"] == "q8"
    assert main(["compile", str(tiny_chat_dir), "-o", str(tiny_chat_dir), "-q"]) == 1
    assert "holds other files" in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.slow
def test_default_model_greedy_ids(default_model_dir, tmp_path):
    """The default model compiled in its own GGUF blocks: greedy ids equal the engine's."""
    _cc()
    from ignis.loader import registry
    r = compile_model(str(default_model_dir), tmp_path / "out", weights="gguf", ctx=512, progress=False)
    lib = Lib(r.library)
    model = ignis.load(str(default_model_dir), weight_format="gguf", n_ctx=512, progress=False)
    assert registry.DEFAULT_MODEL
    h, err = lib.open(r.directory)
    assert h, err
    try:
        for text in ("def fibonacci(n):", "The capital of France is", "# sort a list in Python\n"):
            prompt = model.tokenize(text)
            assert lib.generate(h, prompt, 16) == python_greedy(model, prompt, 16)[0], text
    finally:
        lib.dll.ignis_close(h)
