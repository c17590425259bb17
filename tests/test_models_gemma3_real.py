"""The real Gemma 3 270M GGUF (tests/gemma_gguf.py) against transformers on the file's own weights
(transformers 5 loads the GGUF itself, dequantizing to f32): greedy continuations of ten raw
prompts (code, prose, several languages) through ignis's import in f32, identical; in the file's
own blocks (weight_format="gguf", activations rounded to 16 bits per block), identical unless the
two runs part at a near-tie of transformers' logits. Also ignis's tokenizer gives transformers' ids,
<bos> first as the metadata asks.

Needs the part packages (skipped without them) and accelerate (transformers' GGUF loading).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest


pytestmark = [pytest.mark.model, pytest.mark.slow]

torch = pytest.importorskip("torch", reason="torch not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")

N_NEW = 24
PROMPTS = [
    "def fibonacci(n):\n    ",
    "#include <stdio.h>\n\nint main(void) {\n",
    "The history of the Roman Empire begins",
    "Once upon a time, in a small village by the sea,",
    "La capitale de la France est",
    "Die wichtigsten Erfindungen des 19. Jahrhunderts waren",
    "El agua hierve a 100 grados",
    "北京是中国的首都，",
    "日本の四季について説明します。春は",
    "1. Preheat the oven to 180°C.\n2.",
]
# transformers' logit margin between the two tokens where a narrower format may part from it
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def gguf_file(gemma3_gguf):
    return gemma3_gguf


@pytest.fixture(scope="module")
def imported(gguf_file, tmp_path_factory):
    from ignis.loader.gguf_import import import_gguf
    from ignis.loader.resolve import open_dir
    directory = tmp_path_factory.mktemp("gemma3-import")
    out = import_gguf(gguf_file, directory / "m", progress=False)
    files = open_dir(out, name="gemma3-270m", progress=False)
    yield files
    files.weights.close()
    shutil.rmtree(directory, ignore_errors=True)        # ~1.3 GB of f32 weights


@pytest.fixture(scope="module")
def hf(gguf_file):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return model, tok


@pytest.fixture(scope="module")
def prompt_ids(imported, hf):
    from ignis.tokenizer import load_tokenizer
    tok = load_tokenizer(imported.path)
    ids = [tok.encode(p, add_special_tokens=True) for p in PROMPTS]
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf, prompt_ids):
    model, _ = hf
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            g = model.generate(torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(g[0, len(ids):].tolist())
    return out


def _ignis_greedy(engine, ids: list[int]) -> list[int]:
    engine.reset()
    logits = engine.forward(np.array(ids, np.int32))
    got = []
    for _ in range(N_NEW):
        got.append(int(logits[-1].argmax()))
        logits = engine.forward(np.array(got[-1:], np.int32))
    return got


def test_the_tokenizer_gives_transformers_ids_with_bos(hf, prompt_ids):
    _, tok = hf
    for p, ids in zip(PROMPTS, prompt_ids):
        assert ids[0] == 2                      # <bos>: tokenizer.ggml.add_bos_token
        assert ids == tok(p).input_ids, p


def test_f32_prompt_logits_match_transformers(imported, hf, prompt_ids):
    from ignis.runtime import Engine
    model, _ = hf
    eng = Engine(imported, n_ctx=128)
    worst = 0.0
    for ids in prompt_ids:
        eng.reset()
        got = eng.forward(np.array(ids, np.int32), logits_for="all")
        with torch.no_grad():
            want = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        worst = max(worst, float(np.abs(got - want).max()))
    print(f"\ngemma3-270m f32: max abs logit diff vs transformers over the prompts: {worst:.2e}")
    assert worst <= 1e-3


@pytest.mark.parametrize("fmt", ["f32", "gguf"])
def test_greedy_continuations_match_transformers(imported, hf, prompt_ids, hf_greedy, fmt):
    from ignis.runtime import Engine
    model, _ = hf
    eng = Engine(imported, n_ctx=128, weight_format=fmt)
    same, ties = 0, []
    for p, ids, want in zip(PROMPTS, prompt_ids, hf_greedy):
        got = _ignis_greedy(eng, ids)
        if got == want:
            same += 1
            continue
        k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + want[:k]])).logits[0, -1].numpy()
        margin = float(logits[want[k]] - logits[got[k]])
        ties.append((p, k, margin))
    print(f"\ngemma3-270m {fmt}: {same}/{len(PROMPTS)} greedy continuations identical to "
          f"transformers f32; parted at (prompt, step, transformers' margin): {ties}")
    if fmt == "f32":
        assert same == len(PROMPTS)
    else:
        assert all(m < NEAR_TIE for _, _, m in ties)


def test_past_the_sliding_window_f32_matches_transformers(imported, hf):
    """A prompt longer than the 512-position window of the sliding layers: logits at every position
    and a greedy continuation against transformers."""
    from ignis.runtime import Engine
    from ignis.tokenizer import load_tokenizer
    model, _ = hf
    text = " ".join(f"Item {i}: the {w} of {PROMPTS[i % 10][:12]!r} is {i * 7 % 13}."
                    for i, w in zip(range(200), ["colour", "weight", "shape", "price"] * 50))
    ids = load_tokenizer(imported.path).encode(text)[:700]
    assert len(ids) == 700 and imported.config.sliding_window == 512
    eng = Engine(imported, n_ctx=768)
    got = eng.forward(np.array(ids, np.int32), logits_for="all")
    tail = [int(got[-1].argmax())]
    for _ in range(N_NEW - 1):
        tail.append(int(eng.forward(np.array(tail[-1:], np.int32))[-1].argmax()))
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        hf_tail = model.generate(torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):]
    diff = float(np.abs(got - want).max())
    print(f"\ngemma3-270m f32, 700 positions: max abs logit diff vs transformers {diff:.2e}")
    assert diff <= 1e-3
    assert tail == hf_tail.tolist()
