"""ignis_embeddings in a compiled library (issue 18): the embedding step `ignis compile` writes beside
the generation step, called through ctypes and through ignis.Client(native=DIR), against the
in-process Client (Model.embed on an Engine with output="hidden") on the same tiny model: the same
vectors (1e-6), base64 decoding to the same floats, the same usage, and bad requests answered
with the same messages."""
from __future__ import annotations

import base64
import ctypes
import json

import numpy as np
import pytest

import ignis
from ignis.api.client import BadRequestError, NotFoundError

INPUTS = ["Hello world", ["The cat sat on the mat, again and again.", "x", "Hello world"],
          [256, 72, 101, 108, 108, 111], [[72, 101], [256, 33, 44, 32, 119], [5]]]


@pytest.fixture(scope="module")
def raw(tiny_chat_compiled):
    """(call, close): ignis_embeddings on a handle of its own, through ctypes only."""
    d = tiny_chat_compiled.directory
    lib = ctypes.CDLL(str(tiny_chat_compiled.library))
    lib.ignis_open.restype = ctypes.c_void_p
    lib.ignis_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.ignis_embeddings.restype = ctypes.c_void_p
    lib.ignis_embeddings.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ignis_free.argtypes = [ctypes.c_void_p]
    lib.ignis_close.argtypes = [ctypes.c_void_p]
    h = lib.ignis_open(str(d).encode(), b'{"threads": 1}')
    assert h

    def call(body) -> dict:
        text = body if isinstance(body, bytes) else json.dumps(body).encode()
        p = lib.ignis_embeddings(h, text)
        assert p
        try:
            return json.loads(ctypes.string_at(p).decode())
        finally:
            lib.ignis_free(p)
    yield call
    lib.ignis_close(h)


def _vectors(resp) -> np.ndarray:
    return np.array([d.embedding for d in resp.data], np.float64)


@pytest.mark.parametrize("inp", range(len(INPUTS)))
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_vectors_equal_the_in_process_client(tiny_chat_native, tiny_chat_local, inp, pooling):
    kw = {"model": "tiny-chat", "input": INPUTS[inp], "extra_body": {"pooling": pooling}}
    got, want = tiny_chat_native.embeddings.create(**kw), tiny_chat_local.embeddings.create(**kw)
    assert got.model == want.model == "tiny-chat" and got.object == "list"
    assert [d.index for d in got.data] == [d.index for d in want.data]
    assert all(d.object == "embedding" for d in got.data)
    assert got.usage == want.usage and got.usage.prompt_tokens > 0
    g, w = _vectors(got), _vectors(want)
    assert g.shape == w.shape and g.shape[1] == tiny_chat_local._model("tiny-chat").config.dim
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(g, axis=1), 1.0, atol=1e-5)


def test_base64_decodes_to_the_float_vectors(tiny_chat_native, tiny_chat_local):
    kw = {"model": "tiny-chat", "input": INPUTS[1]}
    floats = _vectors(tiny_chat_native.embeddings.create(**kw)).astype(np.float32)
    b64 = tiny_chat_native.embeddings.create(**kw, encoding_format="base64")
    want = tiny_chat_local.embeddings.create(**kw, encoding_format="base64")
    got = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in b64.data])
    assert np.array_equal(got, floats)          # the same float32 values, bit for bit
    ref = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in want.data])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_ctypes_response_has_the_server_shape(raw, tiny_chat_local):
    body = {"model": "tiny-chat", "input": ["Hello world", "x"], "user": "u1"}
    d = raw(body)
    assert list(d) == ["data", "model", "object", "usage"]
    assert d["object"] == "list" and d["model"] == "tiny-chat"
    assert [list(e) for e in d["data"]] == [["embedding", "index", "object"]] * 2
    want = tiny_chat_local.embeddings.create(**body).model_dump()
    assert d["usage"] == want["usage"]
    np.testing.assert_allclose(np.array([e["embedding"] for e in d["data"]]),
                               np.array([e["embedding"] for e in want["data"]]), rtol=0, atol=1e-6)
    # float32 values written as Python writes float(np.float32): they round-trip exactly
    v = np.array(d["data"][0]["embedding"])
    assert np.array_equal(v.astype(np.float32).astype(np.float64), v)


BAD = [
    {"input": ""},
    {"input": []},
    {"input": [[]]},
    {"input": 5},
    {"input": ["a", 1]},
    {"input": [[1, 2], [3, "x"]]},
    {"input": [1, -2]},
    {"input": [1, 10 ** 6]},
    {"input": [[1, 2], [99999999999999999999]]},
    {"input": list(range(1, 300))},               # over the 256-token context
    {"input": [[1] * 200] * 11},                  # over 8 contexts of tokens in all
    {"input": ["a"] * 2049},
    {"input": "hi", "encoding_format": "hex"},
    {"input": "hi", "encoding_format": 3},
    {"input": "hi", "dimensions": 0},
    {"input": "hi", "dimensions": 1.5},
    {"input": "hi", "dimensions": 7},
    {"input": "hi", "user": 3},
    {"input": "hi", "extra_body": {"pooling": "max"}},
    {"input": "hi", "extra_body": {"pooling": 1}},
    {"input": "hi", "extra_body": {"pool": "mean"}},
    {"input": "hi", "model": ""},
    {"input": "a\ud800b"},
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_requests_get_the_in_process_messages(tiny_chat_native, tiny_chat_local, case):
    kw = {"model": "tiny-chat", **BAD[case]}
    errors = []
    for client in (tiny_chat_native, tiny_chat_local):
        with pytest.raises(BadRequestError) as e:
            client.embeddings.create(**kw)
        errors.append((str(e.value), e.value.param, e.value.code))
    assert errors[0] == errors[1]


def test_dimensions_equal_to_the_hidden_size_is_accepted(tiny_chat_native, tiny_chat_local):
    dim = tiny_chat_local._model("tiny-chat").config.dim
    r = tiny_chat_native.embeddings.create(model="tiny-chat", input="hi", dimensions=dim)
    assert len(r.data[0].embedding) == dim


def test_server_level_errors(raw, tiny_chat_native):
    assert raw({"model": "tiny-chat"})["error"]["code"] == "missing_required_parameter"
    e = raw({"model": "tiny-chat", "input": "hi", "stream": True})["error"]
    assert e["message"] == "Unrecognized request argument supplied: stream" and e["param"] == "stream"
    e = raw({"model": "other", "input": "hi"})["error"]
    assert e["code"] == "model_not_found" and "'other'" in e["message"]
    assert raw(b"{not json")["error"]["type"] == "invalid_request_error"
    with pytest.raises(NotFoundError):
        tiny_chat_native.embeddings.create(model="other", input="hi")
    # a long text is refused before tokenizing, as ignis serve refuses it
    e = raw({"model": "tiny-chat", "input": ["ok", "y" * 10 ** 6]})["error"]
    assert e["code"] == "context_length_exceeded" and "input[1] holds 1000000 bytes" in e["message"]


def test_embedding_and_generation_share_the_handle(tiny_chat_native, tiny_chat_local):
    """Generation after embeddings (and the reverse) on one handle: the embedding step has its own
    KV cache, so neither disturbs the other."""
    kw = {"model": "tiny-chat", "prompt": "The cat", "max_tokens": 8, "temperature": 0}
    before = tiny_chat_native.completions.create(**kw).choices[0].text
    tiny_chat_native.embeddings.create(model="tiny-chat", input=INPUTS[1])
    assert tiny_chat_native.completions.create(**kw).choices[0].text == before == \
        tiny_chat_local.completions.create(**kw).choices[0].text


def _weight_offsets(section: bytes) -> list[tuple[int, int]]:
    """(f32 offset, packed offset) of every weight in a MODL-format section (ignis/native/modl.py)."""
    import struct
    n_instrs, n_weights, n_inputs, _ = struct.unpack_from("<iiii", section, 8)
    at = 8 + 16 + 16
    max_t, max_r, ctx, n_kv, kv, vocab, width, n_eos, f32 = struct.unpack_from("<9i", section, at)
    at += 36

    def array(at: int, n: int) -> int:
        return -(-at // 8) * 8 + 4 * n
    at = array(at, n_inputs)
    at = array(at, n_kv)
    at = array(at, n_eos)
    at = -(-at // 8) * 8
    n_valid = struct.unpack_from("<i", section, at)[0]
    at += 4 + (n_valid + 7) // 8
    at = -(-at // 8) * 8 + 24 + 64
    out = []
    for i in range(n_weights):
        _, _, _, _, f_off, _, p_off, _ = struct.unpack_from("<qqiiqqqq", section, at + 56 * i)
        out.append((f_off, p_off))
    return out


def _sections(library) -> dict[str, bytes]:
    import re
    from ignis.native.blob import unpack_blob
    so = library.read_bytes()
    found = [m.start() for m in re.finditer(rb"IGNBLOB\0\x01\0\0\0", so)]
    assert len(found) == 1
    return unpack_blob(so[found[0]:])


def test_the_embedding_step_reads_the_generation_steps_weights(tiny_chat_compiled):
    """EMBD points into weights.bin at places MODL's weights already occupy: no second copy."""
    s = _sections(tiny_chat_compiled.library)
    gen, emb = _weight_offsets(s["MODL"]), _weight_offsets(s["EMBD"])
    assert 0 < len(emb) <= len(gen)             # (a tied embedding: the same weights)
    assert set(emb) <= set(gen)
    size = tiny_chat_compiled.weights_bytes
    assert all(-1 <= f < size and -1 <= p < size for f, p in gen)


def test_quantized_weights_embed_as_the_in_process_engine(tiny_chat_dir, tmp_path):
    """q8 weights (packed matrices, copied once to 2 MB pages and read by both steps)."""
    from ignis.native import compile_model
    res = compile_model(str(tiny_chat_dir), tmp_path / "q8", weights="q8", ctx=64, progress=False)
    m = ignis.load(str(tiny_chat_dir), weight_format="q8", n_ctx=64, progress=False)
    try:
        kw = {"model": "tiny-chat", "input": INPUTS[1]}
        with ignis.Client(native=str(res.directory)) as c:
            got = _vectors(c.embeddings.create(**kw))
        want = _vectors(ignis.Client([m]).embeddings.create(**kw))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    finally:
        m.weights.close()


def test_c_example_embeds_and_compares(tiny_chat_compiled, tiny_chat_local, tmp_path):
    """examples/c/embed.c, built with -Wall -Wextra -Werror against the compiled directory and run
    with an empty environment: its vectors and pairwise cosine similarities are the in-process
    Client's."""
    import subprocess
    from pathlib import Path

    from tools_required import require_tool
    cc = require_tool("cc", "apt-get install gcc", "the C example")
    r = tiny_chat_compiled
    exe = tmp_path / "embed"
    lib = r.library.name[len("lib"):-len(".so")]
    src = Path(__file__).resolve().parent.parent / "examples/c/embed.c"
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", str(src), f"-I{r.directory}",
                    f"-L{r.directory}", f"-l{lib}", f"-Wl,-rpath,{r.directory}", "-lm", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    texts = ["sort a list", "order the items of an array", "the weather in Paris", "ünïcödé ✓"]
    p = subprocess.run([str(exe), str(r.directory), *texts], env={}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    want = np.array([d.embedding for d in tiny_chat_local.embeddings.create(model="tiny-chat", input=texts).data])
    lines = p.stdout.splitlines()
    for i, v in enumerate(want):
        dim, first = lines[i].split(": dim ")[1].split(", first values ")
        assert int(dim) == v.size
        np.testing.assert_allclose([float(x) for x in first.split()], v[:3], atol=2e-6)
    sims = {tuple(map(int, x.split(":")[0].split()[1:])): float(x.split(": ")[1])
            for x in lines if x.startswith("similarity")}
    assert len(sims) == len(texts) * (len(texts) - 1) // 2
    for (i, j), got in sims.items():
        cos = want[i] @ want[j] / np.linalg.norm(want[i]) / np.linalg.norm(want[j])
        assert got == pytest.approx(cos, abs=1e-5)
    # a bad request is printed as the error object and fails the program
    p = subprocess.run([str(exe), str(r.directory), ""], env={}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and '"error"' in p.stderr
