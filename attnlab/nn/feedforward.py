"""Position-wise feed-forward networks.

Legend: B batch, T time, C model width, F hidden width (d_ff: usually 4C, 8C/3 for gated ones).

    plain ("mlp"):           FFN(x) = act(x W1 + b1) W2 + b2
    gated ("swiglu", "geglu"): FFN(x) = (act(x W_gate) * (x W1)) W2   (Shazeer 2020, "GLU Variants")

A gated feed-forward has three matrices instead of two; at F = 8C/3 it has the parameters and
compute of the plain one at 4C (the "2/3 rule" of PaLM and Llama).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {
    "relu": F.relu,  # max(0, x), as in "Attention Is All You Need"
    "gelu": F.gelu,  # exact GELU (BERT, ViT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's approximation
    # relu(x)^2 (So et al., 2021, "Primer"): sparse like ReLU, but smooth at 0 and growing
    # faster; in small language models it learns faster than GELU for the same compute.
    "relu2": lambda x: F.relu(x).square(),
    "silu": F.silu,  # x * sigmoid(x), "swish": the gate of SwiGLU
}

if TYPE_CHECKING:
    from attnlab.nn.block import BlockConfig


def checked(activation: str) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    return activation


class FeedForward(nn.Module):
    """Applied to every position separately and identically (the same W1, W2 for all T)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.activation = checked(activation)
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # W1: (C -> F)
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2: (F -> C)
        self.down.init_role = "residual_out"  # writes into the residual stream: scaled at init

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.down(ACTIVATIONS[self.activation](self.up(x)))


class GatedFeedForward(nn.Module):
    """A GLU-variant feed-forward: the activation of one projection gates another, elementwise.
    SwiGLU (gate silu, Llama, Mistral) and GeGLU (gate gelu, Gemma) differ in the gate only."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        self.activation = checked(activation)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)  # W_gate: (C -> F)
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # W1: (C -> F)
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2: (F -> C)
        self.down.init_role = "residual_out"

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.down(ACTIVATIONS[self.activation](self.gate(x)) * self.up(x))


# The activation each gated kind gates with (its config's `activation` is not used).
GATES = {"swiglu": "silu", "geglu": "gelu_tanh"}


def dense_feedforward(kind: str, d_model: int, d_ff: int, activation: str, bias: bool) -> nn.Module:
    """One dense feed-forward of a kind: "mlp" (with `activation`) or a key of GATES."""
    if kind in GATES:
        return GatedFeedForward(d_model, d_ff, GATES[kind], bias)
    if kind == "mlp":
        return FeedForward(d_model, d_ff, activation, bias)
    raise ValueError(f"unknown dense feed-forward {kind!r}; choose from {['mlp', *GATES]}")


def default_width(kind: str, d_model: int, expert: str = "mlp") -> int:
    """The hidden width when the config gives none: 4C, or for gated kinds (and experts) 2/3 of it
    rounded up to a multiple of 8, so that the three matrices hold what the plain two would."""
    dense = expert if kind == "moe" else kind
    return 8 * math.ceil(d_model / 3) if dense in GATES else 4 * d_model


def _moe(cfg: BlockConfig) -> nn.Module:
    from attnlab.nn.moe import MixtureOfExperts  # it builds its experts from this module

    return MixtureOfExperts.from_block(cfg)


class NoFeedForward(nn.Module):
    """No feed-forward at all: the block adds nothing after attention. An attention-only model
    (Elhage et al. 2021) is the simplest place to watch heads such as induction heads form."""

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> zeros (B, T, C)
        return torch.zeros_like(x)


# Feed-forwards by config name, each built from the BlockConfig: a new one is a function (or a
# class's constructor) taking it, and one line here.
def _dense(kind: str) -> Callable[[BlockConfig], nn.Module]:
    return lambda c: dense_feedforward(kind, c.d_model, c.d_ff, c.activation, c.bias)


FEEDFORWARDS: dict[str, Callable[[BlockConfig], nn.Module]] = {
    **{kind: _dense(kind) for kind in ("mlp", *GATES)},  # mlp, swiglu, geglu
    "moe": _moe,  # experts of the dense kind c.expert_ff
    "none": lambda c: NoFeedForward(),  # attention-only blocks
}


def build_feedforward(cfg: BlockConfig) -> nn.Module:
    if cfg.feedforward not in FEEDFORWARDS:
        raise ValueError(f"unknown feed-forward {cfg.feedforward!r}; choose from {sorted(FEEDFORWARDS)}")
    return FEEDFORWARDS[cfg.feedforward](cfg)
