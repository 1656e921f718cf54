"""The recipe chart of `attnlab compare --task lm`: held-out loss per recipe, lower is better."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

SERIES = (("loss", "held-out split of the training corpus"), ("other_loss", "a corpus never trained on (pip)"))


def plot_recipes(rows: list[dict], path: Path, title: str) -> Picture:
    """Horizontal bars of each recipe's losses, the axis zoomed to where they differ, with a dashed
    line at the full fast recipe's loss so that each ablation reads as its distance from it."""
    plt = pyplot()

    series = [(key, label) for key, label in SERIES if all(r.get(key) is not None for r in rows)]
    y = np.arange(len(rows))[::-1]  # first recipe on top
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) * len(series) + 1.6))
    values = [r[key] for r in rows for key, _ in series]
    lo, hi = min(values), max(values)
    for k, (key, label) in enumerate(series):
        drawn = ax.barh(y + (len(series) - 1 - 2 * k) * height / 2, [r[key] for r in rows], height, label=label)
        ax.bar_label(drawn, [f"{r[key]:.3f}" for r in rows], fontsize=7, padding=2)
    fast = next((r for r in rows if r.get("vs_fast") == 0), None)
    if fast is not None:
        ax.axvline(fast["loss"], color="gray", linestyle="--", linewidth=1)
    ax.set_xlim(lo - 0.6 * (hi - lo) - 0.02, hi + 0.25 * (hi - lo) + 0.02)
    ax.set_yticks(y, [f"{r['recipe']} ({r['steps']:,} steps)" for r in rows])
    ax.set_xlabel("loss, nats per token (lower is better)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
