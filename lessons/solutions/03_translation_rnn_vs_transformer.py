"""Worked answers to lesson 3's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch

from attnlab.data.batches import BOS_ID, EOS_ID


def teacher_forcing(target_ids):
    return [BOS_ID, *target_ids], [*target_ids, EOS_ID]


def teacher_forcing_swapped(target_ids):
    return [*target_ids, EOS_ID], [BOS_ID, *target_ids]


def additive_attention(query, keys, values, mask, v):
    scores = torch.tanh(keys + query[:, None, :]) @ v  # (B, S)
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return (weights[:, None, :] @ values)[:, 0], weights


def additive_attention_unmasked(query, keys, values, mask, v):
    weights = (torch.tanh(keys + query[:, None, :]) @ v).softmax(-1)
    return (weights[:, None, :] @ values)[:, 0], weights


ANSWERS = {
    "translation.check_teacher_forcing": (teacher_forcing, teacher_forcing_swapped, "swapped"),
    "translation.check_additive_attention": (additive_attention, additive_attention_unmasked, "padding"),
}
