"""Predictions of a trained encoder or baseline run on raw text.

classify: the label and its probability (and every label's)
tag:      each token with its tag and probability
mlm:      the top candidates for each [MASK]
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.run import Run
from attnlab.data.tokenizers import WordPieceTokenizer, WordTokenizer


def frame(tok, pieces: list[int], kind: str, context: int) -> tuple[list[int], int]:
    """The ids an encoder reads for these word ids, and where the first word sits: attnlab's own
    runs put [CLS] before a classifier's input; a converted BERT reads [CLS] ... [SEP] for every
    head, as it was trained. Texts longer than the context are cut (with a warning)."""
    wraps = getattr(tok, "wraps", False)
    first = 1 if wraps or kind == "classify" else 0
    room = context - first - wraps
    if len(pieces) > room:
        import warnings

        warnings.warn(f"the text has {len(pieces)} tokens; only the first {room} are read", stacklevel=3)
    ids = [tok.cls_id] * first + pieces[:room] + [tok.sep_id] * wraps
    return ids, first


@torch.no_grad()
def predict(run: Run, text: str, top_k: int = 5) -> dict:
    tok = run.tokenizer
    if not isinstance(tok, (WordTokenizer, WordPieceTokenizer)):
        raise AttnlabError(f"{run.path} is a {run.config.get('family')} language model: use attnlab sample")
    kind = run.config.get("task", {}).get("kind") or run.config["model"].get("head", "mlm")
    words = tok.split(text, tok.lower)
    ids, first = frame(tok, tok.encode_words(words), kind, run.model.cfg.context)
    words = words[: len(ids) - first - getattr(tok, "wraps", False)]
    if not words:
        raise AttnlabError("the text has no words")
    x = torch.tensor([ids], device=run.device)
    probs = run.model(x).float().softmax(-1)[0]  # classify (L,), tag (T, L), mlm (T, V)
    if kind == "classify":
        labels = run.config["task"]["labels"]
        best = int(probs.argmax())
        return {"kind": kind, "label": labels[best], "probability": float(probs[best]),
                "probabilities": dict(zip(labels, probs.tolist()))}  # fmt: skip
    if kind == "tag":
        labels = run.config["task"]["labels"]
        p, best = probs[first : first + len(words)].max(-1)  # the words' own positions
        return {"kind": kind, "tokens": [{"token": w, "tag": labels[int(b)], "probability": float(q)}
                                         for w, b, q in zip(words, best, p)]}  # fmt: skip
    masks = [i for i, t in enumerate(ids) if t == tok.mask_id]
    if not masks:
        raise AttnlabError("a masked-LM run fills [MASK]: put [MASK] in the text")
    out = []
    for i in masks:
        p, top = probs[i].topk(top_k)
        out.append({"position": i, "candidates": [{"token": tok.itos[int(t)], "probability": float(q)}
                                                  for t, q in zip(top, p)]})  # fmt: skip
    return {"kind": "mlm", "tokens": words, "masks": out}
