"""Checks for lesson 6 (images): cutting an image into patches, [CLS]'s map over them, attention rollout."""

from __future__ import annotations

import torch

from attnlab.interpret.patches import cls_maps
from attnlab.interpret.rollout import rollout
from attnlab.models.vit import patchify
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


def _images(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2, 3, 8, 12, generator=g)  # (B, C, H, W): RGB, not square, so mix-ups show


def _patterns(seed: int = 0, layers: int = 3, heads: int = 2, t: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, heads, t, t, generator=g).softmax(-1)  # (L, H, T, T), rows sum to 1


@exercise
def check_patchify(my_patchify) -> None:
    """my_patchify(images (B, C, H, W), p) -> (B, N, C*p*p), patches row by row, each listing channel, row, column."""
    images, p = _images(), 4
    got = as_tensor(my_patchify(images, p), "my_patchify(images, 4)")
    want = patchify(images, p)  # (2, 6, 48)
    if got.shape == want.shape and not torch.allclose(got, want):
        # The usual slips, each told apart by rebuilding it.
        b, c, h, w = images.shape
        grid = images.reshape(b, c, h // p, p, w // p, p)
        channels_last = grid.permute(0, 2, 4, 3, 5, 1).reshape(b, -1, c * p * p)
        by_column = grid.permute(0, 4, 2, 1, 3, 5).reshape(b, -1, c * p * p)
        if torch.allclose(got, channels_last):
            raise WrongAnswer(
                "each patch lists its pixels with the channel last: list channel first, then row, "
                "then column (permute to (B, H/p, W/p, C, p, p))"
            )
        if torch.allclose(got, by_column):
            raise WrongAnswer(
                "the patches go down the columns first: number them row by row (left to right, then the next row)"
            )
    compare("my_patchify(images, 4)", got, want)
    correct(f"an 8x12 RGB image becomes {want.shape[1]} patches of {want.shape[2]} numbers each")


@exercise
def check_cls_map(my_cls_map) -> None:
    """my_cls_map(patterns (L, H, T, T), grid (gh, gw)) -> (L, H, gh, gw): [CLS]'s attention on each patch."""
    grid = (2, 3)
    patterns = _patterns(t=1 + 6)
    got = as_tensor(my_cls_map(patterns, grid), "my_cls_map(patterns, (2, 3))")
    want = torch.from_numpy(cls_maps(patterns.numpy(), grid))
    if got.shape == want.shape and torch.allclose(got, patterns[:, :, 1:, 0].reshape(want.shape)):
        raise WrongAnswer(
            "that is the column of [CLS] (how much each patch looked at [CLS]): take row 0, the "
            "attention [CLS] gives to each patch"
        )
    if tuple(got.shape) == tuple(want.shape[:2]) + (7,) or got.numel() == patterns[:, :, 0].numel():
        raise WrongAnswer("keep only the patches: drop key 0 ([CLS] looking at itself) before the reshape")
    compare("my_cls_map(patterns, (2, 3))", got, want)
    correct("row 0 of each pattern, without [CLS] itself, laid out on the patch grid")


@exercise
def check_rollout(my_rollout) -> None:
    """my_rollout(patterns (L, H, T, T)) -> (T, T): attention rollout with half the weight on the residual path."""
    patterns = _patterns()
    got = as_tensor(my_rollout(patterns), "my_rollout(patterns)")
    want = torch.from_numpy(rollout(patterns.numpy(), 0.5))
    if got.shape == want.shape and not torch.allclose(got.double(), want, atol=1e-5):
        mixed = 0.5 * torch.eye(7) + 0.5 * patterns.double().mean(1)  # (L, T, T)
        wrong_order = torch.eye(7, dtype=torch.float64)
        for layer in mixed:
            wrong_order = wrong_order @ layer  # first layer on the left: the wrong way round
        no_residual = torch.eye(7, dtype=torch.float64)
        for layer in patterns.double().mean(1):
            no_residual = layer @ no_residual
        if torch.allclose(got.double(), wrong_order, atol=1e-5):
            raise WrongAnswer(
                "the layers are multiplied in the wrong order: a later layer acts on what the "
                "earlier ones produced, so it goes on the left (A_L @ ... @ A_1)"
            )
        if torch.allclose(got.double(), no_residual, atol=1e-5):
            raise WrongAnswer("the residual path is missing: mix each layer as 0.5 * I + 0.5 * (mean of heads)")
        if not torch.allclose(got.double().sum(-1), torch.ones(7, dtype=torch.float64), atol=1e-4):
            raise WrongAnswer("the rows of a rollout sum to 1: mix each layer as 0.5 * I + 0.5 * (mean over heads)")
    compare("my_rollout(patterns)", got, want.to(got.dtype) if isinstance(got, torch.Tensor) else want)
    correct("rollout = A_L @ ... @ A_1 with A_l = 0.5 I + 0.5 mean_heads(W_l)")
