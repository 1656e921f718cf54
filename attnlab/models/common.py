"""What every family shares: the block-stack config fields, weight initialization, pooling."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnlab.config import option
from attnlab.nn import (
    ACTIVATIONS,
    FEEDFORWARDS,
    GATES,
    NORM_PLACES,
    NORMS,
    POSITIONS,
    BlockConfig,
    Stack,
    build_positions,
    default_width,
    set_grad_checkpoint,
)


class Presets:
    """`Config.from_preset(name, **overrides)` for a family config whose module defines PRESETS."""

    @classmethod
    def from_preset(cls, name: str, **overrides):
        presets = sys.modules[cls.__module__].PRESETS
        if name not in presets:
            raise KeyError(name)
        return replace(presets[name], **overrides)


@dataclass
class TransformerConfig:
    """The stack of blocks; families add their front end's and head's fields."""

    n_layer: int = option(4, "number of Transformer blocks")
    n_head: int = option(4, "attention heads per block")
    d_model: int = option(128, "model width (embedding size)")
    d_ff: int | None = option(None, "feed-forward hidden width (default 4 * d_model; 2/3 of that for "
                              "swiglu/geglu)")  # fmt: skip
    d_head: int | None = option(None, "width of each head (default d_model / n_head)")
    n_kv_head: int | None = option(None, "key/value heads shared by the query heads (grouped-query attention; "
                                   "default n_head, 1 = multi-query)")  # fmt: skip
    context: int = option(256, "longest sequence the model accepts (positions)")
    dropout: float = option(0.0, "dropout probability on attention, residuals and embeddings")
    norm: str = option("pre", "LayerNorm before each sublayer (pre) or after the residual (post)", NORM_PLACES)
    activation: str = option("gelu", "feed-forward activation", tuple(ACTIVATIONS))
    positions: str = option("learned", "position information", tuple(POSITIONS))
    rope_theta: float = option(10000.0, "base of the rotary positions' angles (Llama 3 uses 500000)")
    feedforward: str = option("mlp", "the feed-forward of each block", tuple(FEEDFORWARDS))
    n_experts: int = option(4, "experts in each mixture-of-experts feed-forward (--feedforward moe)")
    experts_per_token: int = option(2, "experts each token is routed to (top-k of the router)")
    expert_ff: str = option("mlp", "the feed-forward each expert is", ("mlp", *GATES))
    capacity_factor: float | None = option(None, "cap each expert at this many times its even share of the "
                                           "tokens; the rest are dropped (default: no cap)")  # fmt: skip
    aux_loss_weight: float = option(0.01, "weight of the experts' load-balancing loss in the training loss")
    norm_kind: str = option("layernorm", "the normalization of each block", tuple(NORMS))
    bias: bool = option(True, "biases in linear layers and norms")
    ln_eps: float = option(1e-5, "LayerNorm epsilon")
    qk_norm: bool = option(False, "RMS-normalize each head's queries and keys (QK-norm): steadier at high lr")
    zero_init: bool = option(False, "start the projections that write into the residual stream at zero, "
                             "so every block begins as the identity")  # fmt: skip

    def __post_init__(self):
        # d_ff and d_head stay None when derived, so overriding d_model in a preset re-derives them.
        for name in ("n_layer", "n_head", "d_model", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("d_ff", "d_head"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.d_head is None and self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}: set d_head")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head must divide n_head {self.n_head}, got {self.n_kv_head}")
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token must be 1..n_experts ({self.n_experts}), got {self.experts_per_token}")

    @property
    def ff_width(self) -> int:
        return self.d_ff or default_width(self.feedforward, self.d_model, self.expert_ff)

    @property
    def head_width(self) -> int:
        return self.d_head or self.d_model // self.n_head

    def block_config(self, causal: bool, cross_attention: bool = False) -> BlockConfig:
        return BlockConfig(
            d_model=self.d_model,
            n_heads=self.n_head,
            d_ff=self.ff_width,
            d_head=self.d_head,
            dropout=self.dropout,
            norm=self.norm,
            activation=self.activation,
            bias=self.bias,
            ln_eps=self.ln_eps,
            causal=causal,
            cross_attention=cross_attention,
            feedforward=self.feedforward,
            norm_kind=self.norm_kind,
            qk_norm=self.qk_norm,
            n_kv_heads=self.n_kv_head,
            n_experts=self.n_experts,
            experts_per_token=self.experts_per_token,
            expert_ff=self.expert_ff,
            capacity_factor=self.capacity_factor,
            aux_loss_weight=self.aux_loss_weight,
        )


class Checkpointing:
    """Mixed into every family: `model.grad_checkpoint = True` turns activation checkpointing on in
    each of its Stacks (as `set_grad_checkpoint(model, True)` does), so the training engine can set
    it on any model without knowing where its blocks are."""

    @property
    def grad_checkpoint(self) -> bool:
        return any(m.grad_checkpoint for m in self.modules() if isinstance(m, Stack))

    @grad_checkpoint.setter
    def grad_checkpoint(self, on: bool) -> None:
        set_grad_checkpoint(self, on)


class PatchGrid:
    """The patch geometry of an image model's config (ViT, the captioners), from its fields
    image_size (height), image_width (None: square), patch_size and patch_width (None: square)."""

    @property
    def size(self) -> tuple[int, int]:
        return self.image_size, self.image_width or self.image_size

    @property
    def patch(self) -> tuple[int, int]:
        """A patch's (height, width) in pixels."""
        return self.patch_size, getattr(self, "patch_width", None) or self.patch_size

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row: (H/Ph, W/Pw); patch k is cell (k // (W/Pw), k % (W/Pw))."""
        (h, w), (ph, pw) = self.size, self.patch
        return h // ph, w // pw

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def check_patches(self) -> None:
        (h, w), (ph, pw) = self.size, self.patch
        if h % ph or w % pw:
            raise ValueError(f"a {h}x{w} image does not cut into {ph}x{pw} patches: "
                             "choose a patch size that divides both sides (or resize the images)")  # fmt: skip

    def check_grid_positions(self) -> None:
        """2-D sin/cos positions split the width in four (row and column, sin and cos)."""
        if self.positions == "sinusoidal" and self.d_model % 4:
            raise ValueError(f"2-D sinusoidal positions need d_model divisible by 4, got {self.d_model}")


def positions(cfg: TransformerConfig, grid: tuple[int, int] | None = None, lead: int = 1) -> nn.Module:
    """The position scheme of cfg (ALiBi's slopes follow its heads, rotary's base its rope_theta);
    grid and lead: patches on a grid after `lead` tokens that are not (see build_positions)."""
    return build_positions(cfg.positions, cfg.context, cfg.d_model, grid, cfg.n_head, cfg.rope_theta, lead)


def text_body(model: nn.Module, cfg: TransformerConfig, vocab_size: int, causal: bool) -> None:
    """What every token-in Transformer has, set on `model` under the names its checkpoints use: the
    token embedding `tok`, the positions `pos`, dropout `drop`, the Stack `blocks` and its final `norm`."""
    model.tok = nn.Embedding(vocab_size, cfg.d_model)
    model.pos = positions(cfg)
    model.drop = nn.Dropout(cfg.dropout)
    model.blocks = Stack(cfg.block_config(causal=causal), cfg.n_layer)
    model.norm = model.blocks.final_norm()


def init_weights(model: nn.Module, n_layer: int, std: float = 0.02, zero_out: bool = False) -> None:
    """GPT-2's initialization: N(0, 0.02) for weights, zero biases, norms at identity.

    Each module says its role: projections that write into the residual stream (attention W_O,
    the feed-forward's second matrix) carry `init_role = "residual_out"` and are scaled by
    1/sqrt(2 * n_layer), so the residual's variance does not grow with depth; norms carry
    `init_role = "norm"` and reset themselves to the identity. zero_out=True starts those
    residual projections at exactly zero instead (modded-nanoGPT's choice): every block is then
    the identity at step 0, and its first gradients still reach it through W_O / W2 themselves.
    """
    for module in model.modules():
        role = getattr(module, "init_role", None)
        if isinstance(module, nn.Linear):
            scale = 1 / math.sqrt(2 * n_layer) if role == "residual_out" else 1.0
            scale = 0.0 if zero_out and role == "residual_out" else scale
            nn.init.normal_(module.weight, mean=0.0, std=std * scale)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif role == "norm":
            module.reset_parameters()


def pool(x: Tensor, how: str, real: Tensor | None = None) -> Tensor:
    """One vector per sequence for a classification head: x (B, T, C) -> (B, C), either the
    first position ([CLS], which attended to the whole sequence) or the mean over real tokens
    (real (B, T) bool; every position when None)."""
    if how == "cls":
        return x[:, 0]
    if real is None:
        return x.mean(1)
    w = real.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    return (x * w).sum(1) / w.sum(1).clamp(min=1)


def check_images(images: Tensor, channels: int, size: tuple[int, int]) -> None:
    """Image models take (B, C, H, W) of the size they were built for; say so plainly otherwise."""
    want = (channels, *size)
    if images.dim() != 4 or tuple(images.shape[1:]) != want:
        got = "x".join(map(str, images.shape[1:])) if images.dim() == 4 else f"a {images.dim()}-D tensor"
        shape = "x".join(map(str, want))
        raise ValueError(f"this model takes images of {shape} (channels x height x width), got {got}")
    if not torch.is_floating_point(images):
        raise ValueError(f"images must be floating point (values in [0, 1]), got {images.dtype}")
