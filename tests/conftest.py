"""Shared pytest fixtures. Add new fixtures in the section of the stage they belong to."""
from __future__ import annotations

from pathlib import Path

import pytest

from tiny_models import write_tiny_model    # importable via pythonpath = ["tests"] in pyproject


# --- loader: tiny random models in Hugging Face layout ------------------------------------------

@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Qwen2 (2 layers, GQA 4/2, q/k/v biases, tied embeddings), F32, single file.
    Shared by the whole session: never modify it (copy it with shutil.copytree first)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Llama (2 layers, GQA 4/2, no biases, untied lm_head), F32, single file. Read-only."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=0)
