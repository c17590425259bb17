"""Speculative decoding against plain decoding, same process, same prompts, runs interleaved.

    python benchmarks/bench_speculative.py [--runs 3] [--max-tokens 256] [--cases 0.5b-lookup-code,...]

Cases (greedy, so both sides produce the same ids, which is checked):
  0.5b-lookup-code   qwen2.5-coder-0.5b-instruct, prompt lookup, "rewrite this 60-line function
                     with one name changed" (the case prompt lookup is for)
  0.5b-lookup-chat   the same model, prompt lookup, a free-form question (guesses mostly fail:
                     the adaptive length must keep it near plain speed)
  1.5b-draft-chat    qwen2.5-coder-1.5b-instruct with the 0.5B model drafting, a free-form question
  1.5b-draft-code    the same on the code edit
  1.5b-lookup-code   the 1.5B model with prompt lookup on the code edit
Decode tok/s is (completion tokens - 1) / decode seconds (the first token comes with the prompt's
step; the draft model's own prompt prefill counts as prompt time); end-to-end tok/s divides the
completion tokens by prompt + decode seconds. Prints medians of --runs and the ratio to plain.
Run it under /work/iglock/ig-bench on the shared machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

CODE = '''def summarize_orders(orders, tax_rate, discount_codes):
    """Group orders by customer and compute totals, taxes and discounts."""
    summary = {}
    for order in orders:
        customer = order["customer"]
        if customer not in summary:
            summary[customer] = {
                "count": 0,
                "subtotal": 0.0,
                "discount": 0.0,
                "tax": 0.0,
                "total": 0.0,
                "items": [],
            }
        entry = summary[customer]
        entry["count"] += 1
        order_subtotal = 0.0
        for item in order["items"]:
            price = float(item["price"])
            quantity = int(item["quantity"])
            if quantity <= 0:
                continue
            line_total = price * quantity
            order_subtotal += line_total
            entry["items"].append(
                {"sku": item["sku"], "quantity": quantity, "line_total": line_total}
            )
        code = order.get("discount_code")
        discount = 0.0
        if code is not None and code in discount_codes:
            rule = discount_codes[code]
            if rule["kind"] == "percent":
                discount = order_subtotal * rule["value"] / 100.0
            elif rule["kind"] == "fixed":
                discount = min(rule["value"], order_subtotal)
        taxable = order_subtotal - discount
        tax = taxable * tax_rate
        entry["subtotal"] += order_subtotal
        entry["discount"] += discount
        entry["tax"] += tax
        entry["total"] += taxable + tax
    for customer, entry in summary.items():
        entry["subtotal"] = round(entry["subtotal"], 2)
        entry["discount"] = round(entry["discount"], 2)
        entry["tax"] = round(entry["tax"], 2)
        entry["total"] = round(entry["total"], 2)
        entry["items"].sort(key=lambda it: it["line_total"], reverse=True)
    ranked = sorted(summary.items(), key=lambda kv: kv[1]["total"], reverse=True)
    result = []
    for rank, (customer, entry) in enumerate(ranked, start=1):
        result.append(
            {
                "rank": rank,
                "customer": customer,
                "orders": entry["count"],
                "total": entry["total"],
            }
        )
    return result
'''
CODE_PROMPT = ("Rewrite this function with the variable `entry` renamed to `account`. Output the "
               "whole function and nothing else.\n\n```python\n" + CODE + "```")
CHAT_PROMPT = ("Explain in a few paragraphs how a hash map works, what happens on collisions, and "
               "when you would pick a balanced tree instead.")
SMALL, LARGE = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
CASES = {
    "0.5b-lookup-code": (SMALL, "prompt-lookup", CODE_PROMPT),
    "0.5b-lookup-chat": (SMALL, "prompt-lookup", CHAT_PROMPT),
    "1.5b-draft-chat": (LARGE, f"draft:{SMALL}", CHAT_PROMPT),
    "1.5b-draft-code": (LARGE, f"draft:{SMALL}", CODE_PROMPT),
    "1.5b-lookup-code": (LARGE, "prompt-lookup", CODE_PROMPT),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    import ignis
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    # one Model per (model, draft): a draft model is loaded with its target
    models: dict[tuple[str, str | None], object] = {}
    for c in names:
        target, spec, _ = CASES[c]
        key = (target, spec if spec.startswith("draft:") else None)
        if key not in models:
            models[key] = ignis.load(target, speculative=key[1], threads=args.threads,
                                     progress=False)
    rows: dict[str, dict[str, list[float]]] = {c: {} for c in names}
    info: dict[str, str] = {}
    for run in range(args.runs):
        for c in names:
            target, spec, prompt = CASES[c]
            m = models[(target, spec if spec.startswith("draft:") else None)]
            msgs = [{"role": "user", "content": prompt}]
            out = {}
            for mode in ("off", spec):
                m.reset()
                r = m.chat(msgs, max_tokens=args.max_tokens, temperature=0, speculative=mode)
                n = r.completion_tokens
                rows[c].setdefault(f"{mode}:decode", []).append((n - 1) / r.generate_seconds)
                rows[c].setdefault(f"{mode}:e2e", []).append(
                    n / (r.prompt_seconds + r.generate_seconds))
                out[mode] = r
            a, b = out["off"], out[spec]
            if a.token_ids != b.token_ids:
                print(f"{c}: speculative output differs from plain decoding!", file=sys.stderr)
                return 1
            st = b.speculative
            info[c] = (f"{len(a.token_ids)} tokens, kept {st.accepted}/{st.drafted} "
                       f"({st.acceptance_rate:.0%}), {st.verify_steps}/{st.steps} steps verified")
            print(f"run {run + 1} {c}: plain {rows[c]['off:decode'][-1]:.1f} tok/s, "
                  f"{spec} {rows[c][f'{spec}:decode'][-1]:.1f} tok/s; {info[c]}", flush=True)
    print()
    print(f"| case | model | drafter | plain decode tok/s | speculative decode tok/s | ratio | "
          f"end-to-end ratio | output |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for c in names:
        target, spec, _ = CASES[c]
        med = {k: statistics.median(v) for k, v in rows[c].items()}
        print(f"| {c} | {target} | {spec} | {med['off:decode']:.1f} | {med[f'{spec}:decode']:.1f} | "
              f"{med[f'{spec}:decode'] / med['off:decode']:.2f}x | "
              f"{med[f'{spec}:e2e'] / med['off:e2e']:.2f}x | {info[c]} |")
    print(f"\nmedians of {args.runs} runs, greedy, max_tokens {args.max_tokens}; "
          f"{time.strftime('%Y-%m-%d')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
