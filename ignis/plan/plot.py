"""Picture of a memory plan: instruction index across, arena offset up, one rectangle per buffer.

matplotlib is an optional extra; without it plot_plan raises PlotUnavailableError.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import IgnisError
from .arena import MemoryPlan


class PlotUnavailableError(IgnisError, ImportError):
    """matplotlib is not installed."""


def plot_plan(plan: MemoryPlan, path: str | Path, *, title: str | None = None) -> Path:
    """Draw `plan` into an image file (format from the suffix, e.g. .png); returns the path."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotUnavailableError("drawing the plan needs matplotlib: pip install matplotlib "
                                   "(or pip install 'ignis[plot]')") from None
    lv = plan.liveness
    n = len(lv.schedule)
    scale, unit = (1024.0, "KiB") if plan.arena_bytes < 4 << 20 else (1024.0 ** 2, "MiB")
    fig, ax = plt.subplots(figsize=(min(40, max(8, n / 12)), 5))
    cmap = plt.get_cmap("tab20")
    for b in lv.buffers:
        off = plan.offsets[b.values[0]]
        ax.add_patch(Rectangle((b.start - 0.45, off / scale), b.end - b.start + 0.9, b.size / scale,
                               facecolor=cmap(b.index % 20), edgecolor="black", linewidth=0.3))
    ax.axhline(plan.lower_bound / scale, color="red", linestyle="--", linewidth=0.8,
               label=f"lower bound {plan.lower_bound / scale:.1f} {unit}")
    ax.set_xlim(-1, n)
    ax.set_ylim(0, max(plan.arena_bytes, 1) / scale * 1.05)
    ax.set_xlabel("instruction")
    ax.set_ylabel(f"arena offset ({unit})")
    ax.set_title(title or f"arena {plan.arena_bytes / scale:.1f} {unit}, {len(lv.buffers)} buffers "
                          f"[{plan.strategy}], bounds {plan.bounds}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))       # instructions are whole numbers
    # outside the axes, to the right: inside, it hides whichever buffers sit in its corner
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
