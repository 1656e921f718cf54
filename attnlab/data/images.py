"""Labelled images for classification: scikit-learn's digits, a folder of class sub-folders, or a .npz.

Every source becomes float32 images (N, C, H, W) in [0, 1] with int64 labels, at one size and
channel count: the --image-size asked for, a trained run's (so new data fits its model), or else
the most common size and channels of the data. Splits are cut per class, so every split has the
data's mix of classes, from a seeded RNG, so the same seed always gives the same cut.

Legend: N images, B batch, C channels, H height, W width.
"""

from __future__ import annotations

import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from attnlab.config import check_fraction, option
from attnlab.data.batches import rank_slice
from attnlab.errors import AttnlabError
from attnlab.runtime.memory import check_fits

BUILTIN_IMAGES = ("digits",)
IMAGE_SPLITS = ("train", "val", "test")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R 601-2, as Pillow's RGB -> L


@dataclass
class ImageDataConfig:
    data: str = option(
        "digits",
        "digits (scikit-learn's 1,797 8x8 handwritten digits, no download), a folder with one sub-folder "
        "of images per class, or a .npz file with `images` (N, H, W[, C]) and `labels`",
    )
    test: str | None = option(None, "a separate test set (folder or .npz); default: cut from --data")
    image_size: int | None = option(
        None, "resize every image to this many pixels square (default: the data's own size)"
    )
    val_fraction: float = option(0.1, "share of the training images held out for validation")
    test_fraction: float = option(0.2, "share of the images held out for testing (when no --test)")
    augment: int = option(0, "training only: shift each image by up to this many pixels at random (0 = off)")
    data_seed: int = option(0, "seed of the train/val/test cut")

    def __post_init__(self):
        check_fraction(self, "val_fraction", "test_fraction")
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError("val_fraction + test_fraction must be below 1: some images must be left to train on")
        if self.augment < 0:
            raise ValueError(f"augment must be 0 or more pixels, got {self.augment}")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be at least 1, got {self.image_size}")


@dataclass
class ImageSet:
    splits: dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (images (N, C, H, W), labels (N,))
    classes: list[str]  # label i is classes[i]

    @property
    def channels(self) -> int:
        return self.splits["train"][0].shape[1]

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.splits["train"][0].shape[2:])


def load_images(
    cfg: ImageDataConfig,
    classes: list[str] | None = None,
    size: tuple[int, int] | None = None,
    channels: int | None = None,
) -> ImageSet:
    """Train, val and test images of cfg.data (and cfg.test). A trained run passes its `classes`,
    `size` and `channels`, so labels keep their meaning and images fit its model."""
    asked = cfg.image_size is not None  # resizing that the user asked for needs no warning
    size = (cfg.image_size, cfg.image_size) if asked else size
    x, y, names = _read_source(cfg.data, size, channels, quiet=asked)
    if classes is not None:
        y, names = _onto(y, names, classes, cfg.data), list(classes)
    held_out = {"test": cfg.test_fraction} if cfg.test is None else {}
    cut = stratified_cut(y, {**held_out, "val": cfg.val_fraction}, cfg.data_seed)
    splits = {name: (x[rows], y[rows]) for name, rows in cut.items()}
    if cfg.test is not None:  # a given test set is read to the training images' size and channels
        tx, ty, test_names = _read_source(cfg.test, x.shape[2:], x.shape[1], quiet=asked)
        splits["test"] = (tx, _onto(ty, test_names, names, cfg.test))
    return ImageSet({name: splits[name] for name in IMAGE_SPLITS}, names)


def load_source(spec: str, classes: list[str], size: tuple[int, int], channels: int) -> tuple[np.ndarray, np.ndarray]:
    """All images of one source (a trained run's new test data) at the run's size and channels,
    labels as indices into the run's `classes`: (images (N, C, H, W), labels (N,))."""
    x, y, names = _read_source(spec, size, channels, quiet=False)
    return x, _onto(y, names, classes, spec)


def stratified_cut(labels: np.ndarray, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Row indices of "train" and of each split in `fractions`, taken in turn from what is left of
    every class (so "val" after "test" is a share of the rest). Every class keeps a training image."""
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    out = {}
    for name, fraction in fractions.items():
        counts = np.array([len(p) for p in pools])
        take = np.minimum(_shares(counts, fraction), counts - 1)
        out[name] = np.sort(np.concatenate([p[:k] for p, k in zip(pools, take)]))
        pools = [p[k:] for p, k in zip(pools, take)]
    return {"train": np.sort(np.concatenate(pools)), **out}


def _shares(counts: np.ndarray, fraction: float) -> np.ndarray:
    """Per-class counts adding up to round(total * fraction): each class gets its share rounded
    down and the largest remainders one more, so ten classes' roundings do not add up to an error."""
    exact = counts * fraction
    take = np.floor(exact).astype(np.int64)
    extra = int(round(exact.sum())) - int(take.sum())
    take[np.argsort(take - exact, kind="stable")[:extra]] += 1
    return take


def _onto(labels: np.ndarray, names: list[str], classes: list[str], where: str) -> np.ndarray:
    """Labels (indices into `names`) as indices into `classes`, matched by name."""
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise AttnlabError(f"{where}: class {unknown[0]!r} is not one of the known classes: {', '.join(classes)}")
    return np.array([classes.index(n) for n in names], dtype=np.int64)[labels]


# ---- sources ----------------------------------------------------------------------------------


def _read_source(spec: str, size, channels, quiet: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images (N, C, H, W), labels (N,), class names) of a built-in set, a folder or a .npz."""
    path = Path(spec).expanduser()
    if spec in BUILTIN_IMAGES:
        images, labels, names = _digits()
    elif path.is_dir():
        images, labels, names = _read_folder(path)
    elif path.is_file() and path.suffix.lower() == ".npz":
        images, labels, names = _read_npz(path)
    else:
        what = "not a folder or a .npz file" if path.exists() else "image data not found"
        raise AttnlabError(f"{what}: {spec} (use digits, a folder of class sub-folders, or a .npz file)")
    return _fit(images, size, channels, quiet), labels, names


def _digits() -> tuple[np.ndarray, np.ndarray, list[str]]:
    try:
        from sklearn.datasets import load_digits  # scikit-learn's datasets: 2.7 s to import, for digits alone
    except ImportError:
        raise AttnlabError("the digits data comes with scikit-learn: pip install scikit-learn") from None
    digits = load_digits()
    images = (digits.images / 16).astype(np.float32)[:, None]  # (N, 1, 8, 8); pixels count 0..16
    return images, digits.target.astype(np.int64), [str(d) for d in range(10)]


def _read_folder(root: Path) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """Images of root/CLASS/*; unreadable files and classes left without images are warned about."""
    images, labels, names, empty, bad = [], [], [], [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
        read = []
        for f in files:
            try:
                read.append(read_image(f))
            except AttnlabError as e:
                reason = str(e)[len(f"cannot read image {f}: ") :]
                bad.append(f"{f.relative_to(root).as_posix()}: {reason}")
        if not read:
            empty.append(folder.name)
            continue
        images += read
        labels += [len(names)] * len(read)
        names.append(folder.name)
    if bad:
        warnings.warn(f"skipped {_many(len(bad), 'unreadable image')} (first: {bad[0]})", stacklevel=4)
    if empty and names:
        warnings.warn(f"left out {_many(len(empty), 'class folder')} with no images: {', '.join(empty)}", stacklevel=4)
    if not names:
        raise AttnlabError(f"{root}: no class sub-folders with images in them (expected one sub-folder per class)")
    return images, np.array(labels, dtype=np.int64), names


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """`images` (N, H, W[, C]) and `labels` (N,) of a .npz, never unpickling anything."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("images", "labels") if k not in z.files]
            if missing:
                raise AttnlabError(f"{path}: no array {missing[0]!r} (it has: {', '.join(z.files) or 'none'})")
            x, y = z["images"], z["labels"]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # object arrays land here too
        raise AttnlabError(f"{path}: cannot read as a .npz of numeric arrays ({e})") from None
    if x.ndim == 3:
        x = x[:, None]  # (N, 1, H, W)
    elif x.ndim == 4 and x.shape[3] in (1, 3):
        x = x.transpose(0, 3, 1, 2)  # (N, C, H, W)
    else:
        raise AttnlabError(f"{path}: `images` must be (N, H, W) or (N, H, W, C) with C 1 or 3, got {x.shape}")
    if y.ndim != 1 or len(y) != len(x) or len(x) == 0:
        raise AttnlabError(f"{path}: `labels` must be (N,) with N = {len(x)} images, got shape {y.shape}")
    if x.dtype.kind not in "biuf" or y.dtype.kind not in "iuUS":
        raise AttnlabError(
            f"{path}: expected numeric `images` and integer or string `labels`, got {x.dtype}, {y.dtype}"
        )
    scale = 255 if x.dtype == np.uint8 or x.max() > 1 else 1  # 0..255 pixels, whatever their dtype
    values, labels = np.unique(y.astype(str) if y.dtype.kind == "S" else y, return_inverse=True)
    return np.ascontiguousarray(x, dtype=np.float32) / scale, labels.astype(np.int64), [str(v) for v in values]


# ---- one image, and fitting many to one shape ---------------------------------------------------


def read_image(path: str | Path, size: tuple[int, int] | None = None, channels: int | None = None) -> np.ndarray:
    """One image file as float32 (C, H, W) in [0, 1]: C is 1 or 3 (its own, or `channels`), and
    (H, W) its own or `size`, resized bilinearly."""
    try:
        with warnings.catch_warnings():  # Pillow's own bomb warning: the size is checked here
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
        with img:
            check_pixels(img.size, path)  # from the header: a 13000x13000 PNG can be a 500 KB file
            img.load()  # decode now, so a corrupt file fails here and not in the middle of training
            gray = Image.getmodebase(img.mode) == "L"  # 1, L, LA, I, F, I;16; a palette (P) counts as colour
            img = img.convert("L" if (channels or (1 if gray else 3)) == 1 else "RGB")
    except Image.DecompressionBombError:  # Pillow's own refusal, beyond twice its limit: ours is lower
        raise AttnlabError(
            f"image {path} is over the limit of {MAX_PIXELS / 1e6:.0f} million pixels: scale it down first"
        ) from None
    except (OSError, ValueError, SyntaxError) as e:
        reason = "cannot identify image file" if isinstance(e, UnidentifiedImageError) else None
        raise AttnlabError(f"cannot read image {path}: {reason or getattr(e, 'strerror', None) or e}") from None
    x = np.asarray(img, dtype=np.float32) / 255
    return np.ascontiguousarray(resize(x[None] if x.ndim == 2 else x.transpose(2, 0, 1), size))  # (C, H, W)


MAX_PIXELS = 25_000_000  # 5000x5000: a 12-megapixel photo reads, a decompression bomb does not


def check_pixels(size: tuple[int, int], path) -> None:
    w, h = size
    if w * h > MAX_PIXELS:
        raise AttnlabError(
            f"image {path} is {w}x{h} pixels, over the limit of {MAX_PIXELS / 1e6:.0f} million: scale it down first"
        )


def resize(x: np.ndarray, size) -> np.ndarray:
    """(C, H, W) -> (C, *size), bilinear, one channel at a time in float (Pillow's mode F)."""
    if size is None or x.shape[1:] == tuple(size):
        return x
    h, w = size
    x = np.ascontiguousarray(x, dtype=np.float32)
    return np.stack([np.asarray(Image.fromarray(c).resize((w, h), Image.Resampling.BILINEAR)) for c in x])


def _convert(x: np.ndarray, channels: int) -> np.ndarray:
    """(..., C, H, W) with C 1 or 3 -> `channels`: gray repeated, or colour weighted to luminance."""
    if x.shape[-3] == channels:
        return x
    if channels == 3:
        return np.repeat(x, 3, axis=-3)
    return (x * LUMA[:, None, None]).sum(axis=-3, keepdims=True)


def _fit(images, size, channels, quiet: bool = False) -> np.ndarray:
    """Images (C, H, W) stacked to (N, C, H, W) at `size` and `channels`, by default the most
    common size and the channels of most images; one warning line counts each kind of change."""
    size = tuple(size) if size is not None else Counter(x.shape[1:] for x in images).most_common(1)[0][0]
    if channels is None:
        channels = 3 if 2 * sum(x.shape[0] == 3 for x in images) > len(images) else 1
    # float32 pixels of every image at the new size, checked before the first is resized
    check_fits(
        4 * len(images) * channels * size[0] * size[1],
        f"holding {len(images):,} images at {size[0]}x{size[1]}",
        "choose a smaller --image-size",
    )
    resized = sum(x.shape[1:] != size for x in images)
    converted = sum(x.shape[0] != channels for x in images)
    if resized and not quiet:
        warnings.warn(
            f"{_many(resized, 'image')} {'was' if resized == 1 else 'were'} not {size[0]}x{size[1]}: resized",
            stacklevel=4,
        )
    if converted:
        kinds = ("grayscale", "colour") if channels == 3 else ("colour", "grayscale")
        warnings.warn(f"{_many(converted, kinds[0] + ' image')} converted to {kinds[1]}", stacklevel=4)
    if not resized and not converted and isinstance(images, np.ndarray):
        return images  # already one shape: skip the per-image work on a large array
    return np.stack([_convert(resize(x, size), channels) for x in images]).astype(np.float32)


def _many(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


# ---- batches ----------------------------------------------------------------------------------


class Images:
    """The training loop's image batches: x (B, C, H, W) float32 in [0, 1] and labels y (B,).

    With augment > 0, each training image is shifted by a random (dy, dx) of up to that many
    pixels, zeros coming in at the edges: a digit moved by a pixel is still the same digit."""

    per_example = (1, "images")

    def __init__(self, images: ImageSet, augment: int = 0):
        self.images, self.augment = images, augment

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, Tensor]:
        rows = rank_slice(rng.integers(0, len(self.images.splits[split][1]), size=n), part)
        x, y = self.collate(split, rows)
        if split == "train" and self.augment > 0:
            # Shifts are drawn for the whole global batch and sliced like the rows, so a process
            # shifts its images exactly as a single process would.
            shifts = rank_slice(rng.integers(-self.augment, self.augment + 1, size=(n, 2)), part)
            x = shift(x, shifts, self.augment)
        return x, y

    def collate(self, split: str, rows) -> tuple[Tensor, Tensor]:
        """The given rows of a split, unchanged."""
        x, y = self.images.splits[split]
        return torch.from_numpy(x[rows]), torch.from_numpy(y[rows])

    def has(self, split: str) -> bool:
        return split in self.images.splits and len(self.images.splits[split][1]) > 0

    def describe(self) -> str:
        n, c, h, w = self.images.splits["train"][0].shape
        return f"{n:,} training images of {c}x{h}x{w}, {len(self.images.classes)} classes"


def shift(x: Tensor, shifts: np.ndarray, most: int) -> Tensor:
    """Image i of x (B, C, H, W) moved down shifts[i, 0] and right shifts[i, 1] pixels (at most
    `most` either way), with zero fill: cut from a zero-padded copy at an offset window."""
    h, w = x.shape[2:]
    padded = torch.nn.functional.pad(x, (most, most, most, most))  # (B, C, H + 2 most, W + 2 most)
    top, left = most - shifts[:, 0], most - shifts[:, 1]
    return torch.stack([padded[i, :, t : t + h, s : s + w] for i, (t, s) in enumerate(zip(top, left))])
