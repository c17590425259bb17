"""Golden files of printed IR and tapes (tests/golden/): a refactor must show zero diff.
IGNIS_UPDATE_GOLDEN=1 rewrites them, to accept an intended change after reviewing the diff."""
from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("IGNIS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with IGNIS_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} differs from the golden file (IGNIS_UPDATE_GOLDEN=1 " \
                                     f"to accept the change, after reviewing the diff)"
