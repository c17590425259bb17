#!/usr/bin/env python
"""Make the committed reference logits of the default model with Hugging Face transformers.

Runs transformers (torch CPU, float32, eager attention) on the directory ignis imported from the
pinned GGUF, for a fixed set of varied prompts, and stores per prompt: the token ids, the top-1 id
and its logit at every prompt position, the top-k ids and logits of the last position, and a greedy
continuation of 64 tokens (with the top-1/top-2 margin of each step). tests/test_runtime_model.py
runs ignis on the same ids and compares.

    pip install torch==2.13.0 transformers      # never an unpinned torch: it pulls CUDA wheels
    python tests/reference/make_logits_reference.py [--out PATH]

The tokenizer is tokenizers.Tokenizer.from_file(model_dir/"tokenizer.json"), so ids do not depend on
ignis's own tokenizer.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = "qwen2.5-coder-0.5b-instruct"
OUT = ROOT / "tests" / "data" / "reference" / f"{MODEL}.logits.json"
TOP_K = 32
GREEDY = 64

_LONG_CODE = "".join(
    f"    def method_{i}(self, value: int) -> int:\n        \"\"\"Return value scaled by {i}.\"\"\"\n"
    f"        return value * {i} + self.offset\n\n" for i in range(1, 9))

PROMPTS: list[tuple[str, str]] = [
    ("python", 'def quicksort(arr):\n    """Sort a list of numbers in ascending order."""\n'),
    ("c", "#include <stdio.h>\n\nint main(void) {\n    int total = 0;\n    for (int i = 0; i < 10; i++) {\n"),
    ("prose", "The history of the printing press begins in the fifteenth century, when"),
    ("chinese", "请用简单的语言解释什么是机器学习，并举一个生活中的例子。"),
    ("chat", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
             "<|im_end|>\n<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n"
             "<|im_start|>assistant\n"),
    ("chat_zh", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                "用Python写一个计算斐波那契数列的函数。<|im_end|>\n<|im_start|>assistant\n"),
    ("math", "Question: A train travels 120 km in 1.5 hours. What is its average speed?\nAnswer:"),
    ("json", '{"name": "ignis", "version": "0.1.0", "description": "A CPU inference engine", '
             '"dependencies": ['),
    ("multilingual", "Bonjour ! Comment ça va ? 😊 Ich möchte heute Abend ins Kino gehen, aber"),
    # longer than one prefill chunk (128 tokens), so chunk boundaries are part of the comparison
    ("long_code", "class Scaler:\n    def __init__(self, offset: int) -> None:\n"
                  "        self.offset = offset\n\n" + _LONG_CODE
                  + "    def method_sum(self, value: int) -> int:\n"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from ignis.loader.registry import pull
    from ignis.loader.gguf_import import read_provenance

    torch.set_num_threads(args.threads)
    model_dir = pull(MODEL)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    prov = read_provenance(model_dir) or {}
    # transformers renamed past_key_values to cache (5.x); the cache object is updated in place
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    records = []
    t0 = time.time()
    with torch.inference_mode():
        for name, text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
            logits = out.logits[0].float()                       # [T, vocab]
            top1 = logits.argmax(-1)
            last = logits[-1]
            kv, ki = torch.topk(last, TOP_K)
            past = getattr(out, "past_key_values", None) or getattr(out, "cache")
            nxt = int(top1[-1])
            greedy, margins = [], []
            for _ in range(GREEDY):
                greedy.append(nxt)
                step = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{cache_kw: past})
                row = step.logits[0, -1].float()
                v2 = torch.topk(row, 2).values
                margins.append(round(float(v2[0] - v2[1]), 5))
                nxt = int(row.argmax())
            records.append({
                "name": name, "text": text, "ids": ids,
                "top1": top1.tolist(),
                "top1_logit": [round(float(v), 5) for v in logits.gather(1, top1[:, None])[:, 0]],
                "last_topk_ids": ki.tolist(),
                "last_topk_logits": [round(float(v), 5) for v in kv],
                "greedy": greedy, "greedy_margin": margins,
            })
            print(f"{name:>12}: {len(ids):4d} prompt ids, continuation {tok.decode(greedy)[:60]!r}")
    doc = {
        "model": MODEL,
        "source_sha256": prov.get("source", {}).get("sha256"),
        "made_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                      "dtype": "float32", "attn_implementation": "eager",
                      "tokenizer": "tokenizers.Tokenizer.from_file(tokenizer.json)"},
        "top_k": TOP_K, "greedy_tokens": GREEDY,
        "prompts": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
