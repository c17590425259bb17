"""Embeddings end to end: the hidden-output graph and Engine against the float64 interpreter and the
independent NumPy Qwen2 of test_models.py, Model.embed against transformers' last_hidden_state, and
client.embeddings.create (float / base64, the official client's parsing, every invalid input)."""
from __future__ import annotations

import base64
import dataclasses
import json

import numpy as np
import pytest

import ignis
from ignis.api.client import BadRequestError
from ignis.errors import ConfigError
from ignis.generate import InvalidParameterError
from ignis.ir import interp
from ignis.loader.resolve import open_model
from ignis.models import build_graph
from ignis.passes.pipeline import run_pipeline
from ignis.runtime import Engine, RuntimeInputError
from test_models import ReferenceQwen2
from tiny_models import complete_tiny_model, write_tiny_model

PROMPT = np.array([256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 257], np.int32)
TEXTS = ["Hello world", "The cat sat on the mat, again and again.", "x"]
CTX = 32


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tiny_qwen2_dir, tiny_llama_dir, tmp_path_factory):
    """A complete tiny model (weights + tiny tokenizer), loaded: (directory, ignis Model)."""
    src = tiny_qwen2_dir if request.param == "qwen2" else tiny_llama_dir
    d = complete_tiny_model(src, tmp_path_factory.mktemp("embed") / f"tiny-{request.param}")
    m = ignis.load(str(d), n_ctx=CTX, threads=1, weight_format="f32")    # against numpy in f32
    yield d, m
    m.weights.close()


@pytest.fixture(scope="module")
def qwen(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=CTX, threads=1)
    yield m
    m.weights.close()


class _WithoutLmHead:
    """The model's weights minus lm_head.weight: the embedding engine must not need it."""

    def __init__(self, files):
        self.config = files.config
        self.weights = {k: files.weights[k] for k in files.weights.keys() if k != "lm_head.weight"}


def _reference_hidden(config, weights, ids) -> np.ndarray:
    """test_models.ReferenceQwen2 (transcribed from transformers' formulas) made to return the
    final-norm hidden state: an untied identity lm_head turns its logits into that state."""
    c = dataclasses.replace(config, tie_word_embeddings=False)
    w = {k: np.asarray(weights[k]) for k in weights.keys() if k != "lm_head.weight"}
    w["lm_head.weight"] = np.eye(c.dim)
    return ReferenceQwen2(c, w).step(list(ids))


# --- graph and engine ---------------------------------------------------------------------------

def test_hidden_graph_ends_at_the_final_norm_and_passes_keep_every_row(tiny):
    cfg = open_model(tiny[0]).config
    g = build_graph(cfg, "hidden")
    assert list(g.outputs) == ["hidden"]
    assert g.outputs["hidden"].type.shape == ("T", cfg.dim)
    assert "lm_head.weight" not in g.weights
    assert g.outputs["hidden"].node.name == "output_norm"
    opt = run_pipeline(g).graph
    assert "rows" not in opt.inputs and all(n.op != "take_rows" for n in opt.nodes)
    assert list(build_graph(cfg).outputs) == ["logits"]        # the default is unchanged
    with pytest.raises(ConfigError, match="output must be one of"):
        build_graph(cfg, "probs")


def test_engine_hidden_states_match_the_interpreter_and_the_numpy_reference(tiny):
    files = open_model(tiny[0])
    try:
        g = build_graph(files.config, "hidden")
        want = interp.run(g, files.weights, {"tokens": PROMPT, "pos": np.arange(PROMPT.size, dtype=np.int32)},
                          cache=interp.KVCache.for_graph(g, CTX), dtype=np.float64)["hidden"]
        ref = _reference_hidden(files.config, files.weights, PROMPT)
        np.testing.assert_allclose(want, ref, rtol=0, atol=1e-10)
        # chunks of 4: the 15 tokens run as 4+4+4+3; no lm_head weight given at all
        eng = Engine(_WithoutLmHead(files), n_ctx=CTX, threads=1, max_batch_tokens=4, output="hidden")
        got = eng.hidden_states(PROMPT)
        assert got.shape == (PROMPT.size, files.config.dim) and got.dtype == np.float32
        err = float(np.abs(got - ref).max())
        assert err <= 1e-4, f"max abs err {err:.3e}"
        assert eng.n_past == PROMPT.size
        eng.reset()
        np.testing.assert_array_equal(eng.forward(PROMPT)[0], got[-1])     # "last" is the last row
    finally:
        files.weights.close()


def test_engine_output_option_errors(tiny_qwen2_dir):
    files = open_model(tiny_qwen2_dir)
    try:
        with pytest.raises(RuntimeInputError, match="output must be one of"):
            Engine(files, n_ctx=CTX, threads=1, output="embeddings")
        with pytest.raises(RuntimeInputError, match="output='hidden'"):
            Engine(files, n_ctx=CTX, threads=1).hidden_states(PROMPT)
    finally:
        files.weights.close()


# --- Model.embed ---------------------------------------------------------------------------------

def test_embed_pools_and_normalises_the_hidden_states_of_each_input_alone(tiny):
    _, m = tiny
    files = open_model(tiny[0])
    try:
        for pooling in ("mean", "last"):
            got = m.embed(TEXTS, pooling=pooling)
            assert got.shape == (len(TEXTS), m.config.dim) and got.dtype == np.float32
            for text, vec in zip(TEXTS, got):
                h = _reference_hidden(files.config, files.weights, m.tokenize(text))
                v = h.mean(axis=0) if pooling == "mean" else h[-1]
                np.testing.assert_allclose(vec, v / np.linalg.norm(v), rtol=0, atol=1e-5)
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=0, atol=1e-6)
    finally:
        files.weights.close()
    # each input from an empty cache: its vector does not depend on what ran before it
    np.testing.assert_array_equal(m.embed(TEXTS[1]), m.embed(TEXTS)[1:2])
    assert not np.allclose(m.embed(TEXTS[1]), m.embed(TEXTS[1], pooling="last"))
    np.testing.assert_array_equal(m.embed([m.tokenize(t) for t in TEXTS]), m.embed(TEXTS))
    with pytest.raises(InvalidParameterError, match="pooling must be one of"):
        m.embed("hi", pooling="cls")


@pytest.mark.parametrize("fmt", ["f32", "q8"])
def test_the_embedding_engine_reads_the_generation_engines_weights(tiny, fmt, tmp_path, monkeypatch):
    # one copy of the weights and no second conversion: the embedder's arrays are the generation
    # engine's own, and its vectors equal those of an Engine that loaded the weights itself
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path))
    m = ignis.load(str(tiny[0]), n_ctx=CTX, threads=1, weight_format=fmt)
    try:
        convert = tmp_path / "convert"
        before = sorted(p.name for p in convert.rglob("*") if p.is_file()) if convert.exists() else []
        got = m.embed(TEXTS)
        after = sorted(p.name for p in convert.rglob("*") if p.is_file()) if convert.exists() else []
        assert after == before
        gen, emb = m.engine, m._embedder
        # _packed: per weight None or (packing id, layout, array)
        held = {id(a) for a in gen._weights} | {id(p[2]) for p in gen._packed if p is not None}
        assert all(id(a) in held for a in emb._weights)
        assert all(id(p[2]) in held for p in emb._packed if p is not None)
        assert (fmt == "f32") == all(p is None for p in emb._packed)
        assert "lm_head.weight" not in emb._weight_names
        own = Engine(m.files, n_ctx=CTX, threads=1, weight_format=fmt, kv_dtype=m.kv_dtype,
                     output="hidden")
        for text, vec in zip(TEXTS, got):
            own.reset()
            h = own.hidden_states(np.array(m.tokenize(text), np.int32)).astype(np.float64).mean(axis=0)
            np.testing.assert_array_equal(vec, (h / np.linalg.norm(h)).astype(np.float32))
    finally:
        m.weights.close()


def test_sharing_weights_with_other_weights_or_another_format_is_refused(tiny, tmp_path):
    files = open_model(tiny[0])
    # a second checkpoint of the very same config (as a base and an instruct model are): other
    # weights, which no config check can tell apart
    other = open_model(write_tiny_model(tmp_path / "twin", arch=files.config.arch, seed=1))
    try:
        assert other.config == files.config
        src = Engine(files, n_ctx=CTX, threads=1)
        with pytest.raises(RuntimeInputError, match="as 'f32'; this one needs them as 'q8'"):
            Engine(files, n_ctx=CTX, threads=1, weight_format="q8", output="hidden", share_weights=src)
        with pytest.raises(RuntimeInputError, match="must be an Engine"):
            Engine(files, n_ctx=CTX, threads=1, share_weights=files)
        with pytest.raises(RuntimeInputError, match="built from other weights"):
            Engine(other, n_ctx=CTX, threads=1, share_weights=src)
        assert src.reads(files) and not src.reads(other)
    finally:
        files.weights.close()
        other.weights.close()


@pytest.mark.slow
def test_embed_equals_transformers_last_hidden_state(tiny):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d, m = tiny
    hf = transformers.AutoModel.from_pretrained(str(d), dtype=torch.float32)
    hf.eval()
    for pooling in ("mean", "last"):
        got = m.embed(TEXTS, pooling=pooling)
        for text, vec in zip(TEXTS, got):
            with torch.no_grad():
                h = hf(torch.tensor([m.tokenize(text)])).last_hidden_state[0].double().numpy()
            v = h.mean(axis=0) if pooling == "mean" else h[-1]
            err = float(np.abs(vec - v / np.linalg.norm(v)).max())
            assert err <= 1e-4, f"{pooling} {text!r}: max abs err {err:.3e}"


# --- client.embeddings ---------------------------------------------------------------------------

def test_client_float_and_base64_give_the_model_vectors(qwen):
    client = ignis.Client([qwen])
    want = qwen.embed(TEXTS)
    r = client.embeddings.create(model=qwen.name, input=TEXTS)
    assert r.object == "list" and r.model == qwen.name and len(r.data) == len(TEXTS)
    n_tokens = sum(len(qwen.tokenize(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens
    for i, e in enumerate(r.data):
        assert e.object == "embedding" and e.index == i and isinstance(e.embedding, list)
        np.testing.assert_array_equal(np.array(e.embedding, np.float32), want[i])
    b = client.embeddings.create(model=qwen.name, input=TEXTS, encoding_format="base64")
    for i, e in enumerate(b.data):
        raw = base64.b64decode(e.embedding)
        np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), want[i])
    one = client.embeddings.create(model=qwen.name, input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1
    ids = client.embeddings.create(model=qwen.name, input=qwen.tokenize(TEXTS[0]))
    assert ids.data[0].embedding == one.data[0].embedding
    batch = client.embeddings.create(model=qwen.name, input=[qwen.tokenize(t) for t in TEXTS])
    assert [e.embedding for e in batch.data] == [e.embedding for e in r.data]
    assert json.loads(r.model_dump_json()) == r.model_dump()
    last = client.embeddings.create(model=qwen.name, input=TEXTS, extra_body={"pooling": "last"})
    np.testing.assert_array_equal(np.array([e.embedding for e in last.data], np.float32),
                                  qwen.embed(TEXTS, pooling="last"))


def test_official_client_parses_our_embeddings(qwen):
    openai = pytest.importorskip("openai")
    httpx = getattr(openai._base_client, "httpx", None) or getattr(openai._base_client, "httpx2")
    local = ignis.Client([qwen])
    seen = []

    def handler(request):
        body = json.loads(request.content)
        seen.append(body.get("encoding_format"))
        extra = {k: body.pop(k) for k in ("pooling",) if k in body}
        try:
            res = local.embeddings.create(**body, extra_body=extra or None)
        except BadRequestError as e:
            return httpx.Response(e.status_code, json={"error": e.body})
        return httpx.Response(200, json=res.model_dump())

    official = openai.OpenAI(api_key="unused", base_url="http://ignis.invalid/v1", max_retries=0,
                             http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    want = qwen.embed(TEXTS)
    for fmt in (None, "float"):      # None: the official client asks for base64 and decodes it
        kw = {} if fmt is None else {"encoding_format": fmt}
        r = official.embeddings.create(model=qwen.name, input=TEXTS, **kw)
        assert isinstance(r, openai.types.CreateEmbeddingResponse)
        assert [e.index for e in r.data] == [0, 1, 2]
        got = np.array([e.embedding for e in r.data], np.float32)
        np.testing.assert_array_equal(got, want)
        assert r.usage.total_tokens == sum(len(qwen.tokenize(t)) for t in TEXTS)
    assert seen == ["base64", "float"]
    r = official.embeddings.create(model=qwen.name, input=TEXTS, extra_body={"pooling": "last"})
    np.testing.assert_array_equal(np.array([e.embedding for e in r.data], np.float32),
                                  qwen.embed(TEXTS, pooling="last"))
    with pytest.raises(openai.BadRequestError) as e:
        official.embeddings.create(model=qwen.name, input="")
    assert e.value.status_code == 400 and e.value.body["param"] == "input"


BAD = {
    "empty list": (dict(input=[]), "input"),
    "empty string": (dict(input=""), "input"),
    "empty string in a list": (dict(input=["ok", ""]), "input"),
    "empty id list in a list": (dict(input=[[1, 2], []]), "input"),
    "non-int token id": (dict(input=[[1, 2.5]]), "input"),
    "bool token id": (dict(input=[[1, True]]), "input"),
    "mixed strings and ids": (dict(input=["ok", 5]), "input"),
    "negative id": (dict(input=[3, -1]), "input"),
    "id past the vocabulary": (dict(input=[3, 272]), "input"),
    "longer than the context": (dict(input=[[5] * (CTX + 1)]), "input"),
    "long text": (dict(input="word " * CTX), "input"),
    "not a string or list": (dict(input={"text": "hi"}), "input"),
    "unknown encoding_format": (dict(input="hi", encoding_format="hex"), "encoding_format"),
    "dimensions": (dict(input="hi", dimensions=16), "dimensions"),
    "unknown extra_body field": (dict(input="hi", extra_body={"normalize": False}), "normalize"),
    "unknown pooling": (dict(input="hi", extra_body={"pooling": "cls"}), "pooling"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_invalid_requests_are_400s_before_the_engine_runs(tiny_qwen2_dir, tmp_path, case):
    d = complete_tiny_model(tiny_qwen2_dir, tmp_path / "tiny-embed")
    m = ignis.load(str(d), n_ctx=CTX, threads=1)
    try:
        kw, param = BAD[case]
        with pytest.raises(BadRequestError) as e:
            ignis.Client([m]).embeddings.create(model=m.name, **kw)
        assert e.value.status_code == 400 and e.value.param == param
        assert e.value.body["message"] and e.value.body["type"] == "invalid_request_error"
        assert m._embedder is None             # the embedding engine was never even created
    finally:
        m.weights.close()


# --- the real default model ------------------------------------------------------------------------

@pytest.mark.model
@pytest.mark.slow
def test_default_model_paraphrases_are_closer_than_unrelated_text(default_model_dir):
    m = ignis.load(str(default_model_dir), weight_format="q8", n_ctx=64, threads=1)
    try:
        a, b, c = m.embed(["The cat sleeps on the sofa.", "A cat is napping on the couch.",
                           "Quarterly tax filings are due in April."])
    finally:
        m.weights.close()
    assert float(a @ b) > float(a @ c) and float(a @ b) > float(b @ c)
