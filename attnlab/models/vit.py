"""Vision Transformer: an image is a sequence of patches (Dosovitskiy et al., 2021).

Legend: B batch, C channels, H x W image, P patch side, N = (H/P)(W/P) patches, T = N + 1,
D model width, L labels.

    image (B, C, H, W) -> cut into N patches of P x P, each flattened to C*P*P numbers
    -> linear projection to D (the patch "token embeddings")
    -> [CLS] + patches, plus positions -> the shared Stack of blocks (nn/stack.py, no mask)
    -> final LayerNorm -> the encoder's classification head on [CLS] (or the mean) -> (B, L)

Cutting, flattening and one shared linear map is exactly a convolution with kernel P and
stride P, so the fast path is `conv2d` with the same weight, reshaped; both are kept because
the first is how the idea is taught, and a test holds them equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import option
from attnlab.models.common import (
    Checkpointing,
    PatchGrid,
    Presets,
    TransformerConfig,
    check_images,
    init_weights,
    pool,
    positions,
)
from attnlab.models.protocols import Positioned
from attnlab.nn import Context, Stack
from attnlab.nn.position import Positions

PATCH_PATHS = ("conv", "linear")


@dataclass
class ViTConfig(TransformerConfig, Presets, PatchGrid):
    image_size: int = option(224, "image height in pixels (set from the data when training)")
    image_width: int | None = option(None, "image width in pixels (default: square, as image_size)")
    channels: int = option(3, "colour channels: 1 gray, 3 RGB (set from the data when training)")
    patch_size: int = option(16, "side P of the square patches: the image becomes (H/P) x (W/P) tokens")
    n_labels: int = option(1000, "number of classes (set from the data when training)")
    pooling: str = option("cls", "what the head reads: the [CLS] token or the mean of all tokens", ("cls", "mean"))
    patch_embed: str = option(
        "conv",
        "patch projection: strided convolution (fast) or cut-flatten-linear (as taught); same weights, same result",
        PATCH_PATHS,
    )
    label_smoothing: float = option(
        0.1, "label smoothing of the training loss (DeiT: 0.1); validation and test losses are plain cross-entropy"
    )
    context: int = option(0, "tokens per image, 1 + patches (derived from the sizes)")

    def __post_init__(self):
        for name in ("image_size", "channels", "patch_size", "n_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        self.check_patches()
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.patch_embed not in PATCH_PATHS:
            raise ValueError(f"patch_embed must be one of {PATCH_PATHS}, got {self.patch_embed!r}")
        self.context = 1 + self.n_patches  # derived, whatever was stored
        super().__post_init__()
        self.check_grid_positions()


def _paper(n_layer: int, d_model: int, n_head: int, patch: int, d_ff: int) -> ViTConfig:
    # The paper's ImageNet models: 224 x 224 RGB, 1,000 classes, pre-norm, GELU, LayerNorm eps 1e-6.
    return ViTConfig(n_layer=n_layer, n_head=n_head, d_model=d_model, d_ff=d_ff, patch_size=patch, ln_eps=1e-6)


def _cpu(n_layer: int, d_model: int) -> ViTConfig:
    # Sized here for the 8 x 8 digits; training takes the image size, channels, classes (and the
    # patch size) from the data. Dropout, because a few thousand images are soon memorized.
    return ViTConfig(
        n_layer=n_layer, n_head=4, d_model=d_model, dropout=0.1, image_size=8, channels=1, patch_size=4, n_labels=10
    )


# The paper's presets follow its table 1.
PRESETS: dict[str, ViTConfig] = {
    "vit-nano": _cpu(4, 64),
    "vit-micro": _cpu(6, 128),
    "vit-base/16": _paper(12, 768, 12, 16, 3072),
    "vit-large/16": _paper(24, 1024, 16, 16, 4096),
    "vit-huge/14": _paper(32, 1280, 16, 14, 5120),
}
PAPER_PARAMS = {"vit-base/16": 86e6, "vit-large/16": 307e6, "vit-huge/14": 632e6}


def patchify(images: Tensor, p: int | tuple[int, int]) -> Tensor:
    """(B, C, H, W) -> (B, N, C*Ph*Pw) for patches of Ph x Pw (p: an int for square ones): patch k is
    grid cell (k // (W/Pw), k % (W/Pw)), row-major, and its vector lists channel, then row, then
    column inside the patch."""
    ph, pw = (p, p) if isinstance(p, int) else p
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // ph, ph, w // pw, pw)  # (B, C, H/Ph, Ph, W/Pw, Pw)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/Ph, W/Pw, C, Ph, Pw)
    return x.reshape(b, (h // ph) * (w // pw), c * ph * pw)  # (B, N, C*Ph*Pw)


class PatchEmbedding(nn.Module):
    """Each Ph x Pw patch -> a D-vector by one shared linear map (held as a conv kernel (D, C, Ph, Pw)).

    stem > 0 puts a 3 x 3 convolution with that many channels (and a GELU) before the patches: the
    ViT paper's hybrid, where patches are cut from a feature map rather than from the pixels. Each
    patch then also sees one pixel around it, and its features no longer change wholesale when a
    stroke moves by a pixel across a patch border.
    """

    def __init__(self, channels: int, patch: int | tuple[int, int], d_model: int, path: str = "conv", stem: int = 0):
        super().__init__()
        self.patch, self.path = patch, path
        self.stem = nn.Sequential(nn.Conv2d(channels, stem, 3, padding=1), nn.GELU()) if stem else None
        # PyTorch's default conv init scales by 1/sqrt(C*Ph*Pw), the fan-in of the linear map.
        self.proj = nn.Conv2d(stem or channels, d_model, kernel_size=patch, stride=patch)

    def forward(self, images: Tensor) -> Tensor:
        if self.stem is not None:
            images = self.stem(images)  # (B, S, H, W)
        if self.path == "linear":
            weight = self.proj.weight.flatten(1)  # (D, C*Ph*Pw), same element order as patchify
            return F.linear(patchify(images, self.patch), weight, self.proj.bias)  # (B, N, D)
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, D, H/Ph, W/Pw) -> (B, N, D)


class ViT(Checkpointing, Positioned, nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.patches = PatchEmbedding(cfg.channels, cfg.patch_size, cfg.d_model, cfg.patch_embed)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model))  # learned [CLS] token
        self.pos = positions(cfg, grid=cfg.grid)  # sinusoidal: 2-D
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = Stack(cfg.block_config(causal=False), cfg.n_layer)
        self.norm = self.blocks.final_norm()
        self.out = nn.Linear(cfg.d_model, cfg.n_labels)
        init_weights(self, cfg.n_layer, zero_out=cfg.zero_init)
        nn.init.normal_(self.cls, std=0.02)
        nn.init.zeros_(self.out.weight)  # the paper's zero-initialized head: no class favoured at step 0

    def input_positions(self) -> tuple[Positions, str]:
        return self.pos, ""

    def hidden(self, images: Tensor, return_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Final hidden states (B, T, D) of images (B, C, H, W), and each layer's attention
        (B, H, T, T) if asked; token 0 is [CLS], token 1 + k is patch k."""
        check_images(images, self.cfg.channels, self.cfg.size)
        x = self.patches(images)  # (B, N, D)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # (B, T, D)
        x = self.drop(self.pos(x))
        ctx = Context(positions=self.pos, return_weights=return_weights)  # no mask: every patch sees every patch
        x, weights = self.blocks(x, ctx)
        return self.norm(x), weights["self"]

    def forward(self, images: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """images (B, C, H, W) in [0, 1] -> logits (B, L); with labels (B,) also the cross-entropy."""
        x, _ = self.hidden(images)
        logits = self.out(pool(x, self.cfg.pooling))  # (B, L)
        if labels is None:
            return logits
        smoothing = self.cfg.label_smoothing if self.training else 0.0  # a target spread over the other classes
        return logits, F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)

    @torch.no_grad()
    def attention(self, images: Tensor) -> list[Tensor]:
        """The attention probabilities of every layer: a list of (B, H, T, T) tensors."""
        return self.hidden(images, return_weights=True)[1]
