"""Worked answers to lesson 5's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch

IGNORE = -100


def mlm_labels(ids, chosen):
    return torch.where(chosen, ids, IGNORE)


def mlm_labels_inverted(ids, chosen):
    return torch.where(chosen, IGNORE, ids)


def tag_accuracy(logits, labels):
    real = labels != IGNORE
    return ((logits.argmax(-1) == labels) & real).sum().item() / real.sum().item()


def tag_accuracy_with_padding(logits, labels):
    return (logits.argmax(-1) == labels).float().mean().item()


ANSWERS = {
    "encoders.check_mlm_labels": (mlm_labels, mlm_labels_inverted, "inverted"),
    "encoders.check_tag_accuracy": (tag_accuracy, tag_accuracy_with_padding, "padding"),
}
