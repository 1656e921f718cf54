"""Worked answers to lesson 6's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch


def patchify(images, p):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)  # (B, C, H/p, p, W/p, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def patchify_channels_last(images, p):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)  # channel last in each patch
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def cls_map(patterns, grid):
    return patterns[:, :, 0, 1:].reshape(*patterns.shape[:2], *grid)


def cls_map_column(patterns, grid):
    return patterns[:, :, 1:, 0].reshape(*patterns.shape[:2], *grid)  # who looks at [CLS], not where it looks


def rollout(patterns):
    t = patterns.shape[-1]
    out = torch.eye(t)
    for layer in patterns:  # (H, T, T)
        mixed = 0.5 * torch.eye(t) + 0.5 * layer.mean(0)
        out = mixed @ out
    return out


def rollout_wrong_order(patterns):
    t = patterns.shape[-1]
    out = torch.eye(t)
    for layer in patterns:
        out = out @ (0.5 * torch.eye(t) + 0.5 * layer.mean(0))
    return out


ANSWERS = {
    "images.check_patchify": (patchify, patchify_channels_last, "channel"),
    "images.check_cls_map": (cls_map, cls_map_column, "row 0"),
    "images.check_rollout": (rollout, rollout_wrong_order, "order"),
}
