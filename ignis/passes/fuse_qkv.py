"""q/k/v projections of one input become one packed matmul; rope and attention read the packed rows.

Requires: a verified graph with attention(rope(linear(h,Wq)), rope(linear(h,Wk)), linear(h,Wv), pos).
Guarantees: where every interior value is read only by the pattern, all three projections agree on
bias and both ropes on theta and inverse-frequency table, the six ops become linear_qkv (columns
[q | k | v]), rope_qkv (in place on the q and k sections, reading the ropes' table) and
attention_packed, with identical arithmetic per element. Anything between a projection and its
rope (Qwen3's per-head q/k norm) is no match. Run before fuse_rope_qkv.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Rule, apply_rules, producer, sole_user


def _pattern(g, n):
    q, k, v, pos = n.inputs
    rq, rk, lv = producer(q, "rope"), producer(k, "rope"), producer(v, "linear")
    if rq is None or rk is None or lv is None:
        return None
    lq, lk = producer(rq.inputs[0], "linear"), producer(rk.inputs[0], "linear")
    if lq is None or lk is None:
        return None
    return {"root": n, "rq": rq, "rk": rk, "lq": lq, "lk": lk, "lv": lv, "pos": pos}


def _check(g, m):
    n, rq, rk, lq, lk, lv = (m[k] for k in ("root", "rq", "rk", "lq", "lk", "lv"))
    h = lq.inputs[0]
    at = n.attrs
    return (lk.inputs[0] is h and lv.inputs[0] is h
            and len(lq.inputs) == len(lk.inputs) == len(lv.inputs)
            and rq.inputs[1] is m["pos"] and rk.inputs[1] is m["pos"]
            and rq.attrs["theta"] == rk.attrs["theta"]
            and len(rq.inputs) == len(rk.inputs) and rq.inputs[2:] == rk.inputs[2:]   # same table
            and rq.attrs["n_heads"] == at["n_heads"] and rk.attrs["n_heads"] == at["n_kv_heads"]
            and rq.attrs["head_dim"] == rk.attrs["head_dim"] == at["head_dim"]
            and sole_user(g, lq.out, rq) and sole_user(g, lk.out, rk)
            and sole_user(g, rq.out, n) and sole_user(g, rk.out, n) and sole_user(g, lv.out, n))


def _rewrite(b, m, v):
    n, lq, lk, lv = m["root"], m["lq"], m["lk"], m["lv"]
    gqa = {k: n.attrs[k] for k in ("n_heads", "n_kv_heads", "head_dim")}
    ws = [lq.inputs[1], lk.inputs[1], lv.inputs[1]]
    if len(lq.inputs) == 3:
        ws += [lq.inputs[2], lk.inputs[2], lv.inputs[2]]
    qkv = b.op("linear_qkv", v(lq.inputs[0]), *map(v, ws), name=n.name + "_qkv.proj", **gqa)
    freqs = [v(f) for f in m["rq"].inputs[2:]]     # the inverse-frequency table, when rope has one
    qkv = b.op("rope_qkv", qkv, v(m["pos"]), *freqs, name=n.name + "_qkv",
               theta=m["rq"].attrs["theta"], **gqa)
    return b.op("attention_packed", qkv, v(m["pos"]), name=n.name, layer=n.attrs["layer"], **gqa)


RULE = Rule(name="qkv", root="attention", pattern=_pattern, check=_check, rewrite=_rewrite)


def fuse_qkv(g: Graph) -> Graph:
    return apply_rules(g, [RULE])
