"""Where each word of a caption looked: the image under each word's cross-attention, as in figure 3
of Show, Attend and Tell (Xu et al., 2015).

Legend: L layers, H heads, T words (the last one </s>), N = gh * gw patches of P x P pixels.

One column per generated word; one row per decoder layer (the mean of its heads) and, below it,
one row per head. A panel is the image in grey with the word's attention over the patches laid
on it in red, each patch's weight spread over its P x P pixels and scaled to the panel's largest,
so where the word looked stands out even when the weights are spread thin.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from attnlab.io import atomic_write
from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.html import page, script_json, static_text


def upsample(weights: np.ndarray, grid: tuple[int, int], patch: tuple[int, int]) -> np.ndarray:
    """(N,) patch weights -> (gh * Ph, gw * Pw) pixels, each patch's weight over its Ph x Pw cell."""
    return np.kron(np.asarray(weights, dtype=float).reshape(grid), np.ones(patch))


def panels(weights: np.ndarray, heads: bool = True) -> list[tuple[str, np.ndarray]]:
    """(L, H, T, N) -> [(row name, (T, N))]: each layer's mean of heads, then its heads."""
    rows = []
    n_layer, n_head = weights.shape[:2]
    for layer in range(n_layer):
        rows.append((f"layer {layer + 1}" + (": mean of heads" if n_head > 1 else ""), weights[layer].mean(0)))
        if heads and n_head > 1:
            rows += [(f"layer {layer + 1} head {h + 1}", weights[layer, h]) for h in range(n_head)]
    return rows


def plot_caption_attention(
    image: np.ndarray,
    words: list[str],
    weights: np.ndarray,
    grid: tuple[int, int],
    path: str | Path,
    title: str = "",
    heads: bool = True,
) -> None:
    """image (C, H, W) in [0, 1], words (T,), weights (L, H, T, N): see the module docstring."""
    plt = pyplot()

    gray = np.asarray(image, dtype=float).mean(0)  # (H, W)
    patch = gray.shape[0] // grid[0], gray.shape[1] // grid[1]
    rows = panels(np.asarray(weights, dtype=float), heads)
    aspect = gray.shape[1] / gray.shape[0]
    w_in = min(3.2, max(1.2, 0.25 * aspect + 0.8))  # a wide strip gets a wide panel
    fig, axes = plt.subplots(
        len(rows),
        len(words),
        figsize=(w_in * len(words) + 1.2, (w_in / aspect + 0.35) * len(rows) + 0.6),
        squeeze=False,
        dpi=110,
    )
    for r, (name, table) in enumerate(rows):
        for t, word in enumerate(words):
            ax = axes[r][t]
            heat = upsample(table[t], grid, patch)
            ax.imshow(gray, cmap="gray_r", vmin=0, vmax=1)
            ax.imshow(heat / max(heat.max(), 1e-9), cmap="Reds", alpha=0.55, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(word, fontsize=10)
            if t == 0:
                ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def caption_json(
    image: np.ndarray, words: list[str], weights: np.ndarray, grid: tuple[int, int], title: str = ""
) -> dict:
    """What the caption page and the explorer draw: the image in grey, one byte per pixel (255 =
    the image's brightest), the words and their attention (L, H, T, N) to 4 decimals."""
    gray = np.asarray(image, dtype=float).mean(0)  # (H, W)
    u8 = np.round(255 * gray / max(gray.max(), 1e-9)).astype(np.uint8)
    return {
        "title": title,
        "height": int(u8.shape[0]),
        "width": int(u8.shape[1]),
        "grid": list(grid),
        "pixels": base64.b64encode(u8.tobytes()).decode("ascii"),
        "words": list(words),
        "weights": np.round(np.asarray(weights, dtype=float), 4).tolist(),
    }


def write_caption_html(
    image: np.ndarray, words: list[str], weights: np.ndarray, grid: tuple[int, int], path: str | Path, title: str = ""
) -> None:
    """A page of its own (no network): the caption's words; hover one to see the image under its
    attention, a layer and a head (or their mean) chosen from selects; play moves the attention word
    by word; below, a small panel per head and word of the chosen layer, as the PNG has."""

    parts = {
        "TITLE": html.escape(title or "caption"),
        "STYLE": static_text("page.css") + static_text("caption.css"),
        "DATA": script_json(caption_json(image, words, weights, grid, title)),
        "SCRIPT": static_text("caption.js"),
    }
    text = page("caption.html", parts)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))
