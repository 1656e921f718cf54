"""Pictures of a mixture of experts: which expert each token went to, and the experts' load over training.

Shapes: L MoE layers, T tokens, E experts, k experts per token.

    routing = Routing(tokens, experts, gates, n)  # interpret/experts.py routes a run's text
    plot_routing(routing, Path("experts.png"))      # the text once per layer, each token on its expert's colour
    plot_expert_load(Path("runs/moe/metrics.jsonl"), Path("load.png"))   # each layer's load against the step
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.io import read_metrics
from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

WRAP = 64  # characters per line of drawn text
CHAR = 0.095  # inches per character: a 9-point monospace glyph and a little room


@dataclass
class Routing:
    tokens: list[str]  # T token texts
    experts: np.ndarray  # (L, T, k) expert ids, best first
    gates: np.ndarray  # (L, T, k) their renormalised gates
    n_experts: int


def _lines(tokens: list[str]) -> list[list[tuple[int, str]]]:
    """Tokens laid out in lines of about WRAP characters, breaking at newlines: (index, text) each."""
    lines, line, width = [], [], 0
    for i, tok in enumerate(tokens):
        shown = tok.replace("\n", "↵").replace("\t", "→")
        if line and width + len(shown) > WRAP:
            lines.append(line)
            line, width = [], 0
        line.append((i, shown))
        width += len(shown)
        if "\n" in tok:
            lines.append(line)
            line, width = [], 0
    return lines + ([line] if line else [])


def plot_routing(r: Routing, out: Path) -> Picture:
    """One panel per MoE layer: the text, each token on the colour of its first-choice expert, with
    a lighter shade the smaller that expert's gate."""
    plt = pyplot()
    colours = plt.get_cmap("tab10" if r.n_experts <= 10 else "tab20")
    lines = _lines(r.tokens)
    n_layers = r.experts.shape[0]
    width = CHAR * max(sum(len(t) for _, t in line) for line in lines) + 0.8
    fig, axes = plt.subplots(
        n_layers, 1, figsize=(max(width, 4.5), (0.24 * len(lines) + 0.45) * n_layers + 0.5), squeeze=False
    )
    for layer, ax in enumerate(axes[:, 0]):
        ax.set_axis_off()
        ax.set_xlim(-0.5, (width - 0.8) / CHAR + 0.5)
        ax.set_ylim(len(lines), -0.8)
        ax.set_title(f"layer {layer + 1}: first-choice expert of each token", fontsize=9, loc="left")
        for row, line in enumerate(lines):
            x = 0.0
            for i, shown in line:
                e, gate = int(r.experts[layer, i, 0]), float(r.gates[layer, i, 0])
                ax.text(
                    x,
                    row,
                    shown,
                    family="monospace",
                    fontsize=9,
                    va="center",
                    bbox=dict(boxstyle="square,pad=0.1", lw=0, fc=colours(e), alpha=0.3 + 0.7 * gate),
                )
                x += len(shown)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=colours(e)) for e in range(r.n_experts)]
    fig.legend(
        handles,
        [f"expert {e}" for e in range(r.n_experts)],
        loc="lower center",
        ncol=min(r.n_experts, 8),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save_figure(fig, out)


def plot_expert_load(metrics: Path, out: Path) -> str:
    """Each layer's share of tokens per expert against the training step, from metrics.jsonl's
    expert_load rows (written at every evaluation); returns a one-line description."""
    rows = [r for r in read_metrics(metrics) if "expert_load" in r]
    if not rows:
        raise AttnlabError(f"{metrics} has no expert_load rows: the run has no mixture-of-experts layers")
    steps = [r["step"] for r in rows]
    load = np.array([r["expert_load"] for r in rows])  # (S, L, E)
    plt = pyplot()
    n_layers, n_experts = load.shape[1:]
    fig, axes = plt.subplots(1, n_layers, figsize=(3.2 * n_layers, 3), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        ax.stackplot(steps, load[:, layer].T, labels=[f"expert {e}" for e in range(n_experts)], alpha=0.85)
        ax.axhline(0.5, color="white", lw=0.5)
        ax.set_title(f"layer {layer + 1}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
    axes[0, 0].set_ylabel("share of routed tokens")
    axes[0, -1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    save_figure(fig, out)
    spread = load[-1].max() - load[-1].min()
    return (
        f"expert load of {n_layers} layers x {n_experts} experts at {len(steps)} evaluations "
        f"(steps {steps[0]}..{steps[-1]}); at the last, shares range over {spread:.2f}"
    )
