"""Checks for lesson 4 (GPT): temperature, top-k and top-p filtering of the next-token logits."""

from __future__ import annotations

import torch

from attnlab.decoding.draw import filter_logits
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


def _logits() -> torch.Tensor:
    return torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0, 1.0, -2.0, 2.5])


@exercise
def check_temperature(apply) -> None:
    """apply(logits (V,), t) -> probabilities softmax(logits / t)."""
    logits = _logits()
    for t in (0.5, 2.0):
        got = as_tensor(apply(logits.clone(), t), f"the probabilities at temperature {t}")
        want = torch.softmax(logits / t, -1)
        if got.shape == want.shape:
            if torch.allclose(got, logits / t, atol=1e-5):
                raise WrongAnswer("these are scaled logits, not probabilities: apply a softmax")
            if torch.allclose(got, torch.softmax(logits * t, -1), atol=1e-5):
                raise WrongAnswer(f"at t={t} you multiplied by the temperature: divide the logits by it")
            if not torch.isclose(got.sum(), torch.tensor(1.0), atol=1e-4):
                raise WrongAnswer(f"the probabilities at t={t} sum to {got.sum():.4f}, not 1")
        compare(f"the probabilities at temperature {t}", got, want)
    correct("softmax(logits / t): t < 1 sharpens, t > 1 flattens")


def _kept(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = as_tensor(got, what)
    if got.shape != want.shape:
        raise WrongAnswer(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    kept, should = torch.isfinite(got), torch.isfinite(want)
    if not torch.equal(kept, should):
        extra = (kept & ~should).nonzero().flatten().tolist()
        lost = (should & ~kept).nonzero().flatten().tolist()
        raise WrongAnswer(
            f"{what} keeps {int(kept.sum())} tokens, expected {int(should.sum())}"
            + (f"; should be -inf: {extra}" if extra else "")
            + (f"; should be kept: {lost}" if lost else "")
        )
    if not torch.allclose(got[kept], want[should]):
        raise WrongAnswer(f"{what}: the kept logits were changed; leave them as they are")


@exercise
def check_top_k(top_k) -> None:
    """top_k(logits (V,), k) -> logits with all but the k largest at -inf."""
    for k in (1, 3):
        _kept(top_k(_logits(), k), filter_logits(_logits(), top_k=k), f"top_k(logits, {k})")
    correct("the k most likely tokens kept, the rest at -inf")


@exercise
def check_top_p(top_p) -> None:
    """top_p(logits (V,), p) -> logits outside the nucleus of mass p at -inf."""
    for p in (0.5, 0.9):
        _kept(top_p(_logits(), p), filter_logits(_logits(), top_p=p), f"top_p(logits, {p})")
    _kept(top_p(_logits(), 0.2), filter_logits(_logits(), top_p=0.2), "top_p(logits, 0.2) (the top token alone)")
    correct("the smallest set of most likely tokens with mass >= p, the top one always kept")
