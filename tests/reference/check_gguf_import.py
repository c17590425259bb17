#!/usr/bin/env python
"""Check ignis's GGUF import against references nobody here wrote (run by hand or in a heavy CI job).

For each registry model whose packages are installed:
  1. pull it, then compare every imported tensor with the `gguf` package's own dequantization of the
     verified GGUF (name mapping and Llama q/k row order re-derived independently below);
  2. if torch and transformers are importable: load the imported directory with transformers, and
     the GGUF directly with transformers (its own GGUF loader), and check that both give the same
     weights and the same greedy output on a few prompts (tokenized by the HF tokenizer read from
     the GGUF). Also checks the imported tokenizer.json encodes the prompts identically.

Prints a table; exits 1 on any mismatch, 2 when nothing could be checked.

    python tests/reference/check_gguf_import.py                       # all installed models
    python tests/reference/check_gguf_import.py --models qwen2.5-coder-0.5b-instruct
    python tests/reference/check_gguf_import.py --transformers all    # default: only the default model
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gguf  # noqa: E402

from ignis.errors import ModelPackagesMissingError  # noqa: E402
from ignis.loader import registry  # noqa: E402
from ignis.loader.safetensors import load_checkpoint  # noqa: E402

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about compilers.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\n# compute the mean of a list\n",
]

# GGUF -> HF names, restated here from llama.cpp's tensor naming (not imported from ignis).
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj"}


def hf_name(g: str) -> str:
    base, kind = g.rsplit(".", 1)
    if base in _TOP:
        return f"{_TOP[base]}.{kind}"
    _, i, mod = base.split(".")
    return f"model.layers.{i}.{_BLK[mod]}.{kind}"


def rope_row_order(rows: int, n_heads: int) -> np.ndarray:
    """Index map for llama.cpp's q/k permutation, derived row by row: within a head of size d, HF
    row s*(d/2) + j (s: which half, j: pair index) is stored as GGUF row 2*j + s."""
    d = rows // n_heads
    idx = np.empty(rows, dtype=np.int64)
    for r in range(rows):
        h, rem = divmod(r, d)
        s, j = divmod(rem, d // 2)
        idx[r] = h * d + 2 * j + s
    return idx


@dataclass
class Row:
    model: str
    status: str = "?"
    tensors: str = "-"
    max_diff: str = "-"
    hf_weights: str = "-"
    greedy: str = "-"
    tokenizer: str = "-"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    failed: bool = False


def check_tensors(name: str, row: Row) -> tuple[Path, Path]:
    out = registry.pull(name, progress=sys.stderr.isatty())
    src = registry.gguf_path(name)
    reader = gguf.GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    n_heads = reader.get_field(f"{arch}.attention.head_count").contents()
    n_kv = reader.get_field(f"{arch}.attention.head_count_kv").contents()
    bad, worst, n, equal = [], 0.0, 0, 0
    with load_checkpoint(out) as ws:
        names = {hf_name(t.name) for t in reader.tensors}
        if names != set(ws):
            bad.append(f"name sets differ: only imported {sorted(set(ws) - names)[:3]}, "
                       f"only GGUF {sorted(names - set(ws))[:3]}")
        for t in reader.tensors:
            hf = hf_name(t.name)
            if hf not in ws:
                continue
            ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            if arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
                heads = n_heads if t.name.split(".")[-2] == "attn_q" else n_kv
                ref = ref[rope_row_order(ref.shape[0], heads)]
            got = ws[hf]
            n += 1
            if got.shape != ref.shape:
                bad.append(f"{hf}: shape {got.shape} vs {ref.shape}")
                continue
            if np.array_equal(got, ref):
                equal += 1
            else:
                d = float(np.max(np.abs(got.astype(np.float64) - ref)))
                worst = max(worst, d)
                bad.append(f"{hf}: max |diff| {d:.3g}")
    row.tensors = f"{equal}/{n} equal"
    row.max_diff = f"{worst:.3g}"
    if bad:
        row.failed = True
        row.notes += bad[:5]
    return out, src


def check_transformers(name: str, out: Path, src: Path, row: Row, max_new: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import transformers

    # transformers 4.56 renamed torch_dtype to dtype; loading a GGUF also needs `accelerate`.
    f32 = ({"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5
           else {"torch_dtype": torch.float32})
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    mine = AutoModelForCausalLM.from_pretrained(out, **f32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, **f32).eval()
    a, b = mine.state_dict(), theirs.state_dict()
    keys = sorted(set(a) | set(b))
    diff = [k for k in keys if k not in a or k not in b or not torch.equal(a[k], b[k])]
    # A tied model may list lm_head in one and not the other: same storage, so compare values only.
    diff = [k for k in diff if not (k == "lm_head.weight" and mine.config.tie_word_embeddings
                                     and (k not in a or k not in b))]
    row.hf_weights = f"{len(keys) - len(diff)}/{len(keys)} equal"
    if diff:
        row.failed = True
        row.notes.append(f"transformers weights differ: {diff[:4]}")

    try:
        tok_mine = AutoTokenizer.from_pretrained(out)
        same_tok = sum(tok_mine(p)["input_ids"] == tok(p)["input_ids"] for p in PROMPTS)
        row.tokenizer = f"{same_tok}/{len(PROMPTS)} equal"
        if same_tok != len(PROMPTS):
            row.failed = True
            row.notes.append("imported tokenizer.json encodes prompts differently from the GGUF's")
    except Exception as e:  # noqa: BLE001 - reported as a failure, with its message
        row.tokenizer = "error"
        row.failed = True
        row.notes.append(f"imported tokenizer failed to load: {type(e).__name__}: {e}")

    same = 0
    greedy = dict(do_sample=False, max_new_tokens=max_new, repetition_penalty=1.0, temperature=None,
                  top_p=None, top_k=None, pad_token_id=tok.eos_token_id)
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt")
            x = mine.generate(**ids, **greedy)[0].tolist()
            y = theirs.generate(**ids, **greedy)[0].tolist()
            if x == y:
                same += 1
            else:
                row.failed = True
                row.notes.append(f"greedy differs for {p[:30]!r}: {tok.decode(x[len(ids['input_ids'][0]):])!r}"
                                 f" vs {tok.decode(y[len(ids['input_ids'][0]):])!r}")
        first = tok(PROMPTS[0], return_tensors="pt")
        la, lb = mine(**first).logits, theirs(**first).logits
        row.max_diff += f" / logits {float((la - lb).abs().max()):.3g}"
        sample = mine.generate(**first, **greedy)[0][first["input_ids"].shape[1]:]
        row.notes.append(f"sample: {PROMPTS[0]!r} -> {tok.decode(sample)!r}")
    row.greedy = f"{same}/{len(PROMPTS)} equal ({max_new} tok)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="all", help="comma-separated registry names (default: all)")
    ap.add_argument("--transformers", default="default",
                    help="'default' (the default model only), 'all', 'none', or comma-separated names")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args(argv)

    names = sorted(registry.REGISTRY) if args.models == "all" else args.models.split(",")
    if args.transformers == "default":
        hf_models = {registry.DEFAULT_MODEL}
    elif args.transformers == "all":
        hf_models = set(names)
    elif args.transformers == "none":
        hf_models = set()
    else:
        hf_models = set(args.transformers.split(","))
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        have_hf = True
    except ImportError:
        have_hf = False

    rows: list[Row] = []
    for name in names:
        row = Row(name)
        rows.append(row)
        t0 = time.perf_counter()
        try:
            registry.locate_parts(registry.get_entry(name))
        except ModelPackagesMissingError as e:
            row.status = "SKIP"
            row.notes.append(f"packages missing: {e.install_command}")
            continue
        try:
            out, src = check_tensors(name, row)
            if name in hf_models:
                if have_hf:
                    check_transformers(name, out, src, row, args.max_new_tokens)
                else:
                    row.notes.append("torch/transformers not importable: transformers check skipped")
        except Exception as e:  # noqa: BLE001 - one model's crash must not hide the others' results
            row.failed = True
            row.notes.append(f"{type(e).__name__}: {e}")
        row.seconds = time.perf_counter() - t0
        row.status = "FAIL" if row.failed else "OK"
        print(f"[{row.status}] {name} ({row.seconds:.0f} s)", file=sys.stderr, flush=True)

    cols = ["model", "status", "tensors vs gguf", "max |diff|", "HF weights vs HF-GGUF",
            "greedy vs HF-GGUF", "tokenizer ids", "time"]
    table = [[r.model, r.status, r.tensors, r.max_diff, r.hf_weights, r.greedy, r.tokenizer,
              f"{r.seconds:.0f}s"] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths))
    print(line(cols))
    print("-+-".join("-" * w for w in widths))
    for t in table:
        print(line(t))
    for r in rows:
        for n in r.notes:
            print(f"  {r.model}: {n}")
    if any(r.failed for r in rows):
        return 1
    return 0 if any(r.status == "OK" for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
