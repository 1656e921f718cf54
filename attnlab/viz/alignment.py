"""Alignment pictures: where each target token looked in the source.

For a Transformer, the cross-attention of every decoder layer and head (and each layer's mean
over heads); for the RNN with Bahdanau attention, its single alignment matrix, as in figure 3
of Bahdanau et al. (2015). Target tokens run down, source tokens across.

Legend: L layers, H heads, T queries (rows), S keys (columns); sizes in inches unless named _px
or _pt. The panels sit in a grid sized from the token count, so a label is readable at 100% zoom.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

PER_TOKEN = 0.15  # panel inches per token when every token is labelled: a 7-8 pt label and a gap
MIN_SPACING = 0.13  # the closest two shown labels may be: a 7 pt line (0.097 in) plus air
PANEL = (1.8, 6.0)  # smallest and largest heatmap side: a title fits; a long input stays on screen
FLOOR = 0.6  # the side a panel may shrink to when a huge grid must fit under MAX_PX
LABEL_PT = (7.0, 9.0)  # token labels: never below 7 pt, the smallest size read without zooming
MAX_PX = 3000  # per side: bigger pictures are slow to open and get scaled down anyway
DPI = 110
MAX_COLS = 6
MAX_CHARS = 10  # a token label longer than this is cut, so one long piece cannot eat the panel
COLORBAR = 1.0  # width of the shared scale on the right
MIN_WIDTH = 5.0  # a one-panel figure still gives its title a few words a line


@dataclass
class Layout:
    """Where and how big everything is drawn; steps: label every k-th key (x) and query (y)."""

    rows: int
    cols: int
    panel_w: float
    panel_h: float
    step_x: int
    step_y: int
    label_pt: float
    width: float
    height: float
    dpi: int

    @property
    def title_pt(self) -> float:
        return self.label_pt + 1.5  # panel titles a step above the labels they name

    @property
    def suptitle_pt(self) -> float:
        return self.label_pt + 3


def grid_shape(n_layer: int, per_layer: int) -> tuple[int, int]:
    """(rows, cols) for n_layer x per_layer panels: one layer per row when that stays within
    MAX_COLS and at most 3:1 wide (a row then reads as one layer), else about sqrt(n) columns."""
    if per_layer <= MAX_COLS and per_layer <= 3 * n_layer:
        return n_layer, per_layer
    n = n_layer * per_layer
    cols = min(math.ceil(math.sqrt(n)), MAX_COLS)
    return math.ceil(n / cols), cols


def plan(n_layer: int, per_layer: int, t: int, s: int, longest: int) -> Layout:
    """Panel sizes from the token counts (t queries, s keys, longest label in characters), shrunk
    (panels first, dpi last) until the figure is at most MAX_PX a side; then the label steps and
    the font size that the final spacing allows."""
    rows, cols = grid_shape(n_layer, per_layer)
    pw, ph = (float(np.clip(PER_TOKEN * n, *PANEL)) for n in (s, t))
    labels = 0.6 * LABEL_PT[1] / 72 * min(longest, MAX_CHARS) + 0.15  # tick labels and ticks
    mx = labels + 0.15
    my = labels + 1.6 * (LABEL_PT[1] + 1.5) / 72 + 0.15  # and the panel title above
    extra_w, extra_h = COLORBAR, 1.0  # the colour scale; the figure title and the axis name
    limit = MAX_PX / DPI
    pw = max(min(pw, (limit - extra_w) / cols - mx), FLOOR)
    ph = max(min(ph, (limit - extra_h) / rows - my), FLOOR)
    width, height = max(cols * (pw + mx) + extra_w, MIN_WIDTH), rows * (ph + my) + extra_h
    dpi = min(DPI, int(MAX_PX / max(width, height)))  # only a grid too big even at FLOOR
    step_x, step_y = (max(1, math.ceil(MIN_SPACING * n / side)) for n, side in ((s, pw), (t, ph)))
    spacing = min(pw * step_x / s, ph * step_y / t)  # inches between two shown labels
    label_pt = float(np.clip(0.75 * 72 * spacing, *LABEL_PT))
    return Layout(rows, cols, pw, ph, step_x, step_y, label_pt, width, height, dpi)


def panels(w: np.ndarray, first_layer: int, heads: list[int] | None) -> list[tuple[np.ndarray, str]]:
    """Each layer's heads, then its mean of heads when H > 1, in reading order, with their titles."""
    n_layer, n_head = w.shape[:2]
    if n_layer * n_head == 1:  # one panel: a head the user picked, or a one-head model (the RNN)
        return [(w[0, 0], f"layer {first_layer} head {heads[0]}" if heads else "alignment")]
    heads = heads or list(range(1, n_head + 1))
    out = []
    for i in range(n_layer):
        out += [(w[i, h], f"layer {first_layer + i} head {heads[h]}") for h in range(n_head)]
        out += [(w[i].mean(0), f"layer {first_layer + i}: mean of heads")] if n_head > 1 else []
    return out


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def axis_name(name: str, step: int) -> str:
    return name if step == 1 else f"{name} (every {ordinal(step)} labelled)"


def short(label: str) -> str:
    return label if len(label) <= MAX_CHARS else label[: MAX_CHARS - 1] + "…"


def alignment_figure(
    weights: np.ndarray,
    src: list[str],
    tgt: list[str],
    title: str = "",
    first_layer: int = 1,
    heads: list[int] | None = None,
):
    """The matplotlib Figure that plot_alignment saves (see there); tests read its layout."""
    plt = pyplot()

    w = np.asarray(weights, dtype=float)
    n_layer, n_head, t, s = w.shape
    shown = panels(w, first_layer, heads)
    src, tgt = [short(x) for x in src], [short(x) for x in tgt]
    lay = plan(n_layer, len(shown) // n_layer, t, s, max(map(len, src + tgt), default=1))
    fig = plt.figure(figsize=(lay.width, lay.height), dpi=lay.dpi, layout="constrained")
    axes = fig.subplots(lay.rows, lay.cols, squeeze=False).ravel()
    for ax, (m, name) in zip(axes, shown):
        image = draw_panel(ax, m, src, tgt, name, lay)
    for ax in axes[len(shown) :]:  # the grid's empty places
        ax.set_axis_off()
    # one scale for all panels (vmin 0, vmax 1); aspect keeps the bar ~0.25 in wide on tall grids
    bar = fig.colorbar(image, ax=list(axes), shrink=0.8, pad=0.02, aspect=max(20, 3 * lay.height))
    bar.set_label("attention weight (same scale in every panel)", fontsize=lay.label_pt)
    bar.ax.tick_params(labelsize=lay.label_pt)
    fig.supxlabel(axis_name("keys", lay.step_x), fontsize=lay.title_pt)
    fig.supylabel(axis_name("queries", lay.step_y), fontsize=lay.title_pt)
    chars = int(lay.width * 72 / (0.55 * lay.suptitle_pt))  # average glyph ~0.55 em wide
    fig.suptitle("\n".join(textwrap.wrap(title, max(chars, 20))), fontsize=lay.suptitle_pt)
    return fig


def draw_panel(ax, m: np.ndarray, src: list[str], tgt: list[str], name: str, lay: Layout):
    """One heatmap: keys across, queries down, every step-th token labelled."""
    image = ax.imshow(m, cmap="Greys", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    xs, ys = range(0, len(src), lay.step_x), range(0, len(tgt), lay.step_y)
    ax.set_xticks(xs, [src[i] for i in xs], rotation=90, fontsize=lay.label_pt)
    ax.set_yticks(ys, [tgt[i] for i in ys], fontsize=lay.label_pt)
    ax.set_title(name, fontsize=lay.title_pt)
    return image


def plot_alignment(
    weights: np.ndarray,
    src: list[str],
    tgt: list[str],
    path: Path,
    title: str = "",
    first_layer: int = 1,
    heads: list[int] | None = None,
) -> Picture:
    """weights (L, H, T, S): one panel per layer and head, plus each layer's mean of heads when
    H > 1, in a grid (a layer per row when that stays landscape). Any attention matrix reads the
    same way: queries (tgt) down, keys (src) across; a causal mask's zeros leave the upper triangle
    blank. first_layer and heads: the numbers shown in the titles when weights is a selection (e.g.
    layer 3 alone). The format follows the path: .svg, .json or PNG (viz/figures.py)."""
    fig = alignment_figure(weights, src, tgt, title, first_layer, heads)
    return save_figure(fig, path, dpi=fig.dpi)  # the dpi its layout chose to stay under the pixel cap
