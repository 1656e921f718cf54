"""Per-head numbers as layers x heads heatmaps: detector scores, the loss change of head ablation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from torch import Tensor

from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture


def plot_head_tables(tables: dict[str, Tensor], path: str | Path, title: str, diverging: bool = False) -> Picture:
    """One (L, H) heatmap per table, side by side, each cell labelled with its value (PNG or SVG)."""
    plt = pyplot()

    n = len(tables)
    L, H = next(iter(tables.values())).shape
    fig, axes = plt.subplots(
        1, n, figsize=(max(3.2, 0.7 * H + 1.6) * n, max(2.6, 0.5 * L + 1.4)), dpi=110, squeeze=False
    )
    for ax, (name, table) in zip(axes[0], tables.items()):
        values = table.float().numpy()
        bound = max(float(np.nanmax(np.abs(values))), 1e-9) if diverging else 1.0
        if diverging:
            im = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        else:
            im = ax.imshow(values, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for layer in range(L):
            for head in range(H):
                v = values[layer, head]
                dark = abs(v) / bound > 0.6 if diverging else v < 0.6  # viridis is dark at the bottom
                colour = "white" if dark else "black"
                ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(H), [str(h + 1) for h in range(H)])  # heads from 1, as --remove names them
        ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(name, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    width = fig.get_figwidth()
    fig.suptitle("\n".join(textwrap.wrap(title, max(30, int(width * 11)))), fontsize=10)  # ~11 characters an inch
    fig.tight_layout()
    return save_figure(fig, path)
