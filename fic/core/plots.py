"""Figures as PNG files: matplotlib with the Agg backend (no display), written atomically.

Every figure FiC draws is built by a function that returns the `Figure` (tests read its axes
back) and saved here with `save_png`, through `fic.core.files.atomic_open`, so a reader (a
browser refreshing `curves.png` of a running job) never sees half a file.
"""

from __future__ import annotations

import io
import os
from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (imported on first use: it is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def save_png(fig: Any, path: str | os.PathLike, *, dpi: int = 110, close: bool = True) -> None:
    """Write `fig` to `path` atomically; close it unless told otherwise."""
    from fic.core.files import atomic_open

    data = png_bytes(fig, dpi)
    if close:
        pyplot().close(fig)
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def no_data(ax: Any, text: str) -> None:
    """Say in an empty panel why it is empty (the panel keeps its labels)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="0.4")


def integer_axis(ax: Any, axis: str = "x") -> None:
    """Whole-number ticks (steps, turns)."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))
