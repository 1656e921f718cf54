"""Layer normalization and RMS normalization.

Legend: B batch, T time, C channels (model width).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from attnlab.nn.options import BlockOptions


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dimension.

    mean and (biased) variance are taken over the C features of each position. `forward`
    runs PyTorch's fused kernel, which computes exactly this; `forward_math` is the formula
    written out, and the tests hold the two (and `torch.nn.LayerNorm`) equal.
    """

    init_role = "norm"  # models/common.init_weights resets it to the identity

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # beta

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def forward_math(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (B, T, 1), biased as in the paper
        y = (x - mean) * torch.rsqrt(var + self.eps)
        y = y * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich, 2019).

    LayerNorm without the mean subtraction and without beta: cheaper, and as good in practice
    (Llama, Gemma). `bias` is accepted for the registry's signature and ignored: there is none.
    """

    init_role = "norm"

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != self.weight.dtype:
            # Under bf16 autocast, QK-norm gets bf16 queries and keys while its gain stays float32:
            # F.rms_norm would fall back to its unfused path and print PyTorch's "Mismatch dtype
            # between input and weight" warning into sampled text. Normalizing in the gain's dtype
            # is what that fallback computes (forward and backward bit-identical, tested) without it.
            return F.rms_norm(x.to(self.weight.dtype), self.weight.shape, self.weight, self.eps).to(x.dtype)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def forward_math(self, x: Tensor) -> Tensor:
        ms = (x * x).mean(dim=-1, keepdim=True)  # (B, T, 1): mean square over the C features
        return x * torch.rsqrt(ms + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


# Norms by config name, each built from the block's options (d_model, ln_eps, bias, and any option a
# norm of its own adds with nn.options.add_block_option): a new one is a class and one line here.
NORMS: dict[str, Callable[[BlockOptions], nn.Module]] = {
    "layernorm": lambda c: LayerNorm(c.d_model, c.ln_eps, c.bias),
    "rmsnorm": lambda c: RMSNorm(c.d_model, c.ln_eps),
}


def build_norm(cfg: BlockOptions) -> nn.Module:
    """The norm cfg.norm_kind names, built from cfg."""
    if cfg.norm_kind not in NORMS:
        raise ValueError(f"unknown norm {cfg.norm_kind!r}; choose from {sorted(NORMS)}")
    return NORMS[cfg.norm_kind](cfg)
