"""The weight-format records (ignis/formats): the registry, the cache tags and versions they pin,
the packed sizes against the arrays the converters make, and what each converter converts.

How to add a weight format: CONTRIBUTING.md, "Add a weight format"."""
from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ignis import _core
from ignis.formats import FORMATS, PACKINGS, PARTS, WEIGHT_FORMATS, ConvertInput, WeightFormat
from ignis.formats import bf16, f32, gguf_blocks, q4, q8
from ignis.formats import gguf as gguf_format
from ignis.formats.quant import pack_q4, pack_q8, quantize_q4, quantize_q8
from ignis.loader import cache
from ignis.models import FAMILIES
from test_gguf_import import random_kquant_bytes

# (rows, columns): odd row counts (partial groups of 4), one block, several, a K-quant super-block
SIZES = [(1, 32), (3, 64), (4, 96), (5, 256), (7, 512), (33, 768)]


def test_the_registry_lists_each_module_under_its_name_in_the_cli_order():
    assert WEIGHT_FORMATS == ("f32", "bf16", "q8", "q4", "gguf")
    for mod in (f32, bf16, q8, q4, gguf_format):
        assert FORMATS[mod.__name__.rsplit(".", 1)[1]] is mod.FORMAT
    assert all(isinstance(f, WeightFormat) and f.description for f in FORMATS.values())


def test_cache_tags_and_versions_are_pinned():
    """A conversion-cache file is found by its tag and version: changing either orphans every file
    users have. Bump a version on purpose (and here) when a format's bytes change."""
    assert {t: p.cache_version for t, p in PARTS.items()} == {
        "bf16": 1, "q8": 4, "q4-q8": 2, "q4": 2, "gguf": 7}


def test_the_cache_commands_know_every_formats_tags():
    """`ignis rm --format` and `prune --keep-latest` group conversion files by format, by the
    file tags users' caches hold (pinned: a renamed tag would strand their files)."""
    assert {k: set(v) for k, v in cache.CONVERSION_FORMATS.items()} == {
        "bf16": {"bf16"}, "q8": {"q8"}, "q4": {"q4", "q4-q8"}, "gguf": {"gguf"}}


def test_each_c_id_is_one_packing_with_the_c_name_of_that_id():
    """Packing.c_id indexes every C kernel table's traits (IG_PACK_*): the records and the C
    enum name each id alike."""
    packings = [f32.F32, *(p.packing for p in PARTS.values())]
    for p in packings:
        assert PACKINGS[p.c_id] is p
    assert {p.name: i for i, p in PACKINGS.items()} == _core.packing_ids()


# the C size macros over a grid: odd row counts (partial groups of 4) and K from one block to several
# K-quant super-blocks, with K not a multiple of the block refused (-1)
GRID = [(n, k) for n in (1, 2, 3, 4, 5, 7, 8, 33, 896) for k in (1, 17, 32, 64, 96, 224, 256, 288, 512,
                                                                  768, 896, 4864)]


@pytest.mark.parametrize("c_id", sorted(PACKINGS))
def test_packed_sizes_are_the_c_macros(c_id):
    """Each packing's Python size (Packing.packed_bytes) is the C one (ig_packed_bytes, from the
    IG_*_BYTES macros the kernels stride by), for every sub-layout, where K is whole blocks."""
    p = PACKINGS[c_id]
    layouts = (gguf_blocks.WX_Q8, gguf_blocks.WX_Q5_0, gguf_blocks.WX_Q6K, gguf_blocks.WX_Q4K,
               gguf_blocks.WX_Q4_1, gguf_blocks.WX_Q5_1, gguf_blocks.WX_Q5K, gguf_blocks.WX_Q3K,
               gguf_blocks.WX_Q2K) \
        if p.layout_type is not None else (0,)
    checked = 0
    for layout in layouts:
        block = 256 if p.layout_type is not None and layout in gguf_blocks.K_LAYOUTS \
            else 32 if p.dtype == np.uint8 else 1
        for n, k in GRID:
            c = _core.packed_bytes(c_id, n, k, layout)
            if k % block:
                assert c == -1
                continue
            assert c == p.packed_bytes(n, k, layout), (p.name, layout, n, k)
            checked += 1
    assert checked >= 30
    assert _core.packed_bytes(c_id, 4, 64, 9 if p.layout_type is not None else 0) == \
        (-1 if p.layout_type is not None else p.packed_bytes(4, 64, 0))
    assert _core.packed_bytes(len(PACKINGS), 4, 64, 0) == -1


@pytest.mark.parametrize("n,k", SIZES)
def test_packed_sizes_are_those_of_the_packed_arrays(n, k):
    """The Python twins of csrc/ignis.h's IG_*_BYTES macros against the arrays the packers make
    (the kernels read exactly that many bytes)."""
    w = np.random.default_rng(n * k).standard_normal((n, k)).astype(np.float32)
    assert q8.Q8P.packed_bytes(n, k, 0) == pack_q8(quantize_q8(w)).nbytes
    assert q4.Q4P.packed_bytes(n, k, 0) == pack_q4(quantize_q4(w)).nbytes
    assert bf16.BF16.packed_bytes(n, k, 0) == bf16.f32_to_bf16(w).nbytes
    assert f32.F32.packed_bytes(n, k, 0) == w.nbytes


@pytest.mark.parametrize("n,k", [s for s in SIZES if s[1] % 256 == 0])
@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q5_0, QT.Q4_0, QT.Q4_1, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K,
                                   QT.Q5_K, QT.Q6_K, QT.IQ4_NL])
def test_x16_sizes_are_those_of_the_layouts(qtype, n, k):
    rng = np.random.default_rng(n + k)
    if qtype in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL):
        raw = random_kquant_bytes(rng, qtype, n, k)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    lay = gguf_blocks.gguf_weight_layout(raw.reshape(n, -1), qtype.name, (n, k))
    layout, packed = FORMATS["gguf"].parts[0].packing.unwrap(lay)
    assert packed.nbytes == FORMATS["gguf"].parts[0].packing.packed_bytes(n, k, layout)


def _input(names, weights, matmul):
    return ConvertInput(names, weights, frozenset(matmul), SimpleNamespace(weights=dict(zip(names, weights))),
                        FAMILIES["qwen2"])


@pytest.mark.parametrize("name", ["bf16", "q8", "q4"])
def test_a_converter_fills_each_part_for_the_matmul_matrices_only(name):
    """One list per part, in the tape's order: a packed array (of its packing's size) for a matmul
    matrix, None for the rest; q8 and q4 keep rows that are not whole blocks in f32, and q4 keeps
    the family's output projection in q8."""
    rng = np.random.default_rng(0)
    names = ["model.embed_tokens.weight", "a.weight", "odd.weight", "lm_head.weight", "norm.weight"]
    weights = [rng.standard_normal(s).astype(np.float32) for s in [(8, 64), (5, 64), (4, 40), (8, 64), (64,)]]
    fmt = FORMATS[name]
    got = fmt.convert(_input(names, weights, matmul={1, 2, 3}))
    assert list(got) == [p.cache_name for p in fmt.parts]
    whole = {"bf16": {1, 2, 3}, "q8": {1, 3}, "q4": {1, 3}}[name]
    where = {p.cache_name: [i for i, a in enumerate(got[p.cache_name]) if a is not None] for p in fmt.parts}
    if name == "q4":
        assert where == {"q4-q8": [3], "q4": [1]}
    else:
        assert where == {name: sorted(whole)}
    for p in fmt.parts:
        for i in where[p.cache_name]:
            a = got[p.cache_name][i]
            assert a.dtype == p.packing.dtype and a.nbytes == p.packing.packed_bytes(*weights[i].shape, 0)
    assert FORMATS["f32"].convert is None and not FORMATS["f32"].parts


def test_a_record_names_its_parts_after_itself():
    with pytest.raises(ValueError, match="must be named"):
        WeightFormat("q5", "q5", parts=(q8.PART,), convert=q8.convert)
