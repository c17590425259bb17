"""Tests that need a program of the machine (a cross compiler, qemu, auditwheel, taskset): absent,
they skip on a developer's machine and fail in CI, which installs them and sets
IGNIS_REQUIRE_TOOLS=1 (.ci/run), so a check is never silently left out there."""
from __future__ import annotations

import os
import shutil

import pytest


def missing_tool(why: str) -> None:
    """Skip with `why`, or fail with it under IGNIS_REQUIRE_TOOLS=1."""
    if os.environ.get("IGNIS_REQUIRE_TOOLS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def require_tool(tool: str, install: str, unchecked: str, path: str | None = None) -> str:
    """The program's path; else missing_tool saying how to install it and what goes unchecked."""
    found = shutil.which(tool, path=path) if path else shutil.which(tool)
    if found is None:
        missing_tool(f"no {tool} on PATH ({install}): {unchecked} is not checked")
    return found
