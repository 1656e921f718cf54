"""Training curves from a run's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.engine.rundir import read_metrics
from attnlab.viz.figures import save_figure


def running_mean(values, k: int) -> np.ndarray:
    """Mean of each value and the k - 1 before it (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])  # c[i] = sum(values[:i])
    i = np.arange(len(values))
    n = np.minimum(i + 1, k)
    return (c[i + 1] - c[i + 1 - n]) / n


def plot_loss(metrics: Path, out: Path) -> None:
    """Train loss (light, every step, and a running mean) and validation loss (points)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        steps, losses = zip(*train)
        ax.plot(steps, losses, color="tab:blue", alpha=0.25, lw=0.8)
        ax.plot(steps, running_mean(losses, max(1, len(losses) // 50)), color="tab:blue", label="train")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=fig.dpi)
