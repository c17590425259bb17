"""Shared helpers of the tokenizer tests (no tests here): where the registry tokenizers come from.

Tokenizer files come from tokenizer_files_from_gguf on the real GGUF metadata when the GGUF is on this
machine, else from the committed copies in tests/data/tokenizer/ (written by the same function, see
tests/reference/make_tokenizer_golden.py), so these tests never need the 491 MB model assembled.
"""
from __future__ import annotations

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "tokenizer"
FAMILIES = ("qwen2.5", "smollm2")
_REGISTRY_NAME = {"qwen2.5": "qwen2.5-coder-0.5b-instruct", "smollm2": "smollm2-135m-instruct"}
_ENV = {"qwen2.5": "IGNIS_QWEN_GGUF", "smollm2": "IGNIS_SMOLLM_GGUF"}


def find_gguf(family: str) -> Path | None:
    """The family's GGUF if present: $IGNIS_QWEN_GGUF / $IGNIS_SMOLLM_GGUF, the registry cache, or
    (SmolLM2, a single-file package) the installed package file."""
    env = os.environ.get(_ENV[family])
    if env and Path(env).is_file():
        return Path(env)
    try:
        from ignis.loader import registry
        p = registry.gguf_path(_REGISTRY_NAME[family])
        if p.is_file():
            return p
        entry = registry.get_entry(_REGISTRY_NAME[family])
        parts = registry.locate_parts(entry)
        if len(parts) == 1 and parts[0].is_file():
            return parts[0]
    except Exception:  # registry missing, packages not installed: fall back to committed files
        pass
    return None


def read_gz_json(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def committed_files(family: str) -> dict[str, dict]:
    return {name: read_gz_json(DATA / f"{family}-{name}.gz")
            for name in ("tokenizer.json", "tokenizer_config.json")}


@lru_cache(maxsize=None)
def gguf_files_at(path: Path) -> dict[str, dict]:
    import gguf
    from ignis.tokenizer import tokenizer_files_from_gguf
    return tokenizer_files_from_gguf(gguf.GGUFReader(path))


def gguf_files(family: str) -> dict[str, dict] | None:
    path = find_gguf(family)
    return None if path is None else gguf_files_at(path)


@lru_cache(maxsize=None)
def tokenizer_files(family: str) -> dict[str, dict]:
    return gguf_files(family) or committed_files(family)


@lru_cache(maxsize=None)
def ours(family: str, backend: str = "core"):
    from ignis.tokenizer import load_tokenizer
    return load_tokenizer(tokenizer_files(family), backend=backend)


@lru_cache(maxsize=None)
def reference(family: str):
    """Hugging Face tokenizers' Tokenizer from the same tokenizer.json."""
    import tokenizers
    return tokenizers.Tokenizer.from_str(json.dumps(tokenizer_files(family)["tokenizer.json"]))


def ref_encode(tok, text: str, *, add_special_tokens: bool = True,
               split_special_tokens: bool = False) -> list[int]:
    tok.encode_special_tokens = split_special_tokens
    try:
        return tok.encode(text, add_special_tokens=add_special_tokens).ids
    finally:
        tok.encode_special_tokens = False
