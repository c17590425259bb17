"""Shared pytest fixtures. Add new fixtures in the section of the stage they belong to."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from ignis.loader import registry
from ignis.loader.resolve import ModelFiles, open_dir
from real_models import require_model_packages
from tiny_models import complete_tiny_model, write_tiny_model    # via pythonpath = ["tests"]


# --- markers ------------------------------------------------------------------------------------

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs a real model is slow too (it imports ~3 GB once per session), so that
    `pytest -m "not slow"` never imports one, however the test was marked."""
    for item in items:
        if item.get_closest_marker("model") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


# --- isolation ----------------------------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def _private_ignis_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests never read or write the user's cache: IGNIS_HOME points into the session's temp dir
    (tests that need another one set it themselves)."""
    old = os.environ.get("IGNIS_HOME")
    os.environ["IGNIS_HOME"] = str(tmp_path_factory.mktemp("ignis-home-session"))
    yield
    if old is None:
        os.environ.pop("IGNIS_HOME", None)
    else:
        os.environ["IGNIS_HOME"] = old


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


@pytest.fixture(scope="session")
def tiny_chat_dir(tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with the tiny tokenizer and its chat template: a complete model ignis.load
    can generate with. Shared by the session: never modify it."""
    return complete_tiny_model(tiny_qwen2_dir, tmp_path_factory.mktemp("tiny-chat") / "tiny-chat")


@pytest.fixture(scope="session")
def tiny_chat_compiled(tiny_chat_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """tiny_chat_dir compiled by `ignis compile` (f32 weights, a 256-token context): the
    ignis.native CompileResult (.directory, .library). Shared by the session: never modify it."""
    from ignis.native import compile_model
    from tools_required import require_tool
    require_tool("cc", "apt-get install gcc", "the compiled library")
    return compile_model(str(tiny_chat_dir), tmp_path_factory.mktemp("tiny-chat-native") / "out",
                         weights="f32", ctx=256, progress=False)


@pytest.fixture(scope="module")
def tiny_chat_native(tiny_chat_compiled):
    """ignis.Client(native=...) on tiny_chat_compiled: the compiled library through ctypes."""
    import ignis
    with ignis.Client(native=str(tiny_chat_compiled.directory)) as c:
        yield c


@pytest.fixture(scope="module")
def tiny_chat_local(tiny_chat_dir):
    """The in-process ignis.Client on tiny_chat_dir as tiny_chat_compiled was compiled (f32
    weights, a 256-token context): what the compiled library's answers are held to."""
    import ignis
    m = ignis.load(str(tiny_chat_dir), weight_format="f32", n_ctx=256, progress=False)
    yield ignis.Client([m])
    m.weights.close()


# --- real models (marked `model`; imported once per session) -----------------------------------

@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory) -> Iterator[Path]:
    """The default model pulled into a fresh IGNIS_HOME, once per session (~30 s).

    Skips when its packages are not installed, unless IGNIS_REQUIRE_MODELS=1 (CI), where it fails.
    """
    entry = registry.REGISTRY[registry.DEFAULT_MODEL]
    require_model_packages(entry)
    home = tmp_path_factory.mktemp("ignis-home")
    old = os.environ.get("IGNIS_HOME")
    os.environ["IGNIS_HOME"] = str(home)
    try:
        path = registry.pull(entry.name, progress=False)
    finally:
        if old is None:
            del os.environ["IGNIS_HOME"]
        else:
            os.environ["IGNIS_HOME"] = old
    yield path
    # ~3 GB: do not leave it to pytest's retention of the last few temp roots.
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model_compiled(default_model_dir: Path, tmp_path_factory):
    """The default model compiled by `ignis compile` in its GGUF blocks (a 512-token context), once
    per session: the ignis.native CompileResult. ~0.9 GB, deleted at the session's end. Read-only."""
    from ignis.native import compile_model
    from tools_required import require_tool
    require_tool("cc", "apt-get install gcc", "the compiled library")
    directory = tmp_path_factory.mktemp("default-native")
    yield compile_model(str(default_model_dir), directory / "out", weights="gguf", ctx=512, progress=False)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory) -> Iterator[Path]:
    """The real Gemma 3 270M GGUF, assembled once per session (242 MB) and deleted at its end."""
    from gemma_gguf import gemma_gguf
    directory = tmp_path_factory.mktemp("gemma3-gguf")
    yield gemma_gguf(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model_files(default_model_dir: Path) -> Iterator[ModelFiles]:
    """The default model's files opened once per session: every Engine built on them shares one
    mmap of its ~2 GB of f32 weights (each open_dir maps them again, and a process's resident
    size counts every mapping's pages). Engines may be built on them; never close them in a test."""
    files = open_dir(default_model_dir, name=registry.DEFAULT_MODEL)
    yield files
    files.weights.close()
