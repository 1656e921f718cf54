"""Vision Transformer pictures: where [CLS] looked among the patches, and a grid of predictions.

Shapes: L layers, H heads, T = 1 + gh * gw tokens ([CLS] first), gh x gw patch grid, C channels, N images.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure

Panel = tuple[np.ndarray | None, str]  # a (gh, gw) heat map (None: the image alone) and its title
MAX_LABELLED = 16  # grids up to 4 x 4 get each patch's weight written on it
CELL = 1.8  # inches per panel: an 8x8 digit still shows its pixels and its patch blocks
HEAT = dict(cmap="viridis", alpha=0.5, interpolation="nearest")  # see-through, one flat block per patch


def _show_image(ax, image: np.ndarray) -> tuple[int, int]:
    """Draw (C, H, W) in [0, 1] pixel for pixel, in grey for one channel; return (H, W)."""
    image = np.clip(np.asarray(image, dtype=float), 0, 1)
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"an image should be (C, H, W) with C = 1 or 3; got shape {image.shape}")
    h, w = image.shape[1:]
    shown = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)  # (H, W) or (H, W, 3)
    ax.imshow(shown, cmap="gray", vmin=0, vmax=1, interpolation="nearest", extent=(0, w, h, 0))
    ax.set_xticks([])
    ax.set_yticks([])
    return h, w


def _overlay(ax, heat: np.ndarray, size: tuple[int, int], vmax: float) -> None:
    """Lay a (gh, gw) map over the image so block (r, c) covers exactly the pixels of patch (r, c).

    Patches are P x P with P = H // gh; pixels past gh * P (which a ViT drops) stay uncovered. Every
    panel shares one scale (0 to the largest weight in the figure), so heads can be compared; with
    few patches each block also shows its weight, which colour alone conveys poorly.
    """
    h, w = size
    gh, gw = heat.shape
    ph, pw = h // gh, w // gw
    ax.imshow(heat, vmin=0, vmax=max(vmax, 1e-12), extent=(0, gw * pw, gh * ph, 0), **HEAT)
    if gh * gw <= MAX_LABELLED:
        for (r, c), value in np.ndenumerate(heat):
            ax.text(
                (c + 0.5) * pw,
                (r + 0.5) * ph,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
                bbox=dict(boxstyle="round,pad=0.15", fc="black", alpha=0.5, lw=0),
            )
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)


def _title(fig, title: str, cols: int) -> None:
    fig.suptitle("\n".join(textwrap.wrap(title, int(11 * CELL * cols))), fontsize=10)  # fits a narrow figure


def _save(fig, path: Path) -> None:
    save_figure(fig, path)


def draw_patch_panels(image: np.ndarray, rows: list[list[Panel]], path: Path, title: str = "") -> None:
    """One picture of where [CLS] looked: image (C, H, W) in [0, 1] under rows of panels, each a
    (gh, gw) map (None: the image alone) drawn as a see-through block per patch over the image."""
    plt = pyplot()
    vmax = max(float(heat.max()) for row in rows for heat, _ in row if heat is not None)
    cols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(CELL * cols, CELL * len(rows)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)  # shown again when a panel lands on it
    for i, row in enumerate(rows):
        for j, (heat, name) in enumerate(row):
            ax = axes[i][j]
            ax.set_visible(True)
            size = _show_image(ax, image)
            if heat is not None:
                _overlay(ax, heat, size, vmax)
            ax.set_title(name, fontsize=8)
    _title(fig, title, cols)
    note = "colour: the share of [CLS]'s attention on each patch (the rest is on [CLS] itself), one scale for all"
    fig.text(0.5, 0.002, note, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    _save(fig, path)


def grid_title(true, pred, title: str = "") -> str:
    """The overall title with how many of these predictions are right, e.g. "digits — 38/40 right"."""
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predictions; pass one of each per image")
    right = sum(str(t) == str(p) for t, p in zip(true, pred))
    count = f"{right}/{len(true)} right"
    return f"{title} — {count}" if title else count


def _label(t, p, prob: float | None) -> str:
    return f"pred {p} (true {t})" if prob is None else f"pred {p} {prob:.0%} (true {t})"


def plot_prediction_grid(
    images: np.ndarray,
    true: list[str] | np.ndarray,
    pred: list[str] | np.ndarray,
    path: Path,
    title: str = "",
    probs: np.ndarray | None = None,
    max_images: int = 40,
) -> None:
    """Test images (N, C, H, W) in [0, 1], each titled with its prediction, green when right, red when wrong.

    probs: (N,) the probability of each prediction, or (N, K) class probabilities whose max is shown.
    Draws the first max_images, 8 per row; the overall title counts the right ones among those drawn.
    """
    plt = pyplot()

    n = min(len(images), max_images)
    if n == 0:
        raise ValueError("no images to draw; pass at least one image and max_images >= 1")
    true, pred = list(true)[:n], list(pred)[:n]
    shown = None if probs is None else np.asarray(probs, dtype=float)[:n]
    if shown is not None and shown.ndim == 2:
        shown = shown.max(1)  # the predicted class is the most probable one
    cols = min(8, n)
    rows = -(-n // cols)  # ceil
    fig, axes = plt.subplots(rows, cols, figsize=(CELL * cols, CELL * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.set_visible(False)
            continue
        _show_image(ax, images[k])
        colour = "green" if str(true[k]) == str(pred[k]) else "red"
        ax.set_title(_label(true[k], pred[k], None if shown is None else shown[k]), fontsize=8, color=colour)
    _title(fig, grid_title(true, pred, title), cols)
    fig.tight_layout()
    _save(fig, path)
