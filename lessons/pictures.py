"""Pictures in a lesson: a matplotlib figure or a picture file attnlab wrote, shown as a PNG output.

A PNG output shows the same in Jupyter, in the executed notebook and on the documentation site,
whatever matplotlib backend the kernel ended up with."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import Image, display


def show(fig=None) -> None:
    """Show `fig` (default: the current figure) as a PNG and close it."""
    fig = fig or plt.gcf()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    display(Image(buffer.getvalue()))


def show_file(path: str | Path) -> None:
    """Show a picture file (attnlab's drawing functions write them)."""
    display(Image(filename=str(path)))
