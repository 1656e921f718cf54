"""Training curves from a run's metrics.jsonl: the losses, and the learning rate as run."""

from __future__ import annotations

import io
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


def draw_losses(ax, rows: list[dict], color: str = "tab:blue", val_color: str = "tab:orange", label: str = "") -> None:
    """Onto `ax`: the train loss of metrics.jsonl's rows (light, every step, and a running mean) and
    the validation loss (points); `label` names the run when several share the axes."""
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if train:
        steps, losses = zip(*train)
        ax.plot(steps, losses, color=color, alpha=0.25, lw=0.8)
        mean = running_mean(losses, max(1, len(losses) // 50))
        ax.plot(steps, mean, color=color, label=f"{label} train" if label else "train")
    if val:
        ax.plot(
            *zip(*val),
            "o--" if label else "o-",
            color=val_color,
            ms=3 if label else 6,
            label=f"{label} validation" if label else "validation",
        )


def loss_figure(curves: dict[str, list[dict]], title: str = ""):
    """A figure of one run's losses (one entry, named "") or several runs' together, each its own colour."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rows) in enumerate(curves.items()):
        if len(curves) == 1 and not name:
            draw_losses(ax, rows)
        else:  # a run's train and validation curves share its colour
            c = colours[i % len(colours)]
            draw_losses(ax, rows, c, c, name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_lines():  # a run stopped before its first step has no curve: matplotlib would warn of no labels
        ax.legend(fontsize=8 if len(curves) > 1 else None)
    fig.tight_layout()
    return fig


def plot_loss(metrics: Path, out: Path) -> None:
    """Train loss (light, every step, and a running mean) and validation loss (points)."""
    fig = loss_figure({"": read_metrics(metrics)})
    save_figure(fig, out, dpi=fig.dpi)


def plot_runs(curves: dict[str, list[dict]], out: Path) -> None:
    """Several runs' train and validation losses on one picture ({name: metrics.jsonl rows})."""
    fig = loss_figure(curves)
    save_figure(fig, out, dpi=fig.dpi)


def loss_png(rows: list[dict], title: str = "", dpi: int = 80) -> bytes:
    """One run's losses as PNG bytes (a notebook's live picture: small, nothing written to disk)."""
    fig = loss_figure({"": rows}, title)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        pyplot().close(fig)
    return buf.getvalue()


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
