"""A user's own image made to look like a run's training images: its size, and its polarity.

A model trained on scikit-learn's digits has only seen light strokes on a black 8x8 field. A
digit drawn black on white at 64x64 is read at the run's size (resized, as every image is) and,
when the training images share one plain background and the user's image has the opposite one,
inverted (1 - pixel) so that the strokes are light again: without that the model reads a white
field it never saw and answers at random. Both are said in one warning line. Training data
without a plain background (photos) records none, and then nothing is inverted.

Legend: N images, C channels, H height, W width.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

PLAIN = 0.15  # the largest spread of the images' border shades for a background to count as one


def border_shade(images: np.ndarray) -> np.ndarray:
    """(N,) the mean of each image's outer ring of pixels, 0 black .. 1 white; images (N, C, H, W)."""
    x = np.asarray(images, dtype=np.float32)
    ring = np.concatenate([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], axis=-1)  # (N, C, 2H+2W)
    return ring.reshape(len(x), -1).mean(1)


def background(images: np.ndarray) -> float | None:
    """The shade of the plain background the images share (digits: about 0), or None when they
    share none; images (N, C, H, W) in [0, 1]."""
    if len(images) == 0:
        return None
    shades = border_shade(images)
    return round(float(shades.mean()), 3) if float(shades.std()) <= PLAIN else None


def _tone(shade: float) -> str:
    return "light on dark" if shade < 0.5 else "dark on light"


def fit_polarity(
    x: np.ndarray, own: tuple[int, int], size: tuple[int, int], trained: float | None, path: str | Path
) -> np.ndarray:
    """`x` (C, H, W) at the run's size, inverted when its background is the opposite of the
    training images' plain one; one warning line says what was done (resized `own` to `size`,
    inverted), or nothing when the image already looked like the training data."""
    notes = []
    if tuple(own) != tuple(size):
        notes.append(f"resized {own[1]}x{own[0]} to {size[1]}x{size[0]}")
    shade = float(border_shade(x[None])[0])
    if trained is not None and (shade < 0.5) != (trained < 0.5):
        x = 1.0 - x
        notes.append(f"the image is {_tone(shade)} while the training images were {_tone(trained)}: inverted it")
    if notes:
        warnings.warn(f"{path}: {'; '.join(notes)} (see docs/vision.md, 'An image for predict')", stacklevel=3)
    return np.ascontiguousarray(x, dtype=np.float32)
