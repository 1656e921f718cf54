"""Images with captions: the built-in digits-strips, or a user's folder with a captions.jsonl.

    digits-strips            2 to 4 handwritten digits side by side, captioned "seventy-four" (strips.py)
    FOLDER                   FOLDER/captions.jsonl, image paths relative to FOLDER
    FILE.jsonl               the same lines, image paths relative to the file's folder

Each line of a captions file is {"image": "cats/1.png", "caption": "a cat on a mat"}; an image
with several captions has several lines. User data is cut into train/val/test by image, not by
line, so no split sees another split's image under a different caption. Every image is read
to one size and channel count (images.py's helpers), as the model needs.

Legend: N captioned images (an image once per caption), C channels, H height, W width.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.config import check_fraction, option
from attnlab.data import strips
from attnlab.data.images import _fit, read_image
from attnlab.data.labeled import _json_row, open_data
from attnlab.errors import AttnlabError

BUILTIN_CAPTIONS = ("digits-strips",)
CAPTION_SPLITS = ("train", "val", "test")
CAPTIONS_FILE = "captions.jsonl"

Captioned = tuple[np.ndarray, list[str]]  # images (N, C, H, W) float32 in [0, 1], and their captions


@dataclass
class CaptionDataConfig:
    data: str = option(
        "digits-strips",
        "digits-strips (handwritten digits side by side captioned with the number in words, no download), "
        f'a folder with images and a {CAPTIONS_FILE} of lines {{"image": PATH, "caption": TEXT}}, '
        "or such a .jsonl file (image paths relative to it)",
    )
    vocab_size: int = option(1000, "words kept in the caption vocabulary, most frequent first")
    max_len: int = option(32, "tokens per caption; longer captions are cut")
    val_fraction: float = option(0.1, "share of a folder's images held out for validation (not digits-strips)")
    test_fraction: float = option(0.1, "share of a folder's images held out for testing (not digits-strips)")
    image_size: int | None = option(
        None,
        "resize images to this height, the width in the data's most common proportion "
        "(default: the data's own size, the most common one if they differ)",
    )
    data_seed: int = option(0, "seed of the digits-strips and of a folder's train/val/test cut")
    n_train: int = option(strips.DEFAULT_COUNTS["train"], "digits-strips: strips to train on")
    n_test: int = option(strips.DEFAULT_COUNTS["test"], "digits-strips: strips to test on")
    # Measured on digits-strips: see data/jitter.py.
    shift: float = option(
        0.5, "training only: move images by up to this many pixels each way, fractions resampled bilinearly (0 = off)"
    )
    shift_share: float = option(0.5, "training only: the share of each batch's images that --shift moves")

    def __post_init__(self):
        check_fraction(self, "val_fraction", "test_fraction")
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError("val_fraction + test_fraction must be below 1: some images must be left to train on")
        for name in ("vocab_size", "max_len", "n_train", "n_test"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be at least 1, got {self.image_size}")
        if not 0 <= self.shift < math.inf:
            raise ValueError(f"shift must be a finite number of pixels, 0 or more, got {self.shift}")
        if not 0 <= self.shift_share <= 1:
            raise ValueError(f"shift_share must be in [0, 1], got {self.shift_share}")


def load_captions(
    cfg: CaptionDataConfig, size: tuple[int, int] | None = None, channels: int | None = None
) -> dict[str, Captioned]:
    """{"train", "val", "test"} -> (images (N, C, H, W), captions). A trained run passes its
    `size` and `channels` so that other data fits its model; else cfg.image_size decides."""
    if cfg.data in BUILTIN_CAPTIONS:
        counts = {"train": cfg.n_train, "test": cfg.n_test}
        made = {name: strips.strips(name, counts.get(name), cfg.data_seed) for name in CAPTION_SPLITS}
        splits = {name: strips.as_arrays(made[name]) for name in CAPTION_SPLITS}
        if size is None and channels is None and cfg.image_size is None:
            return splits
        shape = splits["train"][0].shape[2:]
        size = size or _scaled(cfg.image_size, [shape]) or shape
        return {name: (_fit(x, size, channels or x.shape[1], quiet=True), c) for name, (x, c) in splits.items()}
    return _load_user(cfg, size, channels)


def _scaled(height: int | None, shapes: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(height, width) keeping the most common (H, W)'s proportion, or None when no height is asked."""
    if height is None:
        return None
    h, w = Counter(shapes).most_common(1)[0][0]  # ties: the first seen, as images._fit
    return height, max(1, round(height * w / h))


# ---- a user's folder ---------------------------------------------------------------------------


def _load_user(cfg: CaptionDataConfig, size, channels) -> dict[str, Captioned]:
    lines, source = read_captions(cfg.data)
    names = list(dict.fromkeys(name for name, _ in lines))  # each image once, in file order
    images = [_read(source, name) for name in names]  # each (C, H, W), sizes may differ
    asked = size is not None or cfg.image_size is not None  # resizing asked for: no warning
    size = size or _scaled(cfg.image_size, [x.shape[1:] for x in images])
    stacked = _fit(images, size, channels, quiet=asked)  # (images, C, H, W)
    row = {name: i for i, name in enumerate(names)}
    out = {}
    for split, chosen in cut_images(len(names), cfg).items():
        keep = [(row[name], caption) for name, caption in lines if row[name] in chosen]
        out[split] = (stacked[[r for r, _ in keep]], [caption for _, caption in keep])  # (N, C, H, W)
    return out


def read_captions(spec: str) -> tuple[list[tuple[str, str]], Path]:
    """(image path, caption) of each line of a folder's captions.jsonl, or of a .jsonl file, and
    that file (image paths are relative to its folder)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / CAPTIONS_FILE
        if not path.is_file():
            raise AttnlabError(
                f"{spec}: no {CAPTIONS_FILE} in this folder; write one line per caption: "
                '{"image": "a.png", "caption": "..."}'
            )
    elif not path.is_file():
        raise AttnlabError(
            f"caption data not found: {spec} (use digits-strips, a folder with {CAPTIONS_FILE}, or a .jsonl file)"
        )
    lines = []
    with open_data(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                lines.append(_line(_json_row(line, path, n), f"{path}:{n}"))
    if not lines:
        raise AttnlabError(
            f'{path}: no captions in it; write one line per caption: {{"image": "a.png", "caption": "..."}}'
        )
    return lines, path


def _line(row: dict, where: str) -> tuple[str, str]:
    for key in ("image", "caption"):
        if not isinstance(row.get(key), str):
            raise AttnlabError(
                f'{where}: expected {{"image": PATH, "caption": TEXT}}, the {key!r} is missing or not text'
            )
    caption = " ".join(row["caption"].split())  # line breaks and runs of spaces would be tokens or noise
    if not caption:
        raise AttnlabError(f"{where}: the caption of {row['image']} is empty")
    return row["image"], caption


def _read(source: Path, name: str) -> np.ndarray:
    path = source.parent / name
    if not path.is_file():
        raise AttnlabError(f"{source}: image not found: {path}")
    return read_image(path)  # (C, H, W); an unreadable file is named in its own error


def cut_images(n: int, cfg: CaptionDataConfig) -> dict[str, set[int]]:
    """Image indices 0..n-1 of each split, a seeded shuffle cut by cfg's fractions. A split with a
    non-zero fraction gets at least one image, so a small folder still has something to score."""
    order = np.random.default_rng(cfg.data_seed).permutation(n)
    sizes = {
        name: max(1, round(n * f)) if f > 0 else 0
        for name, f in (("test", cfg.test_fraction), ("val", cfg.val_fraction))
    }
    if n - sum(sizes.values()) < 1:
        raise AttnlabError(
            f"{cfg.data}: {n} image{'s' if n != 1 else ''} cannot be cut into train, val and test; "
            "give at least 3 images"
        )
    test, val = sizes["test"], sizes["val"]
    return {
        "train": set(order[test + val :].tolist()),
        "val": set(order[test : test + val].tolist()),
        "test": set(order[:test].tolist()),
    }
