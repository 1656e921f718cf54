"""Dense position-wise feed-forward networks: the plain MLP and the gated (GLU) variants.

Legend: B batch, T time, C model width, F hidden width (d_ff: usually 4C, 8C/3 for gated ones).

    plain ("mlp"):           FFN(x) = act(x W1 + b1) W2 + b2
    gated ("swiglu", "geglu"): FFN(x) = (act(x W_gate) * (x W1)) W2   (Shazeer 2020, "GLU Variants")

A gated feed-forward has three matrices instead of two; at F = 8C/3 it has the parameters and
compute of the plain one at 4C (the "2/3 rule" of PaLM and Llama). A mixture of experts (moe.py)
is made of these.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


# Dense feed-forwards by kind, each from (d_model, d_ff, activation, bias): the plain MLP uses the
# activation; a gated kind gates with its own (GATES).
def _gated(gate: str) -> Callable[[int, int, str, bool], nn.Module]:
    return lambda d_model, d_ff, activation, bias: GatedFeedForward(d_model, d_ff, gate, bias)


DENSE: dict[str, Callable[[int, int, str, bool], nn.Module]] = {
    "mlp": FeedForward,
    **{kind: _gated(gate) for kind, gate in GATES.items()},  # swiglu, geglu
}


def dense_feedforward(kind: str, d_model: int, d_ff: int, activation: str, bias: bool) -> nn.Module:
    """One dense feed-forward of a kind of DENSE: "mlp" (with `activation`), "swiglu" or "geglu"."""
    if kind not in DENSE:
        raise ValueError(f"unknown dense feed-forward {kind!r}; choose from {list(DENSE)}")
    return DENSE[kind](d_model, d_ff, activation, bias)


def default_width(kind: str, d_model: int, expert: str = "mlp") -> int:
    """The hidden width when the config gives none: 4C, or for gated kinds (and experts) 2/3 of it
    rounded up to a multiple of 8, so that the three matrices hold what the plain two would."""
    dense = expert if kind == "moe" else kind
    return 8 * math.ceil(d_model / 3) if dense in GATES else 4 * d_model
