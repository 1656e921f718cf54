"""What every family shares: the block-stack config fields, weight initialization, pooling."""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnlab.config import names, option
from attnlab.errors import AttnlabError
from attnlab.nn import POSITIONS, BlockConfig, BlockOptions, Stack, TokenEmbedding, build_positions, set_grad_checkpoint


class UnknownPreset(AttnlabError, KeyError):
    """A preset name the family lacks: an AttnlabError (one line on the command line) and the KeyError
    a lookup by name gives, with a message rather than the bare name."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


class Presets:
    """`Config.from_preset(name, **overrides)` for a family config whose module defines PRESETS."""

    @classmethod
    def from_preset(cls, name: str, **overrides):
        presets = sys.modules[cls.__module__].PRESETS
        if not isinstance(name, str) or name not in presets:
            near = difflib.get_close_matches(name, list(presets), n=1) if isinstance(name, str) else []
            raise UnknownPreset(
                f"unknown preset {name!r} for {cls.__name__}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + f"; choose from {', '.join(presets)}"
            )
        return replace(presets[name], **overrides)


@dataclass
class TransformerConfig(BlockOptions):
    """The stack of blocks: the block's options (nn/options.py, one schema for every family), how many
    blocks, how long a sequence, and the positions; families add their front end's and head's fields."""

    n_layer: int = option(4, "number of Transformer blocks")
    context: int = option(256, "longest sequence the model accepts (positions)")
    positions: str = option("learned", "position information", names(POSITIONS))
    rope_theta: float = option(10000.0, "base of the rotary positions' angles (Llama 3 uses 500000)")
    zero_init: bool = option(
        False,
        "start the projections that write into the residual stream at zero, so every block begins as the identity",
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("n_layer", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def block_config(self, causal: bool, cross_attention: bool = False) -> BlockConfig:
        return BlockConfig.of(self, causal, cross_attention)


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
            raise ValueError(
                f"a {h}x{w} image does not cut into {ph}x{pw} patches: "
                "choose a patch size that divides both sides (or resize the images)"
            )

    def check_grid_positions(self) -> None:
        """2-D sin/cos positions split the width in four (row and column, sin and cos)."""
        if POSITIONS[self.positions].on_grid and self.d_model % 4:
            raise ValueError(f"2-D sinusoidal positions need d_model divisible by 4, got {self.d_model}")


def positions(cfg: TransformerConfig, grid: tuple[int, int] | None = None, lead: int = 1) -> nn.Module:
    """The position scheme of cfg (ALiBi's slopes follow its heads, rotary's base its rope_theta);
    grid and lead: patches on a grid after `lead` tokens that are not (see build_positions)."""
    return build_positions(cfg.positions, cfg.context, cfg.d_model, grid, cfg.n_head, cfg.rope_theta, lead)


def text_body(model: nn.Module, cfg: TransformerConfig, vocab_size: int, causal: bool) -> None:
    """What every token-in Transformer has, set on `model` under the names its checkpoints use: the
    token embedding `tok`, the positions `pos`, dropout `drop`, the Stack `blocks` and its final `norm`."""
    model.tok = TokenEmbedding(vocab_size, cfg.d_model)
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
