"""Checks for lesson 2 (from words to attention): pooling over real words, parameter-free self-attention."""

from __future__ import annotations

import torch

from attnlab.models.baselines import masked_mean
from attnlab.nn import attend
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


@exercise
def check_masked_mean(pool) -> None:
    """pool(x (B, T, C), mask (B, T)) -> (B, C): the mean over the positions where mask is True."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    got = as_tensor(pool(x, mask), "the pooled vectors")
    want = masked_mean(x, mask)
    if got.shape == want.shape:
        if not torch.isfinite(got[2]).all():
            raise WrongAnswer("row 2 has no real word and came out NaN: divide by the count clamped to at least 1")
        if torch.allclose(got[:2], x[:2].mean(1), atol=1e-5):
            raise WrongAnswer(
                "padding is averaged in: sum only where mask is True and divide by the number of real words"
            )
        if torch.allclose(got[:2], (x * mask[..., None])[:2].sum(1) / x.shape[1], atol=1e-5):
            raise WrongAnswer("padding is zeroed but still counted: divide by mask.sum(1), not by T")
    compare("the pooled vectors", got, want)
    correct("the mean over real words only, as attnlab.models.baselines.masked_mean")


@exercise
def check_simple_self_attention(mix) -> None:
    """mix(x (B, T, C)) -> softmax(x x^T) x, (B, T, C), with no scaling."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 8, generator=g)
    got = as_tensor(mix(x), "the mixed vectors")
    want, _ = attend(x, x, x, scale=1.0)
    if got.shape == want.shape:
        scaled, _ = attend(x, x, x)
        if torch.allclose(got, scaled, atol=1e-5):
            raise WrongAnswer("scaled by 1/sqrt(C): the parameter-free layer of rung 6 uses the raw dot products")
        if torch.allclose(got, (x @ x.transpose(-2, -1)) @ x, atol=1e-4):
            raise WrongAnswer("no softmax: turn each row of scores into weights that sum to 1 first")
        if torch.allclose(got, (x @ x.transpose(-2, -1)).softmax(-2) @ x, atol=1e-5):
            raise WrongAnswer("the softmax runs over the queries: take it over the last dimension (the keys)")
    compare("the mixed vectors", got, want)
    correct("softmax(X X^T) X: each word a similarity-weighted mix of the sentence")
