"""Position-wise feed-forward network: FFN(x) = act(x W1 + b1) W2 + b2.

Legend: B batch, T time, C model width, F hidden width (d_ff, usually 4C).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {
    "relu": F.relu,  # max(0, x), as in "Attention Is All You Need"
    "gelu": F.gelu,  # exact GELU (BERT, ViT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's approximation
    # relu(x)^2 (So et al., 2021, "Primer"): sparse like ReLU, but smooth at 0 and growing
    # faster; in small language models it learns faster than GELU for the same compute.
    "relu2": lambda x: F.relu(x).square(),
}


class FeedForward(nn.Module):
    """Applied to every position separately and identically (the same W1, W2 for all T)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # W1: (C -> F)
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2: (F -> C)
        self.down.init_role = "residual_out"  # writes into the residual stream: scaled at init

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.down(ACTIVATIONS[self.activation](self.up(x)))


# Feed-forwards by config name: a new one (a gated feed-forward, a mixture of experts) is a class
# taking (d_model, d_ff, activation, bias) and one line here.
FEEDFORWARDS: dict[str, type[nn.Module]] = {"mlp": FeedForward}


def build_feedforward(kind: str, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True) -> nn.Module:
    if kind not in FEEDFORWARDS:
        raise ValueError(f"unknown feed-forward {kind!r}; choose from {sorted(FEEDFORWARDS)}")
    return FEEDFORWARDS[kind](d_model, d_ff, activation, bias)
