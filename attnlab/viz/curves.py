"""Training curves from a run's metrics.jsonl: the losses, and the learning rate as run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.io import read_metrics
from attnlab.viz.figures import pyplot, save_figure


def running_mean(values, k: int) -> np.ndarray:
    """Mean of each value and the k - 1 before it (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])  # c[i] = sum(values[:i])
    i = np.arange(len(values))
    n = np.minimum(i + 1, k)
    return (c[i + 1] - c[i + 1 - n]) / n


def plot_loss(metrics: Path, out: Path) -> None:
    """Train loss (light, every step, and a running mean) and validation loss (points)."""
    plt = pyplot()
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
    if train or val:  # a run stopped before its first step has no curve: matplotlib would warn of no labels
        ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=fig.dpi)


def learning_rates(metrics: Path) -> tuple[list[int], list[float]]:
    rows = [(r["step"], r["lr"]) for r in read_metrics(metrics) if "lr" in r and "step" in r]
    if not rows:
        raise AttnlabError(f"{metrics} has no learning rate logged: train the run for a few steps first")
    steps, lrs = zip(*rows)
    return list(steps), list(lrs)


def plot_lr(metrics: Path, out: Path) -> None:
    """The learning rate of every logged step (metrics.jsonl rows {"step", "lr"}): warmup, then decay."""
    steps, lrs = learning_rates(Path(metrics))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, lrs, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, Path(out))
