"""Checks for lesson 8 (inside the model): the previous-token and induction scores, zeroing one head's output."""

from __future__ import annotations

import torch

from attnlab.interpret.detectors import induction, previous_token
from attnlab.nn.hooks import zero_head
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


def _patterns(seed: int = 0, layers: int = 2, heads: int = 3, t: int = 8) -> torch.Tensor:
    """Causal attention patterns (L, H, T, T): random scores, the future masked, rows summing to 1."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, t, t, generator=g) * 2
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    return scores.softmax(-1)


@exercise
def check_previous_token(my_score) -> None:
    """my_score(patterns (L, H, T, T)) -> (L, H): the mean over queries t >= 1 of the weight on key t - 1."""
    patterns = _patterns()
    got = as_tensor(my_score(patterns), "my_score(patterns)")
    want = previous_token(patterns)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        with_first = torch.diagonal(patterns, offset=-1, dim1=-2, dim2=-1).sum(-1) / patterns.shape[-1]
        if torch.allclose(got, with_first, atol=1e-5):
            raise WrongAnswer(
                "averaged over all T queries: query 0 has no previous token, so average over the "
                "T - 1 queries t = 1 .. T-1"
            )
        diagonal = torch.diagonal(patterns, dim1=-2, dim2=-1)[..., 1:].mean(-1)
        if torch.allclose(got, diagonal, atol=1e-5):
            raise WrongAnswer("that is the weight on the query's own position (the diagonal): take key t - 1")
    compare("my_score(patterns)", got, want)
    correct("previous-token score: the weight each query t puts on key t - 1, averaged over t >= 1")


@exercise
def check_induction(my_score) -> None:
    """my_score(patterns (L, H, T, T), half) -> (L, H): on a sequence whose second half (from `half`) repeats
    the first, the mean over queries t >= half of the weight on key t - half + 1."""
    patterns, half = _patterns(seed=1, t=10), 5
    got = as_tensor(my_score(patterns, half), "my_score(patterns, half)")
    want = induction(patterns, half)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        l_, h_, t, _ = patterns.shape
        queries = torch.arange(half, t)
        same_token = patterns[:, :, queries, queries - half].mean(-1)
        if torch.allclose(got, same_token, atol=1e-5):
            raise WrongAnswer(
                "that is the earlier copy of the same token (t - half): an induction head looks one "
                "further, at the token that came after it (t - half + 1)"
            )
    compare("my_score(patterns, half)", got, want)
    correct("induction score: the weight on the token after the previous occurrence of the current one")


@exercise
def check_zero_head(my_zero_head) -> None:
    """my_zero_head(head) -> a function of a head output (B, H, T, Dh) that returns it with that head zeroed."""
    g = torch.Generator().manual_seed(2)
    out = torch.randn(2, 4, 5, 3, generator=g)
    for head in (0, 2):
        hook = my_zero_head(head)
        if not callable(hook):
            raise WrongAnswer(f"my_zero_head({head}) should return a function of the (B, H, T, Dh) head output")
        given = out.clone()
        got = as_tensor(hook(given), f"my_zero_head({head})(out)")
        want = zero_head(head)(out.clone())
        if got.shape == want.shape and torch.allclose(got[:, :, head], torch.zeros_like(got[:, :, head])):
            raise WrongAnswer("a time step was zeroed, not a head: the heads are dimension 1 of (B, H, T, Dh)")
        if got.shape == want.shape and torch.allclose(got, torch.zeros_like(got)):
            raise WrongAnswer("every head was zeroed: zero only x[:, head]")
        compare(f"my_zero_head({head})(out)", got, want)
        if not torch.equal(given, out) and got is not given:
            raise WrongAnswer("the input was changed in place and a copy returned: do one or the other")
    correct("x[:, head] = 0 on the heads' outputs before W_O removes exactly that head's contribution")
