"""Checks for lesson 1 (attention from scratch): scores, the causal mask, masked attention."""

from __future__ import annotations

import math

import torch

from attnlab.nn import attend, causal_mask
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


def _qkv(seed: int = 0, b: int = 2, t: int = 5, d: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, t, d, generator=g) for _ in range(3))


@exercise
def check_scores(scores) -> None:
    """scores(q, k) -> (B, Tq, Tk): every query's dot product with every key, divided by sqrt(d)."""
    q, k, _ = _qkv()
    k = k[:, :4]  # 4 keys for 5 queries: a transposed answer shows up in the shape
    got = as_tensor(scores(q, k), "scores(q, k)")
    raw = q @ k.transpose(-2, -1)  # (B, Tq, Tk)
    want = raw / math.sqrt(q.shape[-1])
    if got.shape == raw.transpose(-2, -1).shape and got.shape != want.shape:
        raise WrongAnswer(f"scores has shape {tuple(got.shape)}: rows should be queries (Tq=5), columns keys (Tk=4)")
    if got.shape == want.shape and torch.allclose(got, raw, atol=1e-5):
        raise WrongAnswer("the dot products are right but not scaled: divide by sqrt(d), the size of a query")
    if got.shape == want.shape and torch.allclose(got, raw / q.shape[-1], atol=1e-5):
        raise WrongAnswer("scaled by d instead of sqrt(d): divide by math.sqrt(q.shape[-1])")
    compare("scores(q, k)", got, want)
    correct("scores are Q K^T / sqrt(d), one row per query")


@exercise
def check_causal_mask(make_mask) -> None:
    """make_mask(t) -> (t, t) boolean, True where query i may look at key j (j <= i)."""
    t = 5
    got = as_tensor(make_mask(t), f"make_mask({t})")
    want = causal_mask(t, t)
    if tuple(got.shape) != (t, t):
        raise WrongAnswer(f"make_mask({t}) has shape {tuple(got.shape)}, expected ({t}, {t})")
    if got.dtype != torch.bool:
        raise WrongAnswer(f"the mask should be boolean (True = may look), got dtype {got.dtype}")
    if torch.equal(got, ~want):
        raise WrongAnswer("the mask is inverted: True must mean 'may look' (j <= i), False the future keys")
    if torch.equal(got, want.T):
        raise WrongAnswer("the mask lets queries see the future: query i (row) may see keys j (columns) with j <= i")
    if not torch.equal(got, want):
        i, j = (int(x) for x in (got != want).nonzero()[0])
        raise WrongAnswer(
            f"entry ({i}, {j}) is {bool(got[i, j])}: query {i} {'may' if j <= i else 'may not'} see key {j}"
        )
    correct("query i sees keys 0..i (the lower triangle, diagonal included)")


@exercise
def check_attention(attention) -> None:
    """attention(q, k, v, mask) -> (B, Tq, Dv): softmax(Q K^T / sqrt(d), masked) V; mask True = may look."""
    q, k, v = _qkv(1)
    mask = causal_mask(q.shape[1], k.shape[1])
    want, _ = attend(q, k, v, mask, return_weights=True)
    got = as_tensor(attention(q, k, v, mask), "attention(q, k, v, mask)")
    if got.shape == want.shape:
        unmasked, _ = attend(q, k, v, None, return_weights=True)
        if torch.allclose(got, unmasked, atol=1e-5):
            raise WrongAnswer("the mask is ignored: set the scores of masked keys to -inf before the softmax")
        unscaled, _ = attend(q, k, v, mask, return_weights=True, scale=1.0)
        if torch.allclose(got, unscaled, atol=1e-5):
            raise WrongAnswer("the scores are not scaled: divide Q K^T by sqrt(d) before the softmax")
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
        wrong_dim = torch.nan_to_num(scores.softmax(dim=-2)) @ v
        if torch.allclose(got, wrong_dim, atol=1e-5):
            raise WrongAnswer("the softmax runs over the queries: take it over the keys (dim=-1), each row sums to 1")
        _refuse_inverted_mask(got, q, k, v, mask)
    compare("attention(q, k, v, mask)", got, want)
    correct("softmax(Q K^T / sqrt(d) + mask) V, as attnlab.nn.attend computes it")


def _refuse_inverted_mask(got: torch.Tensor, q, k, v, mask: torch.Tensor) -> None:
    """Say what a nan means: the mask used inverted (-inf where it is True) hides every key of the last
    query, and a softmax over a row of only -inf is 0/0 = nan; a bare "nan at (0, 4, 0)" teaches nothing."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    inverted = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v  # (B, Tq, Dv), nan in row Tq - 1
    hint = "True in the mask means 'may look': fill the scores where it is False (~mask) with -inf"
    rows = sorted({int(i) for i in got.isnan().any(-1).nonzero()[:, 1]})  # the queries with a nan output
    if torch.allclose(got, inverted, atol=1e-5, equal_nan=True):
        raise WrongAnswer(
            f"rows {rows} are entirely masked, giving nan: the mask is inverted, it hides the keys "
            f"each query may see and shows the future; {hint}"
        )
    if torch.allclose(got, torch.nan_to_num(inverted), atol=1e-5):
        raise WrongAnswer(f"the mask is inverted: each query sees the future keys and not the earlier ones; {hint}")
    if rows:
        raise WrongAnswer(
            f"rows {rows} are nan: every key of those queries got -inf, though each query may at least "
            f"see itself (key j <= i); {hint}"
        )
