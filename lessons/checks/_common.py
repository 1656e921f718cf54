"""What every check shares: the error a wrong answer raises, the `exercise` wrapper, tensor comparison.

A check is `@exercise`-wrapped: it calls the learner's answer, raises WrongAnswer with a message that says
what is wrong, or prints one line starting with "Correct". If the answer still raises NotImplementedError
(the stub as the lesson ships it), the check prints how to start and returns: the lesson runs on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


class WrongAnswer(AssertionError):
    """The learner's answer is wrong; the message says how (shape, which entry, masking, scaling...)."""


def exercise(check: Callable) -> Callable:
    """Wrap a check so an unfilled stub (NotImplementedError) prints a hint instead of failing the notebook."""

    @functools.wraps(check)
    def run(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except NotImplementedError:
            print(f"{check.__name__}: not done yet. Fill in the function above and run this cell again.")
            return None

    return run


def correct(what: str) -> None:
    print(f"Correct: {what}")


def as_tensor(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise WrongAnswer(f"{name} should be a torch.Tensor, got {type(value).__name__}")
    return value


def compare(name: str, got, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Raise WrongAnswer unless `got` matches `want`: first the shape, then the first entry that differs."""
    got = as_tensor(got, name)
    if tuple(got.shape) != tuple(want.shape):
        raise WrongAnswer(f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got, want = got.detach().double(), want.detach().double()
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        where = tuple(int(i) for i in (~torch.isfinite(got)).nonzero()[0])
        raise WrongAnswer(f"{name} has a non-finite entry at {where}: {got[where].item()}")
    bad = ~torch.isclose(got, want, atol=atol, rtol=rtol)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise WrongAnswer(
            f"{name} differs at index {where}: got {got[where].item():.6g}, expected {want[where].item():.6g}"
            f" ({int(bad.sum())} of {bad.numel()} entries differ)"
        )
