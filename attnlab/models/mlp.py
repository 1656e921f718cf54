"""The image baseline: a multi-layer perceptron on the flattened pixels.

Legend: B batch, C channels, H x W image, L labels.

    image (B, C, H, W) -> flatten (B, C*H*W) -> [Linear, GELU, Dropout] x n_hidden -> Linear (B, L)

It sees every pixel at once but knows nothing of which pixels are neighbours: shift a digit
by one pixel and, to the MLP, it is a different input. The ViT gets neighbourhood from its
patches and positions; comparing the two on the same data is the point of `compare --task digits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import option
from attnlab.models.common import check_images


@dataclass
class MLPConfig:
    image_size: int = option(8, "image height in pixels (set from the data)")
    image_width: int | None = option(None, "image width in pixels (default: square)")
    channels: int = option(1, "colour channels (set from the data)")
    n_labels: int = option(10, "number of classes (set from the data)")
    hidden: int = option(256, "width of each hidden layer")
    n_hidden: int = option(2, "number of hidden layers")
    dropout: float = option(0.1, "dropout after each hidden layer")

    def __post_init__(self):
        for name in ("image_size", "channels", "n_labels", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_hidden < 0 or not 0 <= self.dropout < 1:
            raise ValueError("n_hidden must be >= 0 and dropout in [0, 1)")

    @property
    def size(self) -> tuple[int, int]:
        return self.image_size, self.image_width or self.image_size


class ImageMLP(nn.Module):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        self.cfg = cfg
        width = cfg.channels * cfg.size[0] * cfg.size[1]
        layers: list[nn.Module] = []
        for _ in range(cfg.n_hidden):
            layers += [nn.Linear(width, cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout)]
            width = cfg.hidden
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(width, cfg.n_labels)

    def forward(self, images: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """images (B, C, H, W) -> logits (B, L); with labels (B,) also the cross-entropy."""
        check_images(images, self.cfg.channels, self.cfg.size)
        logits = self.out(self.body(images.flatten(1)))  # (B, C*H*W) -> (B, L)
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits.float(), labels)
