"""Worked answers to lesson 1's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import math

import torch


def scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def scores_unscaled(q, k):
    return q @ k.transpose(-2, -1)


def causal_mask(t):
    return torch.ones(t, t).tril().bool()


def causal_mask_inverted(t):
    return torch.ones(t, t).triu(1).bool()  # True on the future: the opposite convention


def attention(q, k, v, mask):
    s = scores(q, k).masked_fill(~mask, float("-inf"))
    return s.softmax(dim=-1) @ v


def attention_unmasked(q, k, v, mask):
    return scores(q, k).softmax(dim=-1) @ v


ANSWERS = {
    "attention.check_scores": (scores, scores_unscaled, "scaled"),
    "attention.check_causal_mask": (causal_mask, causal_mask_inverted, "inverted"),
    "attention.check_attention": (attention, attention_unmasked, "mask"),
}
