"""The real default model in f32 against Hugging Face transformers (reference made by
tests/reference/make_logits_reference.py, committed in tests/data/reference/): top-1 at every prompt
position, logits of the last position, and 64-token greedy continuations."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ignis.runtime import Engine

pytestmark = [pytest.mark.model, pytest.mark.slow]

REFERENCE = Path(__file__).parent / "data" / "reference" / "qwen2.5-coder-0.5b-instruct.logits.json"
# transformers and ignis sum in different orders; observed ~3e-5 (the file rounds to 1e-5), so
# a difference above this bound means a changed operation, not rounding
MAX_ABS_LOGIT_DIFF = 1e-3
# weight_format="gguf": the file's exact weights, activations rounded to 16 bits per block of 32
# (2^-16 of the block's largest value); observed 2.0e-3
MAX_ABS_LOGIT_DIFF_GGUF = 5e-3


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(REFERENCE.read_text("utf-8"))


@pytest.fixture(scope="module")
def engine(default_model_files):
    return Engine(default_model_files, n_ctx=512)


@pytest.fixture
def gguf_engine(default_model_files):
    """The shipped GGUF's own blocks (weight_format="gguf"). Per test: the second is read back from
    the conversion cache in a moment, and its ~0.5 GB is not held through the tests after it."""
    return Engine(default_model_files, n_ctx=512, weight_format="gguf")


def test_reference_file_is_what_the_script_writes(reference):
    assert reference["model"] == "qwen2.5-coder-0.5b-instruct"
    assert len(reference["prompts"]) >= 8
    names = {p["name"] for p in reference["prompts"]}
    assert {"python", "prose", "chinese", "chat"} <= names
    assert any(len(p["ids"]) > 128 for p in reference["prompts"])   # crosses a prefill chunk


def test_prompt_logits_match_transformers(engine, reference):
    check_prompt_logits(engine, reference, MAX_ABS_LOGIT_DIFF)


def test_prompt_logits_match_transformers_on_the_files_own_blocks(gguf_engine, reference):
    check_prompt_logits(gguf_engine, reference, MAX_ABS_LOGIT_DIFF_GGUF)


def check_prompt_logits(engine, reference, max_diff):
    worst = 0.0
    lines = []
    for p in reference["prompts"]:
        engine.reset()
        ids = np.array(p["ids"], np.int32)
        logits = engine.forward(ids, logits_for="all")
        top1 = logits.argmax(axis=1)
        diff_top1 = np.abs(logits[np.arange(ids.size), p["top1"]] - np.array(p["top1_logit"]))
        diff_last = np.abs(logits[-1, p["last_topk_ids"]] - np.array(p["last_topk_logits"]))
        d = float(max(diff_top1.max(), diff_last.max()))
        worst = max(worst, d)
        wrong = np.flatnonzero(top1 != np.array(p["top1"]))
        lines.append(f"{p['name']:>12}: {ids.size:4d} positions, top-1 mismatches {wrong.size}, "
                     f"max abs logit diff {d:.2e}")
        assert wrong.size == 0, (f"{p['name']}: top-1 differs at positions {wrong[:10].tolist()}: ignis "
                                 f"{top1[wrong[:10]].tolist()} vs transformers "
                                 f"{np.array(p['top1'])[wrong[:10]].tolist()}")
        # the last position's top-k come out in the same order
        assert np.argsort(-logits[-1])[:5].tolist() == p["last_topk_ids"][:5]
    print("\n" + "\n".join(lines) + f"\nworst max abs logit diff vs transformers: {worst:.3e}")
    assert worst <= max_diff


def test_greedy_continuations_match_transformers(engine, reference):
    check_greedy(engine, reference)


def test_greedy_continuations_match_transformers_on_the_files_own_blocks(gguf_engine, reference):
    check_greedy(gguf_engine, reference)


def check_greedy(engine, reference):
    for p in reference["prompts"]:
        engine.reset()
        logits = engine.forward(np.array(p["ids"], np.int32))
        got = []
        for _ in range(len(p["greedy"])):
            nxt = int(logits[0].argmax())
            got.append(nxt)
            logits = engine.forward(np.array([nxt], np.int32))
        first = next((i for i, (a, b) in enumerate(zip(got, p["greedy"])) if a != b), None)
        margin = p["greedy_margin"][first - 1] if first else "n/a"
        assert first is None, (f"{p['name']}: greedy continuation differs from step {first} "
                               f"(transformers' top-1 margin there: {margin})")


def _nll(logits: np.ndarray, ids: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of ids[1:] under the logits of the positions before them."""
    x = logits[:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum()), len(ids) - 1


# weight format: (least top-1 agreement with f32, largest perplexity change)
NARROW = {"bf16": (0.95, 0.02), "q8": (0.95, 0.02), "q4": (0.90, 0.03)}


@pytest.fixture(scope="module")
def f32_nll(engine, reference) -> tuple[float, int]:
    """The f32 engine's summed negative log-likelihood of the prompts, and their token count:
    computed once for the three narrow formats measured against it."""
    total, n_tok = 0.0, 0
    for p in reference["prompts"]:
        engine.reset()
        s, n = _nll(engine.forward(np.array(p["ids"], np.int32), logits_for="all"), p["ids"])
        total += s
        n_tok += n
    return total, n_tok


@pytest.mark.parametrize("fmt", list(NARROW))
def test_narrow_weights_agree_with_f32(f32_nll, default_model_files, reference, fmt):
    """bf16 weights, int8 and 4-bit blocks: top-1 agreement with transformers' f32 at every
    prompt position, and the perplexity of the prompts close to f32's (bounds in NARROW)."""
    narrow = Engine(default_model_files, n_ctx=512, weight_format=fmt)
    agree = total = 0
    nll = {"f32": f32_nll[0], "narrow": 0.0}
    n_tok = 0
    for p in reference["prompts"]:
        ids = np.array(p["ids"], np.int32)
        narrow.reset()
        lq = narrow.forward(ids, logits_for="all")
        agree += int((lq.argmax(axis=1) == np.array(p["top1"])).sum())
        total += ids.size
        s, n = _nll(lq, p["ids"])
        nll["narrow"] += s
        n_tok += n
    assert n_tok == f32_nll[1]
    ppl = {k: float(np.exp(v / n_tok)) for k, v in nll.items()}
    rate = agree / total
    print(f"\n{fmt} top-1 agreement with transformers f32: {agree}/{total} = {rate:.4f}; perplexity "
          f"over {n_tok} prompt tokens: f32 {ppl['f32']:.4f}, {fmt} {ppl['narrow']:.4f} "
          f"({100 * (ppl['narrow'] / ppl['f32'] - 1):+.2f}%)")
    min_rate, max_ppl = NARROW[fmt]
    assert rate >= min_rate
    assert abs(ppl["narrow"] / ppl["f32"] - 1) <= max_ppl
