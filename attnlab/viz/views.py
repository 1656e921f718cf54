"""The attention of a trained run on one input, as views for pictures (PNG, HTML) and the explorer.

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

from attnlab.engine.rundir import reads_pixels
from attnlab.errors import AttnlabError
from attnlab.viz.html import AttentionView

TRANSLATION_VIEWS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}


def _numpy(weights: list[torch.Tensor]) -> np.ndarray:
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
def views(run, text: str) -> list[AttentionView]:
    """Every attention of `run` (attnlab.load) on `text`; see the module docstring."""
    kind = run.config.get("task", {}).get("kind")
    family = run.config["family"]
    run.model.eval()
    if kind == "image":
        raise AttnlabError(f"{run.path} is an image run: give an image file (its [CLS] attention over the patches)")
    if family == "gpt":
        return [_gpt(run, text)]
    if family == "encoder":
        return [_encoder(run, text, kind)]
    if family in ("seq2seq", "rnn-seq2seq"):
        return _translation(run, text)
    raise AttnlabError(f"{run.path} is a {family} model: it has no attention to show")


def _gpt(run, text: str) -> AttentionView:
    ids = run.tokenizer.encode(text)[-run.model.cfg.context :]  # the last window, as generation reads it
    if not ids:
        raise AttnlabError("the text has no tokens")
    weights = _numpy(run.model.attention(torch.tensor([ids], device=run.device)))
    labels = token_labels(run.tokenizer, ids)
    return AttentionView("self-attention", labels, labels, weights)


def _encoder(run, text: str, kind: str | None) -> AttentionView:
    from attnlab.tasks.text_predict import frame

    tok = run.tokenizer
    words = tok.split(text, tok.lower)
    if not words:
        raise AttnlabError("the text has no words")
    ids, _ = frame(tok, tok.encode_words(words), kind or "mlm", run.model.cfg.context)  # as predict reads it
    weights = _numpy(run.model.attention(torch.tensor([ids], device=run.device)))
    labels = [tok.itos[i] for i in ids]
    return AttentionView("self-attention", labels, labels, weights)


def _translation(run, text: str) -> list[AttentionView]:
    from attnlab.data.batches import BOS_ID, EOS_ID
    from attnlab.tasks.translate import cross_attention, decode_one, pieces, target_tokenizer

    src, tgt_in, hyp = decode_one(run, text)
    source = pieces(run.tokenizer, src[0].tolist())
    target = pieces(target_tokenizer(run), [*hyp, EOS_ID])  # what each step produced
    if run.config["family"] == "rnn-seq2seq":
        return [AttentionView(TRANSLATION_VIEWS["cross"], target, source, cross_attention(run, src, tgt_in))]
    maps = run.model.attention(src, tgt_in)
    inputs = pieces(target_tokenizer(run), [BOS_ID, *hyp])  # decoder self-attention reads its inputs
    return [
        AttentionView(TRANSLATION_VIEWS["encoder"], source, source, _numpy(maps["encoder"])),
        AttentionView(TRANSLATION_VIEWS["decoder"], target, inputs, _numpy(maps["decoder"])),
        AttentionView(TRANSLATION_VIEWS["cross"], target, source, _numpy(maps["cross"])),
    ]


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


def write_attention(run, text: str, out: str | Path, layer: int | None = None, head: int | None = None,
                    view: str | None = None) -> str:  # fmt: skip
    """Draw the attention of `run` on `text` into out: .png (a heatmap per layer and head, or the one
    chosen) or .html (every view, head view and model view, self-contained). Returns a summary line."""
    out = Path(out)
    if out.suffix.lower() not in (".png", ".html"):
        raise AttnlabError(f"--out {out}: write a .png picture or a .html page")
    if reads_pixels(run.config):
        if out.suffix.lower() != ".png":
            raise AttnlabError("image runs draw [CLS]'s attention over the image: use --out FILE.png")
        from attnlab.tasks.image import image_attention

        label = image_attention(run, text, out)
        return f"{out}: [CLS] attention over the patches of {Path(text).name} (predicted {label})"
    found = views(run, text)
    if out.suffix.lower() == ".html":
        from attnlab.viz.html import write_attention_html

        write_attention_html(found, out, f"{run.path.name}: {text!r}")
        return f"{out}: {', '.join(v.name for v in found)} (head view and model view)"
    chosen = pick(found, view)
    w, first, heads = select(chosen.weights, layer, head)
    from attnlab.viz.alignment import plot_alignment

    title = f"{run.path.name}, {chosen.name}: {text!r}"
    plot_alignment(w, chosen.keys, chosen.queries, out, title, first_layer=first, heads=heads)
    return f"{out}: {chosen.name}, {w.shape[0]} layer(s) x {w.shape[1]} head(s), {len(chosen.queries)} queries"
