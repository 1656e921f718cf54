"""Alignment pictures: where each target token looked in the source.

For a Transformer, the cross-attention of every decoder layer and head (and each layer's mean
over heads); for the RNN with Bahdanau attention, its single alignment matrix, as in figure 3
of Bahdanau et al. (2015). Target tokens run down, source tokens across.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from attnlab.engine.rundir import atomic_write


def plot_alignment(
    weights: np.ndarray,
    src: list[str],
    tgt: list[str],
    path: Path,
    title: str = "",
    first_layer: int = 1,
    heads: list[int] | None = None,
) -> None:
    """weights (L, H, T, S): one panel per layer and head, plus a mean-over-heads column when H > 1.
    Any attention matrix reads the same way: queries (tgt) down, keys (src) across; a causal
    mask's zeros leave the upper triangle blank. first_layer and heads: the numbers shown in the
    titles when weights is a selection (e.g. layer 3 alone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = np.asarray(weights, dtype=float)
    n_layer, n_head, t, s = w.shape
    chosen = heads is not None  # a head the user picked, rather than a one-head model (the RNN)
    heads = heads or list(range(1, n_head + 1))
    layer = [first_layer + i for i in range(n_layer)]
    panels = [[(w[i, h], f"layer {layer[i]} head {heads[h]}") for h in range(n_head)] for i in range(n_layer)]
    if n_head > 1:
        for i in range(n_layer):
            panels[i].append((w[i].mean(0), f"layer {layer[i]}: mean of heads"))
    if n_layer * n_head == 1:
        panels = [[(w[0, 0], f"layer {first_layer} head {heads[0]}" if chosen else "alignment")]]
    rows, cols = len(panels), len(panels[0])
    cell = max(2.6, 0.32 * max(s, t) + 1.2)
    fig, axes = plt.subplots(rows, cols, figsize=(cell * cols, cell * rows), squeeze=False)
    for i, row in enumerate(panels):
        for j, (m, name) in enumerate(row):
            ax = axes[i][j]
            ax.imshow(m, cmap="Greys", vmin=0, vmax=1, aspect="auto")
            ax.set_xticks(range(s), src, rotation=90, fontsize=7)
            ax.set_yticks(range(t), tgt, fontsize=7)
            ax.set_title(name, fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(title, int(11 * cell * cols))), fontsize=10)  # fits a narrow figure
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
