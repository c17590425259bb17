"""Helpers for tests that need a real registry model: skip when its packages are missing, or fail
when IGNIS_REQUIRE_MODELS=1 (CI), so a missing install step can never pass silently."""
from __future__ import annotations

import os

import pytest

from ignis.errors import ModelPackagesMissingError
from ignis.loader import registry
from ignis.loader.registry import RegistryEntry


def require_model_packages(entry: RegistryEntry) -> None:
    """Skip when `entry`'s packages are missing, or fail when IGNIS_REQUIRE_MODELS=1 (CI)."""
    try:
        registry.locate_parts(entry)
    except ModelPackagesMissingError as e:
        if os.environ.get("IGNIS_REQUIRE_MODELS") == "1":
            pytest.fail(f"IGNIS_REQUIRE_MODELS=1 but model {entry.name!r} is missing: {e}")
        pytest.skip(f"model {entry.name!r} not installed: {e.install_command}")
