"""Progress on stderr for the slow steps of getting a model ready (assembling, hashing, importing,
converting weights): a tqdm bar where the amount of work is known, a status line otherwise. Shown
only when asked for (progress=True, no -q) and stderr is a terminal: logs and pipes stay clean.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Iterator


def stderr_is_terminal() -> bool:
    """The one place that decides whether stderr is a terminal (tests monkeypatch it)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):        # replaced by an object without isatty, or closed
        return False


def enabled(progress: bool) -> bool:
    return bool(progress) and stderr_is_terminal()


def bar(total: int, desc: str, progress: bool) -> Any:
    """A byte-counting tqdm bar on stderr, disabled (a no-op) unless `enabled(progress)`."""
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not enabled(progress), leave=False, file=sys.stderr)


@contextlib.contextmanager
def status(message: str, progress: bool) -> Iterator[None]:
    """`ignis: MESSAGE...` on stderr while the block runs, completed with the time it took."""
    if not enabled(progress):
        yield
        return
    print(f"ignis: {message}...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        print(file=sys.stderr, flush=True)      # leave the line whole for the error after it
        raise
    print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
