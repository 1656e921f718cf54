"""Checks for lesson 5 (encoders): masked-LM labels, token accuracy of a tagger."""

from __future__ import annotations

import torch

from attnlab.data.batches import IGNORE
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


@exercise
def check_mlm_labels(make) -> None:
    """make(ids (B, T), chosen (B, T) bool) -> labels: ids where chosen, IGNORE elsewhere."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 8), generator=g)
    chosen = torch.rand(3, 8, generator=g) < 0.3
    got = as_tensor(make(ids.clone(), chosen.clone()), "labels")
    want = torch.where(chosen, ids, IGNORE)
    if got.shape == want.shape:
        if torch.equal(got, torch.where(chosen, IGNORE, ids)):
            raise WrongAnswer("inverted: the loss is on the chosen tokens, so they keep their ids; the rest get IGNORE")
        if torch.equal(got, torch.where(chosen, ids, 0)):
            raise WrongAnswer("unchosen positions are 0, a real token id: use IGNORE (-100), which the loss skips")
    compare("labels", got, want)
    correct("labels hold the original ids at the chosen positions, IGNORE elsewhere")


@exercise
def check_tag_accuracy(accuracy) -> None:
    """accuracy(logits (B, T, L), labels (B, T)) -> the share of non-IGNORE tokens tagged right."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 4, generator=g)
    labels = logits.argmax(-1).clone()
    labels[0, :2] = (labels[0, :2] + 1) % 4  # two wrong
    labels[1, 4:] = IGNORE  # padding
    got = accuracy(logits, labels)
    got = float(got.item() if isinstance(got, torch.Tensor) else got)
    real = labels != IGNORE
    want = ((logits.argmax(-1) == labels) & real).sum().item() / real.sum().item()
    if abs(got - ((logits.argmax(-1) == labels).float().mean().item())) < 1e-6:
        raise WrongAnswer(f"got {got:.4f}: padding is counted; average over the positions where labels != IGNORE")
    if abs(got - want) > 1e-6:
        raise WrongAnswer(f"got {got:.4f}, expected {want:.4f} (8 of 10 real tokens right)")
    correct("accuracy over real tokens only")
