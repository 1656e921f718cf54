"""Worked answers to lesson 2's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import math


def masked_mean(x, mask):
    m = mask[..., None].float()  # (B, T, 1)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def mean_with_padding(x, mask):
    return x.mean(1)


def simple_self_attention(x):
    return (x @ x.transpose(-2, -1)).softmax(-1) @ x


def scaled_self_attention(x):
    return (x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1])).softmax(-1) @ x


ANSWERS = {
    "ladder.check_masked_mean": (masked_mean, mean_with_padding, "padding"),
    "ladder.check_simple_self_attention": (simple_self_attention, scaled_self_attention, "scaled"),
}
