"""Moving training images by a fraction of a pixel: augmentation for small images read in patches.

scikit-learn's 8x8 digits are 4x4 block counts of 32x32 pen bitmaps, so the same digit written a
quarter or half a pixel to the side is as real a sample as the one in the data. Moving an image by
(dy, dx) pixels resamples it bilinearly: each output pixel is the area-weighted mix of the (up to)
four input pixels under it, with zeros coming in at the edges.

Why: the captioner had learnt its 1,258 training digit images by heart (the training loss sat at
label smoothing's floor long before the end), and moved ones it cannot. Moving half of each training
batch by up to half a pixel gained the most exact matches on digits-strips; moving every image, or by
up to a whole pixel, did less (docs/log.md, "Captioning").

Legend: B images, C channels, H height, W width.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def translate(x: Tensor, offsets: Tensor) -> Tensor:
    """Image i of x (B, C, H, W) moved down offsets[i, 0] and right offsets[i, 1] pixels, fractions
    resampled bilinearly, zeros coming in at the edges; whole-pixel offsets copy pixels (to rounding)."""
    b, _, h, w = x.shape
    offsets = offsets.to(x.device, torch.float32)
    # affine_grid's coordinates run from -1 to 1 over the image, so a pixel is 2 / size of them; an
    # output pixel reads the input at its own place minus the offset.
    theta = torch.zeros(b, 2, 3, device=x.device)  # (B, 2, 3): identity plus a translation
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = -2 * offsets[:, 1] / w
    theta[:, 1, 2] = -2 * offsets[:, 0] / h
    grid = F.affine_grid(theta, [b, 1, h, w], align_corners=False)  # (B, H, W, 2): where each pixel reads
    moved = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return moved.to(x.dtype)


def jitter_offsets(n: int, most: float, share: float, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) offsets (dy, dx), each uniform in [-most, most], for a `share` of the n images and
    (0, 0) for the rest: drawn for the whole global batch, so every process slices the same draw."""
    offsets = rng.uniform(-most, most, size=(n, 2))
    moved = rng.random(n) < share
    return np.where(moved[:, None], offsets, 0.0)


def jitter(x: Tensor, offsets: np.ndarray) -> Tensor:
    """x (B, C, H, W) with each image moved by its row of offsets (B, 2); images not moved stay
    bit for bit as they were (no resampling at all)."""
    moved = np.flatnonzero(np.any(offsets != 0, axis=1))
    if len(moved) == 0:
        return x
    out = x.clone()
    out[moved] = translate(x[moved], torch.from_numpy(offsets[moved]))
    return out
