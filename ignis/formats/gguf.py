"""weight_format="gguf": a model imported from a GGUF file multiplies with the file's own blocks
(Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL; formats.gguf_blocks lays them out for the x16
kernels), never re-rounded; activations are quantized to 16 bits per block. Weights of other types
(F32, F16) stay on the (equally exact) f32 path."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RuntimeInputError
from .base import ConvertInput, Converted, Packing, Part, WeightFormat
from .gguf_blocks import BLOCK_BYTES, TYPE_IDS, Layout, gguf_weight_layout, packed_x16_bytes

# one packing with sub-layouts: Layout.fmt is its IG_WX_* id
X16 = Packing("x16", c_id=4, dtype=np.dtype(np.uint8),
              packed_bytes=lambda n, k, layout=0: packed_x16_bytes(layout, n, k),
              layout_type=Layout)
# gguf 7: IQ4_NL weights in the Q8_0 layout (6 left them on the f32 path; 5 Q2_K; 4 Q3_K; 3 Q4_1,
# Q5_1, Q5_K)
PART = Part("gguf", cache_version=7, packing=X16, label="the GGUF file's blocks", reads_gguf=True)


def convert(inp: ConvertInput) -> dict[str, Converted]:
    """The GGUF file's own blocks for every matmul matrix of a model imported from GGUF (x16
    layouts); None for the rest and for types without a layout. Which tensor and type each weight
    came from is in the import's record; the blocks are read straight from the file, which must be
    the one imported (same size, and same SHA-256 when the import recorded it) and hold each
    tensor with the recorded type and shape."""
    # the loader reads the file: imported when converting, so the format records import no layer
    from ..loader.gguf_tensors import tensor_index, tensor_rows
    from ..loader.provenance import file_sha256, read_provenance
    model = inp.model
    path = getattr(model, "path", None)
    prov = read_provenance(path) if path is not None else None
    src = prov.get("source") if prov else None
    records = prov.get("tensors") if prov else None
    if not isinstance(src, dict) or not isinstance(src.get("path"), str) or not isinstance(records, dict):
        raise RuntimeInputError("weight_format='gguf' reads the blocks of the GGUF file a model was "
                                "imported from; this model was not imported from a GGUF file (or "
                                "its ignis_import.json is damaged): use 'q8' or 'q4' to quantize "
                                "it, or load the .gguf again")
    gpath = Path(src["path"])
    try:
        size = gpath.stat().st_size
    except OSError:
        size = None
    recorded = src.get("sha256")         # None when the import was not given one: size only
    changed = size is not None and (size != src.get("size") or (
        recorded is not None and file_sha256(gpath) != recorded))
    if size is None or changed:
        raise RuntimeInputError(f"weight_format='gguf' needs the GGUF file this model was imported "
                                f"from, {gpath}, which is "
                                f"{'missing' if size is None else 'changed since the import'}; "
                                f"import it again or use weight_format='q8'")
    index = tensor_index(gpath)
    cfg = model.config
    out: Converted = [None] * len(inp.weights)
    for i, name in enumerate(inp.names):
        rec = records.get(name)
        if i not in inp.matmul or not isinstance(rec, dict):
            continue
        qtype = rec.get("gguf_type")
        if not isinstance(qtype, str) or qtype not in BLOCK_BYTES:
            continue
        n, k = inp.weights[i].shape
        per, size = BLOCK_BYTES[qtype]
        loc = index.get(rec.get("gguf_name")) if isinstance(rec.get("gguf_name"), str) else None
        if loc is None or loc.type_id != TYPE_IDS[qtype] or loc.dims != (k, n):
            raise RuntimeInputError(f"weight {name!r}: the import recorded it as {qtype} tensor "
                                    f"{rec.get('gguf_name')!r} of shape [{n}, {k}], which {gpath} "
                                    f"does not hold; import the file again")
        if k % per:
            continue
        heads = inp.family.permuted_heads(cfg, name) if rec.get("unpermuted") else None
        raw = tensor_rows(gpath, loc, n, k // per * size)
        out[i] = gguf_weight_layout(raw, qtype, (n, k), heads)
    return {PART.cache_name: out}


FORMAT = WeightFormat("gguf", "gguf (a model imported from a GGUF file: the file's own blocks)",
                      parts=(PART,), convert=convert)
