"""Patching's pictures: one heatmap per table measured, effects on a diverging scale (red: the patch
brings the clean answer back, blue: it pushes away from it).

    residual stream   layer x position, the positions' tokens along the x axis
    heads             layer x head (cross-attention's heads on their own panel)
    components        layer x component (attention out, cross out, MLP out, the whole residual)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.interpret.patching import Patching
from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

_COMPONENT_ORDER = ("attn_out", "cross_out", "mlp_out", "resid_pre")


def _panels(result: Patching) -> list[tuple[str, np.ndarray, list[str], str]]:
    """(title, (L, X) effects, x labels, x axis name) per panel."""
    out, stacks = [], list(dict.fromkeys(s.stack for s in result.sites))
    tables = result.tables()
    for stack in stacks:
        name = "" if stack == "blocks" else f"{stack} "
        for g, component, st in tables:
            if st != stack or g == "components":
                continue
            grid = result.grid(g, component, stack).numpy()
            if g == "resid":
                labels = result.labels.get(stack) or [str(t) for t in range(grid.shape[1])]
                out.append((f"{name}residual stream (resid_pre)", grid, labels[: grid.shape[1]], "position"))
            else:
                heads = [str(h + 1) for h in range(grid.shape[1])]
                out.append(
                    (f"{name}{'cross-attention ' if component == 'cross_head' else ''}heads", grid, heads, "head")
                )
        parts = [c for c in _COMPONENT_ORDER if ("components", c, stack) in tables]
        if parts:
            grid = np.concatenate([result.grid("components", c, stack).numpy() for c in parts], axis=1)
            out.append((f"{name}components", grid, parts, "component"))
    return out


def draw_patching(result: Patching, path: str | Path, title: str = "") -> Picture:
    """Every table of `result` as a heatmap, in one PNG or SVG (by the suffix of path)."""
    plt = pyplot()
    panels = _panels(result)
    finite = [np.abs(g[np.isfinite(g)]) for _, g, _, _ in panels]
    bound = max([float(f.max()) for f in finite if f.size] + [1e-9])
    # One panel a row: the residual stream's positions need the width, the others read as well stretched.
    heights = [0.32 * g.shape[0] + 1.5 for _, g, _, _ in panels]
    width = min(24.0, max(6.0, max(0.3 * g.shape[1] + 2.5 for _, g, _, _ in panels)))
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(width, sum(heights) + 0.6),
        dpi=110,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, (name, grid, labels, axis) in zip(axes.flat, panels):
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        ax.set_xticks(range(len(labels)), labels, rotation=90 if axis != "head" else 0, fontsize=7)
        ax.set_yticks(range(grid.shape[0]), [str(i + 1) for i in range(grid.shape[0])])
        ax.set_xlabel(axis)
        ax.set_ylabel("layer")
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    answer = result.answer
    head = f"{result.method} patching: {answer.get('metric', 'metric')} of {answer.get('target')!r}" + (
        f" vs {answer['wrong']!r}" if answer.get("wrong") is not None else ""
    )
    fig.suptitle(f"{title}\n{head}" if title else head, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
