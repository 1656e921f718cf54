"""Worked answers to lesson 4's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch


def temperature(logits, t):
    return torch.softmax(logits / t, -1)


def temperature_multiplied(logits, t):
    return torch.softmax(logits * t, -1)


def top_k(logits, k):
    kth = logits.topk(k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_off_by_one(logits, k):
    return top_k(logits, k + 1)


def top_p(logits, p):
    probs, order = torch.softmax(logits, -1).sort(descending=True)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
    drop = torch.zeros_like(logits, dtype=torch.bool)
    drop[order] = before >= p
    return logits.masked_fill(drop, float("-inf"))


def top_p_without_top(logits, p):
    probs, order = torch.softmax(logits, -1).sort(descending=True)
    drop = torch.zeros_like(logits, dtype=torch.bool)
    drop[order] = probs.cumsum(-1) > p  # drops the token that crosses p, and the top one when it alone does
    return logits.masked_fill(drop, float("-inf"))


ANSWERS = {
    "sampling.check_temperature": (temperature, temperature_multiplied, "divide"),
    "sampling.check_top_k": (top_k, top_k_off_by_one, "keeps"),
    "sampling.check_top_p": (top_p, top_p_without_top, "keeps"),
}
