"""Tables of vectors drawn: a position table and its cosine similarities, token embeddings on their
first two principal components.

Shapes: N positions, D model width, V vocabulary (embedding rows), K principal components.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

DIVERGING = "RdBu_r"  # blue below 0, white at 0, red above: the sign of a value reads at a glance


def plot_positions(table: np.ndarray, label: str, out: Path) -> Picture:
    """Left: the table (N, D), position down and dimension across, on a colour scale centred at 0.
    Right: the cosine similarity of every pair of positions (N, N); for sinusoidal tables it
    falls off with the distance between positions, the same for every starting position."""
    table = np.asarray(table, dtype=float)
    n, d = table.shape
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), dpi=110, width_ratios=(1.2, 1))
    top = float(np.abs(table).max()) or 1.0  # symmetric limits: white is exactly 0
    im = left.imshow(table, cmap=DIVERGING, vmin=-top, vmax=top, aspect="auto")
    left.set(xlabel="dimension", ylabel="position", title=f"{label}: {n} x {d}")
    fig.colorbar(im, ax=left, shrink=0.85)
    im = right.imshow(_cosine_similarity(table), cmap=DIVERGING, vmin=-1, vmax=1)
    right.set(xlabel="position", ylabel="position", title="cosine similarity between positions")
    fig.colorbar(im, ax=right, shrink=0.85)
    fig.tight_layout()
    return save_figure(fig, Path(out))


def _cosine_similarity(table: np.ndarray) -> np.ndarray:
    """(N, D) -> (N, N): cos of the angle between rows; 0 for a zero row (the ViT's [CLS])."""
    norm = np.linalg.norm(table, axis=1, keepdims=True)  # (N, 1)
    unit = table / np.where(norm > 0, norm, 1.0)
    return unit @ unit.T


def embedding_pca(weights: np.ndarray, k: int = 2) -> np.ndarray:
    """Principal component analysis of the rows of weights (V, D): their coordinates (V, K) along
    the K directions of largest variance around the mean row, largest first.

    The SVD of the centred rows X = U S V^T gives the directions as the rows of V^T (the
    eigenvectors of the covariance X^T X / (V - 1)); the coordinates are X V. A direction and its
    negative are equally valid, so each is turned to make its largest-magnitude entry positive:
    the same weights always give the same picture."""
    x = np.asarray(weights, dtype=np.float64)
    if x.ndim != 2 or not 1 <= k <= min(x.shape):
        raise ValueError(f"need a (V, D) matrix with at least {k} rows and columns, got shape {x.shape}")
    x = x - x.mean(axis=0)  # (V, D) centred
    _, _, vt = np.linalg.svd(x, full_matrices=False)  # vt: (min(V, D), D), by falling singular value
    components = vt[:k]  # (K, D)
    biggest = np.abs(components).argmax(axis=1)  # (K,)
    components = components * np.sign(components[np.arange(k), biggest])[:, None]
    return x @ components.T  # (V, K)


def plot_embeddings(points: np.ndarray, labels: list[str], out: Path, title: str) -> Picture:
    """Scatter of points (V, >= 2) on their first two coordinates; labels has one string per point,
    written next to it ("" leaves a point as a small grey dot)."""
    points = np.asarray(points, dtype=float)
    if points.ndim != 2 or points.shape[1] < 2:
        raise ValueError(f"points should be (V, 2) or wider, got shape {points.shape}")
    if len(labels) != len(points):
        raise ValueError(f"{len(labels)} labels for {len(points)} points: give one per point ('' for none)")
    named = np.array([bool(s) for s in labels], dtype=bool)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 7), dpi=110)
    ax.scatter(points[~named, 0], points[~named, 1], s=5, color="0.75", linewidths=0)
    ax.scatter(points[named, 0], points[named, 1], s=12, color="tab:blue", linewidths=0)
    for (x, y), text in zip(points[named], (s for s in labels if s)):
        # parse_math=False: a token such as "$x$" is text, not a formula.
        ax.annotate(text, (x, y), xytext=(3, 2), textcoords="offset points", fontsize=8, parse_math=False)
    ax.axhline(0, color="0.85", lw=0.8, zorder=0)
    ax.axvline(0, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("principal component 1")
    ax.set_ylabel("principal component 2")
    ax.set_title(title, fontsize=10, parse_math=False)
    fig.tight_layout()
    return save_figure(fig, Path(out))
