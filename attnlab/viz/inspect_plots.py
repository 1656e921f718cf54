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

from attnlab.errors import AttnlabError
from attnlab.nn.position import (
    FixedPositions,
    GridPositions,
    LearnedPositions,
    NoPositions,
    Positions,
    SinusoidalPositions,
)
from attnlab.viz.curves import plot_loss, read_metrics

WHAT = ("loss", "lr", "positions", "embeddings", "experts", "expert-load")
# What `--what experts` routes when no --text is given: a line of Python and a line of prose.
EXPERTS_TEXT = "for key in sorted(items):\n    print(key, items[key] + 1)  # 42\n"
DIVERGING = "RdBu_r"  # blue below 0, white at 0, red above: the sign of a value reads at a glance

# Where the position module lives: `pos` in the GPT, encoder and ViT; the encoder-decoder has one
# per side (`src_pos`, `tgt_pos`) and its encoder's is drawn.
POSITION_MODULES = (("pos", ""), ("src_pos", "encoder "))
_WORD = re.compile(r"\w+")  # letters, digits, underscores: words and identifiers


def plot_run(run, what: str, out: Path, max_tokens: int = 60, text: str | None = None) -> str:
    """Draw `what` (one of WHAT) for a loaded run (attnlab.load) into the PNG `out`; returns a
    one-line description of what was drawn. text: what `experts` routes (default EXPERTS_TEXT)."""
    if what not in WHAT:
        raise AttnlabError(f"unknown plot {what!r}: choose one of {', '.join(WHAT)}")
    out = Path(out)
    metrics = Path(run.path) / "metrics.jsonl"
    if what == "loss":
        return _draw_loss(metrics, out)
    if what == "lr":
        steps, lrs = _learning_rates(metrics)
        plot_lr(metrics, out)
        return f"learning rate at {len(steps)} steps ({steps[0]}..{steps[-1]}, peak {max(lrs):.3g}, last {lrs[-1]:.3g})"
    if what in ("experts", "expert-load"):
        from attnlab.viz.experts import expert_routing, plot_expert_load, plot_routing

        if what == "expert-load":
            return plot_expert_load(metrics, out)
        routing = expert_routing(run, text or EXPERTS_TEXT)
        plot_routing(routing, out)
        used = np.bincount(routing.experts[..., 0].ravel(), minlength=routing.n_experts)
        return (f"first-choice experts of {len(routing.tokens)} tokens in {routing.experts.shape[0]} layers; "
                f"tokens per expert, all layers: {used.tolist()}")  # fmt: skip
    if what == "positions":
        table, label = position_table(run.model)
        plot_positions(table, label, out)
        n, d = table.shape
        return f"{label} of {n} x {d} (position x dimension), and the cosine similarity of every pair of positions"
    return _draw_embeddings(run, out, max_tokens)


def _draw_loss(metrics: Path, out: Path) -> str:
    rows = read_metrics(metrics)
    n_train, n_val = sum("loss" in r for r in rows), sum("val_loss" in r for r in rows)
    if not n_train and not n_val:
        raise AttnlabError(f"{metrics} has no losses logged: train the run for a few steps first")
    plot_loss(metrics, out)
    return f"training loss at {n_train} steps and validation loss at {n_val} evaluations"


def _learning_rates(metrics: Path) -> tuple[list[int], list[float]]:
    rows = [(r["step"], r["lr"]) for r in read_metrics(metrics) if "lr" in r and "step" in r]
    if not rows:
        raise AttnlabError(f"{metrics} has no learning rate logged: train the run for a few steps first")
    steps, lrs = zip(*rows)
    return list(steps), list(lrs)


def plot_lr(metrics: Path, out: Path) -> None:
    """The learning rate of every logged step (metrics.jsonl rows {"step", "lr"}): warmup, then decay."""
    steps, lrs = _learning_rates(Path(metrics))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, lrs, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, Path(out))


def position_table(model) -> tuple[np.ndarray, str]:
    """The model's absolute position vectors (N, D) and what they are ("learned positions", ...).

    Learned tables are the trained weights; sinusoidal ones the fixed buffer; the ViT's 2-D
    table has [CLS] (a zero row) first, then the patches row by row. An encoder-decoder gives
    its encoder's (source) positions. Models without such vectors raise AttnlabError."""
    name = type(model).__name__
    pos, side = _position_module(model)
    if isinstance(pos, LearnedPositions):
        table, kind = pos.embedding.weight, "learned positions"
    elif isinstance(pos, GridPositions):
        table, kind = pos.table, "2-D sinusoidal grid positions ([CLS] first, zero)"
    elif isinstance(pos, SinusoidalPositions):
        table, kind = pos.table, "sinusoidal positions"
    elif isinstance(pos, FixedPositions):
        table, kind = pos.table, "fixed positions"
    elif isinstance(pos, NoPositions) or type(pos) is Positions:
        raise AttnlabError(f"this {name} was trained with positions 'none': it has no position vectors to plot")
    else:  # a scheme inside attention (rotary, relative) has no table of vectors
        raise AttnlabError(f"this {name}'s positions ({type(pos).__name__}) act inside attention: no table to plot")
    return table.detach().float().cpu().numpy(), side + kind


def _position_module(model) -> tuple[Positions, str]:
    """The module adding positions, and which side it serves ("" or "encoder ")."""
    for attr, side in POSITION_MODULES:
        pos = getattr(model, attr, None)
        if isinstance(pos, Positions):
            return pos, side
    raise AttnlabError(
        f"a {type(model).__name__} model has no position vectors to plot: only the Transformers have them"
    )


def plot_positions(table: np.ndarray, label: str, out: Path) -> None:
    """Left: the table (N, D), position down and dimension across, on a colour scale centred at 0.
    Right: the cosine similarity of every pair of positions (N, N); for sinusoidal tables it
    falls off with the distance between positions, the same for every starting position."""
    table = np.asarray(table, dtype=float)
    n, d = table.shape
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), dpi=110, width_ratios=(1.2, 1))
    top = float(np.abs(table).max()) or 1.0  # symmetric limits: white is exactly 0
    im = left.imshow(table, cmap=DIVERGING, vmin=-top, vmax=top, aspect="auto")
    left.set(xlabel="dimension", ylabel="position", title=f"{label}: {n} x {d}")
    fig.colorbar(im, ax=left, shrink=0.85)
    im = right.imshow(_cosine_similarity(table), cmap=DIVERGING, vmin=-1, vmax=1)
    right.set(xlabel="position", ylabel="position", title="cosine similarity between positions")
    fig.colorbar(im, ax=right, shrink=0.85)
    fig.tight_layout()
    _save(fig, Path(out))


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


def plot_embeddings(points: np.ndarray, labels: list[str], out: Path, title: str) -> None:
    """Scatter of points (V, >= 2) on their first two coordinates; labels has one string per point,
    written next to it ("" leaves a point as a small grey dot)."""
    points = np.asarray(points, dtype=float)
    if points.ndim != 2 or points.shape[1] < 2:
        raise ValueError(f"points should be (V, 2) or wider, got shape {points.shape}")
    if len(labels) != len(points):
        raise ValueError(f"{len(labels)} labels for {len(points)} points: give one per point ('' for none)")
    named = np.array([bool(s) for s in labels], dtype=bool)
    plt = _pyplot()
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
    _save(fig, Path(out))


def _draw_embeddings(run, out: Path, max_tokens: int) -> str:
    family = run.config.get("family", type(run.model).__name__)
    if run.tokenizer is None:
        raise AttnlabError(f"{run.path} is an image run: it reads pixels and has no token embeddings")
    found = _token_embedding(run.model)
    if found is None:
        raise AttnlabError(f"{run.path}: the {family} model has no token embedding to plot")
    if max_tokens < 0:
        raise AttnlabError(f"the number of tokens to label must be 0 or more, got {max_tokens}")
    weight, shift = found
    w = weight.detach().float().cpu().numpy()  # (V, D)
    v, d = w.shape
    if min(v, d) < 2:
        raise AttnlabError(f"{run.path}: a {v} x {d} embedding has no two principal components to plot")
    points = embedding_pca(w)  # every row, labelled or not
    labels = token_labels(run.tokenizer, v, shift, max_tokens)
    share = points.var(axis=0).sum() / max(float(w.var(axis=0).sum()), 1e-12)
    n = sum(bool(s) for s in labels)
    title = (f"token embeddings of {Path(run.path).name} ({family}, {v} x {d}): "
             f"2 principal components, {share:.0%} of the variance")  # fmt: skip
    plot_embeddings(points, labels, out, title)
    return (f"token embeddings of {v} x {d} (token x dimension) on 2 principal components "
            f"({share:.0%} of the variance), {n} tokens labelled")  # fmt: skip


def _token_embedding(model):
    """(the token embedding's weight (V, D), model id - tokenizer id), or None if it has none.
    Every text family names its (source) token embedding `word_embedding` (None for the bag of
    words); the encoder-decoders put PAD, BOS and EOS below the tokenizer's ids (`token_shift`)."""
    emb = getattr(model, "word_embedding", None)
    if emb is None or not hasattr(emb, "weight"):
        return None
    return emb.weight, getattr(model, "token_shift", 0)


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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> None:
    from attnlab.viz.figures import save_figure

    save_figure(fig, out)
