"""The attention of a trained run on one input, as views for pictures (PNG, SVG, HTML), numbers
(JSON) and the explorer.

views(run, text) -> [AttentionView(name, queries, keys, weights (L, H, Tq, Tk))]:
  gpt          "self-attention": causal, so a query sees only the keys up to itself
  encoder      "self-attention": bidirectional, [CLS] first for a classifier
  seq2seq      "encoder self-attention", "decoder self-attention", "cross-attention", on the
               run's own (greedy) translation of the text
  rnn-seq2seq  "cross-attention": the Bahdanau alignment (one layer, one head)
Image runs draw [CLS]'s attention over the patches instead (tasks/image.image_attention).
Every weight comes from the math path of `attend`, the same numbers the model computes with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.experts import routing_json
from attnlab.io import write_json
from attnlab.viz.alignment import plot_alignment
from attnlab.viz.html import AttentionView, Views, inline_attention_html, views_json, write_attention_html
from attnlab.viz.picture import Drawn

TRANSLATION_VIEWS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}
VIEW_NAMES = ("self", *TRANSLATION_VIEWS)  # what `attnlab attention --view` picks


def numpy_weights(weights: list[torch.Tensor]) -> np.ndarray:
    """A list of L (1, H, Tq, Tk) tensors -> (L, H, Tq, Tk) float array."""
    return torch.stack([w[0] for w in weights]).float().cpu().numpy()


def token_labels(tok, ids: list[int]) -> list[str]:
    """Each id as readable text; spaces and line breaks made visible, as axis labels need."""
    out = []
    for i in ids:
        piece = tok.decode([int(i)])
        out.append(piece.replace("\n", "\\n").replace(" ", "·") or "∅")
    return out


@torch.no_grad()
def self_attention_view(run, ids: list[int], labels: list[str] | None = None) -> AttentionView:
    """The self-attention of a one-stack model (GPT, encoder) on token ids, labelled by `labels`
    (default: each id's text)."""
    if not ids:
        raise AttnlabError("the text has no tokens")
    run.model.eval()
    weights = numpy_weights(run.model.attention(torch.tensor([ids], device=run.device)))
    labels = labels or token_labels(run.tokenizer, ids)
    return AttentionView("self-attention", labels, labels, weights)


def views(run, text: str) -> Views:
    """Every attention of `run` (attnlab.load) on `text`: its task knows which (see the docstring).
    A list, which a notebook shows as the head view and the model view inline."""
    run.model.eval()
    return Views(run.task.views(run, text))


def pick(found: list[AttentionView], view: str | None) -> AttentionView:
    """The view named by --view (encoder, decoder, cross, self), or the last one (cross-attention
    for translation: the alignment people look for first)."""
    if view is None:
        return found[-1]
    for v in found:
        if v.name.startswith(view) or v.name == TRANSLATION_VIEWS.get(view):
            return v
    raise AttnlabError(f"no {view!r} attention here; this run has: {', '.join(v.name for v in found)}")


def select(weights: np.ndarray, layer: int | None, head: int | None) -> tuple[np.ndarray, int, list[int]]:
    """weights (L, H, Tq, Tk) narrowed to --layer (1-based) and --head; returns the rest, the first
    layer number and the head numbers kept, for titles."""
    n_layer, n_head = weights.shape[:2]
    if layer is not None and not 1 <= layer <= n_layer:
        raise AttnlabError(f"--layer {layer}: this model has layers 1 to {n_layer}")
    if head is not None and not 1 <= head <= n_head:
        raise AttnlabError(f"--head {head}: this model has heads 1 to {n_head}")
    if head is not None and layer is None:
        raise AttnlabError("--head needs --layer")
    first = layer or 1
    w = weights if layer is None else weights[layer - 1 : layer]
    heads = list(range(1, n_head + 1)) if head is None else [head]
    return (w if head is None else w[:, head - 1 : head]), first, heads


FORMATS = (".png", ".svg", ".html", ".json")


def attention_json(
    run, text: str, found: list[AttentionView], layer: int | None, head: int | None, view: str | None
) -> dict:
    """The numbers behind the pictures: {"run", "text", "views": [{name, queries, keys, weights
    (L, H, Tq, Tk) rounded to 4 decimals, layers, heads}]}; every view unless --view names one,
    each narrowed to --layer and --head (layers and heads: the 1-based numbers kept)."""

    chosen = [pick(found, view)] if view else found
    kept = [select(v.weights, layer, head) for v in chosen]
    narrowed = [AttentionView(v.name, v.queries, v.keys, w) for v, (w, _, _) in zip(chosen, kept)]
    out = views_json(narrowed)["views"]  # the same rounding as the HTML page's data
    for entry, (w, first, heads) in zip(out, kept):
        entry.update(layers=list(range(first, first + w.shape[0])), heads=heads)
    return {"run": run.path.name, "text": text, "views": out}


def write_attention(
    run, text: str, out: str | Path, layer: int | None = None, head: int | None = None, view: str | None = None
) -> Drawn:
    """Draw the attention of `run` on `text` into out: .png or .svg (a heatmap per layer and head, or
    the one chosen), .html (every view, head view and model view, self-contained) or .json (the
    numbers behind the picture). Returns a summary line, which a notebook shows as what was drawn
    (the picture, or the page's views inline)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise AttnlabError(f"--out {out}: write a .png or .svg picture, a .html page or .json numbers")
    if not run.task.tokenized:  # an image run: [CLS] over the patches, drawn by its task
        if suffix != ".png":
            raise AttnlabError(  # .svg, .html and .json are drawn from token views, which images lack
                f"--out {out}: image runs draw [CLS]'s attention over the image: use --out FILE.png"
            )
        return Drawn(run.task.picture(run, text, out), out)
    found = views(run, text)
    if suffix == ".html":
        experts = routing_json(run, text)
        title = f"{run.path.name}: {text!r}"
        write_attention_html(found, out, title, experts)
        extra = ", expert view" if experts else ""
        summary = f"{out}: {', '.join(v.name for v in found)} (head view and model view{extra})"
        return Drawn(summary, None, lambda: inline_attention_html(found, title, experts))
    if suffix == ".json":
        data = attention_json(run, text, found, layer, head, view)
        write_json(out, data)
        return Drawn(f"{out}: {', '.join(v['name'] for v in data['views'])} (weights as L x H x Tq x Tk lists)", None)
    chosen = pick(found, view)
    w, first, heads = select(chosen.weights, layer, head)

    title = f"{run.path.name}, {chosen.name}: {text!r}"
    picture = plot_alignment(w, chosen.keys, chosen.queries, out, title, first_layer=first, heads=heads)
    summary = f"{out}: {chosen.name}, {w.shape[0]} layer(s) x {w.shape[1]} head(s), {len(chosen.queries)} queries"
    return Drawn(summary, picture)
