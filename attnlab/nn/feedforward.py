"""The feed-forward of a block, by config name: a dense one (dense.py), a mixture of experts (moe.py),
or none (attention-only blocks). A new kind is a function of the BlockConfig and one FEEDFORWARDS line."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnlab.nn.dense import ACTIVATIONS, GATES, FeedForward, GatedFeedForward, default_width, dense_feedforward
from attnlab.nn.moe import MixtureOfExperts

if TYPE_CHECKING:
    from attnlab.nn.options import BlockConfig

__all__ = [
    "ACTIVATIONS",
    "FEEDFORWARDS",
    "GATES",
    "FeedForward",
    "GatedFeedForward",
    "build_feedforward",
    "default_width",
    "dense_feedforward",
]


def _moe(cfg: BlockConfig) -> nn.Module:
    return MixtureOfExperts.from_block(cfg)


class NoFeedForward(nn.Module):
    """No feed-forward at all: the block adds nothing after attention. An attention-only model
    (Elhage et al. 2021) is the simplest place to watch heads such as induction heads form."""

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> zeros (B, T, C)
        return torch.zeros_like(x)


# Feed-forwards by config name, each built from the BlockConfig: a new one is a function (or a
# class's constructor) taking it, and one line here.
def _dense(kind: str) -> Callable[[BlockConfig], nn.Module]:
    return lambda c: dense_feedforward(kind, c.d_model, c.ff_width, c.activation, c.bias)


FEEDFORWARDS: dict[str, Callable[[BlockConfig], nn.Module]] = {
    **{kind: _dense(kind) for kind in ("mlp", *GATES)},  # mlp, swiglu, geglu
    "moe": _moe,  # experts of the dense kind c.expert_ff
    "none": lambda c: NoFeedForward(),  # attention-only blocks
}


def build_feedforward(cfg: BlockConfig) -> nn.Module:
    if cfg.feedforward not in FEEDFORWARDS:
        raise ValueError(f"unknown feed-forward {cfg.feedforward!r}; choose from {sorted(FEEDFORWARDS)}")
    return FEEDFORWARDS[cfg.feedforward](cfg)
