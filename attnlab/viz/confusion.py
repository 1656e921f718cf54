"""Confusion matrix and model-comparison pictures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture


def plot_confusion(m: np.ndarray, labels: list[str], path: Path, title: str = "") -> Picture:
    """Rows: true class, columns: predicted; cells show counts, colour shows the row's share."""
    plt = pyplot()

    m = np.asarray(m)
    share = m / np.maximum(m.sum(1, keepdims=True), 1)
    size = max(4.0, 0.5 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, str(m[i, j]), ha="center", va="center", color="white" if share[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, label="share of the true class")
    ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


CLASSIFY_BARS = (("accuracy", "accuracy", 1.0), ("macro_f1", "macro-F1", 1.0))


def plot_comparison(rows: list[dict], path: Path, title: str, bars: tuple = CLASSIFY_BARS) -> Picture:
    """Bars of test scores per model; bars: (key, label, scale) per score, value / scale drawn in [0, 1]."""
    plt = pyplot()

    names = [r["model"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2, 4))
    width = 0.76 / len(bars)
    for k, (key, label, scale) in enumerate(bars):
        values = [r[key] / scale for r in rows]
        drawn = ax.bar(x + (k - (len(bars) - 1) / 2) * width, values, width, label=label)
        ax.bar_label(drawn, [f"{v:.2%}" for v in values], fontsize=7, rotation=90 if len(bars) > 2 else 0, padding=2)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.25 if len(bars) > 2 else 1.08)
    ax.set_ylabel("test score")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return save_figure(fig, path)
