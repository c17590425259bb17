"""n > 1 choices on parallel KV slots: time until every choice has made its first chunk, with the
prompt run once and copied into the other slots (today) beside each slot running it itself (as
before Engine.copy_slot; Model._share_prompt switched off in the same process).

    python benchmarks/bench_choices.py [--model qwen2.5-coder-0.5b-instruct] [--n 4] [--runs 3]

One model loaded with parallel=n (weights q8, threads 2), a prompt of about 300 tokens, n choices
seeded alike in both cases; the cases interleave run by run, every run starting from empty slots
(model.reset()). Prints the median of each case and their ratio, and checks the answers agree.
"""
from __future__ import annotations

import argparse
import statistics
import time

import ignis
from ignis.api.model import Model

PROMPT = ("Explain, step by step, what the following Python function does, then suggest how to make "
          "it faster and rewrite it.\n\n" + "\n".join(
              f"def f{i}(xs):\n    out = []\n    for x in xs:\n        if x % {i + 2} == 0:\n"
              f"            out.append(x * {i})\n    return out\n" for i in range(6)))


def first_chunks(model, ids, n: int) -> tuple[float, list[str]]:
    model.reset()
    t0 = time.perf_counter()
    firsts: dict[int, float] = {}
    texts = [""] * n
    choices = model.start_choices(ids, n, temperature=1.0, seed=3, max_tokens=8)
    for i, c in choices:
        if c is not None:
            firsts.setdefault(i, time.perf_counter() - t0)
            texts[i] += c.text
    assert len(firsts) == n, "a choice made no chunk"
    return max(firsts.values()), texts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    m = ignis.load(a.model, weight_format="q8", threads=a.threads, n_ctx=1024, parallel=a.n,
                   progress=False)
    ids = m.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    shared = Model._share_prompt
    times: dict[str, list[float]] = {"shared": [], "each": []}
    answers = {}
    try:
        for _ in range(a.runs):
            for case in times:
                Model._share_prompt = shared if case == "shared" else (lambda *args: None)
                t, texts = first_chunks(m, ids, a.n)
                times[case].append(t)
                answers.setdefault(case, texts)
    finally:
        Model._share_prompt = shared
        m.close()
    assert answers["shared"] == answers["each"], "the answers differ between the two cases"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model} q8, {len(ids)}-token prompt, n={a.n} on {a.n} slots, threads={a.threads}, "
          f"{a.runs} runs: time to the first chunk of every choice")
    for k, v in times.items():
        print(f"  {'prompt run once, copied' if k == 'shared' else 'each slot runs the prompt':28s}"
              f" median {med[k]:.3f} s  ({', '.join(f'{x:.3f}' for x in v)})")
    print(f"  ratio: {med['each'] / med['shared']:.2f}x")


if __name__ == "__main__":
    main()
