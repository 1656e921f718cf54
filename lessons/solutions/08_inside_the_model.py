"""Worked answers to lesson 8's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch


def previous_token(patterns):
    # the sub-diagonal: query t's weight on key t - 1, for t = 1 .. T-1
    return torch.diagonal(patterns, offset=-1, dim1=-2, dim2=-1).mean(-1)


def previous_token_own_position(patterns):
    return torch.diagonal(patterns, dim1=-2, dim2=-1)[..., 1:].mean(-1)  # the diagonal: the query itself


def induction(patterns, half):
    t = patterns.shape[-1]
    queries = torch.arange(half, t)
    return patterns[..., queries, queries - half + 1].mean(-1)


def induction_same_token(patterns, half):
    t = patterns.shape[-1]
    queries = torch.arange(half, t)
    return patterns[..., queries, queries - half].mean(-1)  # the earlier copy itself, one too early


def zero_head(head):
    def hook(x):
        x = x.clone()
        x[:, head] = 0
        return x

    return hook


def zero_time_step(head):
    def hook(x):
        x = x.clone()
        x[:, :, head] = 0  # dimension 2 is time, not heads
        return x

    return hook


ANSWERS = {
    "inside.check_previous_token": (previous_token, previous_token_own_position, "diagonal"),
    "inside.check_induction": (induction, induction_same_token, "after"),
    "inside.check_zero_head": (zero_head, zero_time_step, "time step"),
}
