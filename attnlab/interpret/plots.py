"""Inside a trained run: its loss and learning-rate curves, its position vectors, its token embeddings.

Shapes: N positions, D model width, V vocabulary (embedding rows), K principal components.

    run = attnlab.load("runs/demo")
    plot_run(run, "positions", Path("positions.png"))   # -> "learned positions of 64 x 128 (...)"

Each picture is a function of arrays (plot_lr, plot_positions, plot_embeddings); `plot_run` finds
the arrays in a run: the position module every family keeps under `pos` (`src_pos` in the
encoder-decoder) and the token embedding, whose name differs by family (TOKEN_EMBEDDINGS).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.interpret.experts import expert_routing
from attnlab.io import read_metrics
from attnlab.models.protocols import Positioned, WordEmbedded
from attnlab.runs.run import Run
from attnlab.viz.curves import learning_rates, plot_loss, plot_lr
from attnlab.viz.embeddings import embedding_pca, plot_embeddings, plot_positions
from attnlab.viz.experts import plot_expert_load, plot_routing
from attnlab.viz.picture import Drawn

# What `--what experts` routes when no --text is given: a line of Python and a line of prose.
EXPERTS_TEXT = "for key in sorted(items):\n    print(key, items[key] + 1)  # 42\n"

_WORD = re.compile(r"\w+")  # letters, digits, underscores: words and identifiers


def plot_run(run: Run, what: str, out: Path, max_tokens: int = 60, text: str | None = None) -> Drawn:
    """Draw `what` (one of PLOTS) for a loaded run (attnlab.load) into `out` (.png, .svg or .json);
    returns a one-line description of what was drawn. text: what `experts` routes (default EXPERTS_TEXT)."""
    if what not in PLOTS:
        raise AttnlabError(f"unknown plot {what!r}: choose one of {', '.join(PLOTS)}")
    return Drawn(PLOTS[what](run, Path(out), max_tokens, text), out)  # a str a notebook shows as the picture


def _metrics(run: Run) -> Path:
    return Path(run.path) / "metrics.jsonl"


def _draw_lr(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    steps, lrs = learning_rates(_metrics(run))
    plot_lr(_metrics(run), out)
    return f"learning rate at {len(steps)} steps ({steps[0]}..{steps[-1]}, peak {max(lrs):.3g}, last {lrs[-1]:.3g})"


def _draw_experts(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    routing = expert_routing(run, text or EXPERTS_TEXT)
    plot_routing(routing, out)
    used = np.bincount(routing.experts[..., 0].ravel(), minlength=routing.n_experts)
    return (
        f"first-choice experts of {len(routing.tokens)} tokens in {routing.experts.shape[0]} layers; "
        f"tokens per expert, all layers: {used.tolist()}"
    )


def _draw_expert_load(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    return plot_expert_load(_metrics(run), out)


def _draw_positions(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    table, label = position_table(run.model)
    plot_positions(table, label, out)
    n, d = table.shape
    return f"{label} of {n} x {d} (position x dimension), and the cosine similarity of every pair of positions"


def _draw_loss(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    metrics = _metrics(run)
    rows = read_metrics(metrics)
    n_train, n_val = sum("loss" in r for r in rows), sum("val_loss" in r for r in rows)
    if not n_train and not n_val:
        raise AttnlabError(f"{metrics} has no losses logged: train the run for a few steps first")
    plot_loss(metrics, out)
    return f"training loss at {n_train} steps and validation loss at {n_val} evaluations"


def position_table(model: nn.Module) -> tuple[np.ndarray, str]:
    """The model's absolute position vectors (N, D) and what they are ("learned positions", ...).

    Learned tables are the trained weights; sinusoidal ones the fixed buffer; the ViT's 2-D
    table has [CLS] (a zero row) first, then the patches row by row. An encoder-decoder gives
    its encoder's (source) positions. Models without such vectors raise AttnlabError."""
    name = type(model).__name__
    if not isinstance(model, Positioned):
        raise AttnlabError(f"a {name} model has no position vectors to plot: only the Transformers have them")
    pos, side = model.input_positions()
    found = pos.vectors()
    if found is None:
        raise AttnlabError(f"this {name}{pos.why_no_vectors}")
    table, kind = found
    return table.detach().float().cpu().numpy(), side + kind


def _draw_embeddings(run: Run, out: Path, max_tokens: int, text: str | None) -> str:
    family = run.config.get("family", type(run.model).__name__)
    if run.tokenizer is None:
        raise AttnlabError(f"{run.path} is an image run: it reads pixels and has no token embeddings")
    if not isinstance(run.model, WordEmbedded) or run.model.word_embedding is None:
        raise AttnlabError(f"{run.path}: the {family} model has no token embedding to plot")
    if max_tokens < 0:
        raise AttnlabError(f"the number of tokens to label must be 0 or more, got {max_tokens}")
    shift = run.model.token_shift
    w = run.model.word_embedding.weight.detach().float().cpu().numpy()  # (V, D)
    v, d = w.shape
    if min(v, d) < 2:
        raise AttnlabError(f"{run.path}: a {v} x {d} embedding has no two principal components to plot")
    points = embedding_pca(w)  # every row, labelled or not
    labels = token_labels(run.tokenizer, v, shift, max_tokens)
    share = points.var(axis=0).sum() / max(float(w.var(axis=0).sum()), 1e-12)
    n = sum(bool(s) for s in labels)
    title = (
        f"token embeddings of {Path(run.path).name} ({family}, {v} x {d}): "
        f"2 principal components, {share:.0%} of the variance"
    )
    plot_embeddings(points, labels, out, title)
    return (
        f"token embeddings of {v} x {d} (token x dimension) on 2 principal components "
        f"({share:.0%} of the variance), {n} tokens labelled"
    )


def token_labels(tokenizer, n_rows: int, shift: int, max_tokens: int) -> list[str]:
    """One label per embedding row: the text of up to max_tokens tokens, "" for the other rows.

    Special tokens are skipped. Words and identifiers of several characters come first, then
    single letters and digits, then the rest (punctuation, whitespace, byte pieces); each group in
    vocabulary order, which word and BPE vocabularies sort by falling frequency. Row = id + shift."""
    specials = set(range(len(getattr(tokenizer, "specials", ())))) | {tokenizer.eot_id}  # specials come first
    ranked = []
    for i in range(min(tokenizer.vocab_size, n_rows - shift)):
        if i in specials:
            continue
        text = tokenizer.decode([i])
        word = _WORD.fullmatch(text.strip()) is not None
        ranked.append((0 if word and len(text.strip()) > 1 else 1 if word else 2, i, text))
    ranked.sort()
    labels = [""] * n_rows
    for _, i, text in ranked[:max_tokens]:
        labels[i + shift] = _visible(text)
    return labels


def _visible(text: str) -> str:
    """A token's text with its whitespace shown: " def" -> "·def", "\\n" -> "\\\\n"."""
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "·")


# What `attnlab plot --what` draws, by name.
PLOTS = {
    "loss": _draw_loss,
    "lr": _draw_lr,
    "positions": _draw_positions,
    "embeddings": _draw_embeddings,
    "experts": _draw_experts,
    "expert-load": _draw_expert_load,
}
WHAT = tuple(PLOTS)
