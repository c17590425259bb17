"""What the transformers comparisons of the model families share (test_models_hf.py, Qwen3 and
Llama 3; test_models_gemma3.py): the prompt, transformers' own logits and greedy ids, and ignis's
graph on the NumPy interpreter or the Engine run the same way (prefill, then one token per step)."""
from __future__ import annotations

import numpy as np

from ignis.ir.interp import KVCache, run
from ignis.loader.config import ModelConfig
from ignis.models import FAMILIES, build_graph
from ignis.passes import run_pipeline

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]
N_CTX = 64


def spread_weights(model, *, norm: float, embed: float):
    """Draw a transformers model's weights at scales that keep activations O(1) and logits well
    apart (its own init, std 0.02, puts every logit near 0 and greedy on near-ties): norm weights
    `norm` + 0.1 N(0,1) (Gemma stores w for a scale of 1 + w: norm=0), the embedding embed N(0,1),
    linears N(0, 1/fan_in). Returns the model."""
    import math
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(embed * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return model


def reference(model, ids: list[int]) -> np.ndarray:
    """transformers' f32 logits at every position of ids."""
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def hf_greedy(model, n: int) -> list[int]:
    """transformers' n greedy ids after PROMPT (no early end)."""
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(PROMPT):].tolist()


class Interpreted:
    """ignis's compiled graph on the NumPy interpreter in f32 (the weights as the Engine reads
    them: the family's load_weight), prefill, then one token per step."""

    def __init__(self, config: ModelConfig, weights):
        self.g = run_pipeline(build_graph(config)).graph
        load = FAMILIES[config.arch].load_weight or (lambda name, w: w)
        self.w = {k: load(k, np.asarray(weights[k])) for k in self.g.weights
                  if k not in self.g.constants}
        self.cache = KVCache.for_graph(self.g, N_CTX, np.float32)
        self.p = 0

    def forward(self, ids: list[int]) -> np.ndarray:
        inputs = {"tokens": np.array(ids, np.int32),
                  "pos": np.arange(self.p, self.p + len(ids), dtype=np.int32),
                  "rows": np.arange(len(ids), dtype=np.int32)}
        self.p += len(ids)
        return run(self.g, self.w, inputs, cache=self.cache, dtype=np.float32)["logits"]


class Compiled:
    """The model on the Engine (the C executor), prefill then one token per step."""

    def __init__(self, files, **kw):
        from ignis.runtime import Engine
        self.eng = Engine(files, n_ctx=N_CTX, **kw)

    def forward(self, ids: list[int]) -> np.ndarray:
        return self.eng.forward(np.array(ids, np.int32), logits_for="all")


def all_positions(runner, ids: list[int], prefill: int) -> np.ndarray:
    """Logits at every position: ids[:prefill] in one step, then one token per step."""
    rows = [runner.forward(ids[:prefill])]
    rows += [runner.forward([t]) for t in ids[prefill:]]
    return np.concatenate(rows)


def greedy(runner, n: int) -> list[int]:
    """n greedy ids after PROMPT."""
    logits = runner.forward(PROMPT)
    got = []
    for _ in range(n):
        got.append(int(logits[-1].argmax()))
        logits = runner.forward([got[-1]])
    return got
