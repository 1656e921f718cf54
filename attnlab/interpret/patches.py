"""Where a Vision Transformer's [CLS] looked among the patches: the maps per layer and head, and the
rollout through all layers, laid out as the patches lie over the image (drawn by viz/patches.py).

Shapes: L layers, H heads, T = 1 + gh * gw tokens ([CLS] first), gh x gw patch grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.interpret.rollout import rollout as attention_rollout  # the one rollout, shared by every family
from attnlab.interpret.rollout import stack_layers
from attnlab.viz.patches import Panel, draw_patch_panels


def _check_grid(t: int, grid: tuple[int, int]) -> tuple[int, int]:
    gh, gw = grid
    if t != 1 + gh * gw:
        raise ValueError(f"attention over {t} tokens does not fit a {gh}x{gw} patch grid plus [CLS]; check grid")
    return gh, gw


def cls_maps(weights, grid: tuple[int, int]) -> np.ndarray:
    """[CLS]'s attention to each patch, per layer and head, laid out as the patches lie: (L, H, gh, gw)."""
    w = stack_layers(weights)
    gh, gw = _check_grid(w.shape[-1], grid)
    return w[:, :, 0, 1:].reshape(w.shape[0], w.shape[1], gh, gw)  # patch k at (k // gw, k % gw)


def patch_panels(weights, grid: tuple[int, int], residual: float = 0.5) -> list[list[Panel]]:
    """The rows plot_patch_attention draws, apart from drawing, so they can be checked.

    One row per layer (each head, then the mean of the heads); a last row with the image alone, the
    rollout and the last layer's mean, so the rollout can be set against the last layer it grew from.
    """
    w = stack_layers(weights)
    maps = cls_maps(w, grid)  # (L, H, gh, gw)
    n_layer, n_head = maps.shape[:2]
    rows = []
    for i in range(n_layer):
        row = [(maps[i, h], f"layer {i + 1} head {h + 1}") for h in range(n_head)]
        rows.append(row + [(maps[i].mean(0), f"layer {i + 1}: mean of heads")])
    rollout = attention_rollout(w, residual)[0, 1:].reshape(grid)  # (gh, gw)
    rows.append([(None, "image"), (rollout, "rollout"), (maps[-1].mean(0), f"layer {n_layer}: mean of heads")])
    return rows


def plot_patch_attention(image: np.ndarray, weights, grid: tuple[int, int], path: Path, title: str = "") -> None:
    """One picture of where [CLS] looked: image (C, H, W) in [0, 1], weights L arrays (H, T, T) for this image.

    A row per layer (each head and their mean), then the image alone, the rollout and the last layer's
    mean, each map a see-through block per patch over the image.
    """
    draw_patch_panels(image, patch_panels(weights, grid), path, title)
