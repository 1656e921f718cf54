"""Every picture attnlab draws is saved here, in the format its name asks for:

  .svg   vector, text kept as text (a paper's editor can restyle it, search finds it)
  .json  the numbers behind the picture: per panel its title and axis labels, tick labels, each
         line's x and y, each image's array (heatmaps), each scatter's points, each text label
  else   PNG

So `attnlab plot`, `attention`, `inspect`, `vectors --plot`, `eval --confusion`, ... all write all
three from one code path. Writes are atomic (a reader never sees half a file).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np

from attnlab.io import atomic_write
from attnlab.viz.picture import Picture

DPI = 110


def _values(a) -> list:
    """An array as nested lists, masked or non-finite cells as null (JSON has no NaN)."""
    a = np.ma.asarray(a, dtype=float)
    filled = a.filled(np.nan)
    return np.where(np.isfinite(filled), filled, None).tolist()


def _panel(ax) -> dict:
    ticks = lambda labels: [t.get_text() for t in labels] if any(t.get_text() for t in labels) else None
    lines = [
        {
            "label": None if line.get_label().startswith("_") else line.get_label(),
            "x": _values(line.get_xdata()),
            "y": _values(line.get_ydata()),
        }
        for line in ax.get_lines()
    ]
    points = [_values(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets") and len(c.get_offsets())]
    out = {
        "title": ax.get_title(),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "xticks": ticks(ax.get_xticklabels()),
        "yticks": ticks(ax.get_yticklabels()),
        "lines": lines,
        "images": [_values(im.get_array()) for im in ax.get_images()],
        "points": points,
        "texts": [
            {"x": float(t.get_position()[0]), "y": float(t.get_position()[1]), "text": t.get_text()} for t in ax.texts
        ],
    }
    return {k: v for k, v in out.items() if v not in (None, [], "")}


def figure_json(fig) -> dict:
    """The numbers of a matplotlib figure (colour bars left out: their scale is in the images)."""
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    panels = [_panel(ax) for ax in fig.axes if ax.get_label() != "<colorbar>"]
    return {"title": title, "panels": [p for p in panels if len(p) > 1 or p.get("title")]}


def pyplot() -> ModuleType:
    """matplotlib's pyplot, drawing to files only (the Agg backend: no window), imported on first use."""
    import matplotlib.pyplot as plt  # matplotlib: 1 s to import, paid only by what draws

    if "inline" not in plt.get_backend():  # a notebook's inline backend draws to files too: switching would
        plt.matplotlib.use("Agg")  # leave every later plt.show() of the notebook blank
    return plt


def save_figure(fig, path: str | Path, dpi: float = DPI) -> Picture:
    """Write `fig` to path as SVG, JSON or PNG by its suffix, then close it. Returns the Picture
    written, which a notebook shows (the drawing functions return it too)."""
    plt = pyplot()
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            text = json.dumps(figure_json(fig), ensure_ascii=False)
            atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
            return Picture(path)  # the numbers: a file, nothing to show
        fmt = "svg" if suffix == ".svg" else "png"
        with warnings.catch_warnings(), plt.rc_context({"svg.fonttype": "none"}):
            # A token in a script the font lacks draws as a box; one warning per glyph would bury the output.
            warnings.filterwarnings("ignore", message="Glyph .* missing from")
            atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=dpi))
    finally:
        plt.close(fig)
    return Picture(path)
