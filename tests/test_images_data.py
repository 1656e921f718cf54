"""Image data: digits, folders of class sub-folders, .npz files, the stratified cut and batches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.data.images import (
    IMAGE_SPLITS,
    ImageDataConfig,
    Images,
    ImageSet,
    load_images,
    read_image,
    stratified_cut,
)
from attnlab.errors import AttnlabError

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(path, pixels, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(pixels, dtype=np.uint8), mode).save(path)


@pytest.fixture(scope="module")
def digits() -> ImageSet:
    return load_images(ImageDataConfig())


# ---- digits and the cut -----------------------------------------------------------------------


def test_digits_splits_are_fixed_stratified_and_disjoint(digits):
    sizes = {name: len(digits.splits[name][1]) for name in IMAGE_SPLITS}
    assert sizes == {"train": 1294, "val": 144, "test": 359}  # 359 = round(0.2 * 1797), 144 = round(0.1 * 1438)
    assert digits.classes == [str(d) for d in range(10)]
    assert (digits.channels, digits.size) == (1, (8, 8))
    for x, y in digits.splits.values():
        assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape[1:] == (1, 8, 8)
        assert x.min() >= 0 and x.max() <= 1
        assert set(np.unique(y)) == set(range(10))  # every class in every split
    # Stratified: each class's share of the test split is 20% give or take one image.
    y_all = np.concatenate([y for _, y in digits.splits.values()])
    test_y = digits.splits["test"][1]
    assert np.all(np.abs(np.bincount(test_y) - 0.2 * np.bincount(y_all)) < 1)
    # Disjoint and complete: the images of the three splits are the 1,797 digits, once each.
    from sklearn.datasets import load_digits

    all_x = np.concatenate([x for x, _ in digits.splits.values()]).reshape(-1, 64)
    want = (load_digits().images / 16).astype(np.float32).reshape(-1, 64)
    assert len(all_x) == 1797
    assert sorted(map(bytes, all_x)) == sorted(map(bytes, want))
    again = load_images(ImageDataConfig())
    for name in IMAGE_SPLITS:
        assert np.array_equal(again.splits[name][0], digits.splits[name][0])
        assert np.array_equal(again.splits[name][1], digits.splits[name][1])
    other = load_images(ImageDataConfig(data_seed=1))
    assert not np.array_equal(other.splits["test"][0], digits.splits["test"][0])


def test_cut_keeps_a_training_image_of_every_class():
    labels = np.array([0] * 10 + [1] + [2] * 2)
    cut = stratified_cut(labels, {"test": 0.5, "val": 0.5}, seed=0)
    assert set(labels[cut["train"]]) == {0, 1, 2}
    rows = np.concatenate(list(cut.values()))
    assert sorted(rows) == list(range(len(labels)))


def test_digits_resized_to_image_size_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = load_images(ImageDataConfig(image_size=16))
    assert data.size == (16, 16) and data.splits["val"][0].shape[1:] == (1, 16, 16)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"val_fraction": 1.0},
        {"test_fraction": -0.1},
        {"val_fraction": 0.5, "test_fraction": 0.5},
        {"augment": -1},
        {"image_size": 0},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        ImageDataConfig(**kwargs)


# ---- one image --------------------------------------------------------------------------------


def test_read_image_known_pixels(tmp_path):
    _png(tmp_path / "a.png", [[0, 255], [255, 0]])
    x = read_image(tmp_path / "a.png")
    assert x.dtype == np.float32 and x.shape == (1, 2, 2)
    assert x[0].tolist() == [[0.0, 1.0], [1.0, 0.0]]
    rgb = read_image(tmp_path / "a.png", channels=3)
    assert rgb.shape == (3, 2, 2) and np.array_equal(rgb[1], x[0])
    big = read_image(tmp_path / "a.png", size=(4, 6))
    assert big.shape == (1, 4, 6) and 0 <= big.min() and big.max() <= 1
    _png(tmp_path / "red.png", np.full((3, 5, 3), [255, 0, 0]))
    red = read_image(tmp_path / "red.png")
    assert red.shape == (3, 3, 5) and red[0].min() == 1.0 and red[1:].max() == 0.0
    assert read_image(tmp_path / "red.png", channels=1)[0, 0, 0] == pytest.approx(0.299, abs=1 / 255)


def test_read_image_errors_are_one_line(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(AttnlabError, match=r"cannot read image .*bad.png: cannot identify image file$"):
        read_image(tmp_path / "bad.png")
    with pytest.raises(AttnlabError, match="cannot read image .*missing.png: No such file"):
        read_image(tmp_path / "missing.png")


# ---- folders ----------------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path):
    """cats: three 4x4 gray + one 6x6; dogs: three 4x4 gray + one RGB; birds: empty; a corrupt file."""
    root = tmp_path / "pets"
    for i in range(3):
        _png(root / "cats" / f"c{i}.png", np.full((4, 4), 40 * i))
        _png(root / "dogs" / f"d{i}.png", np.full((4, 4), 200))
    _png(root / "cats" / "big.png", np.full((6, 6), 255))
    _png(root / "dogs" / "colour.png", np.full((4, 4, 3), [255, 0, 0]))
    (root / "dogs" / "bad.png").write_bytes(b"\x89PNG broken")
    (root / "dogs" / "notes.txt").write_text("not an image, ignored")
    (root / "birds").mkdir()
    return root


def test_folder_loads_the_rest_with_one_warning_per_problem(folder):
    with pytest.warns(UserWarning) as caught:
        data = load_images(ImageDataConfig(data=str(folder), val_fraction=0, test_fraction=0.25))
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        "1 colour image converted to grayscale",
        "1 image was not 4x4: resized",
        "left out 1 class folder with no images: birds",
        "skipped 1 unreadable image (first: dogs/bad.png: cannot identify image file)",
    ]
    assert data.classes == ["cats", "dogs"] and (data.channels, data.size) == (1, (4, 4))
    x = np.concatenate([x for x, _ in data.splits.values()])
    y = np.concatenate([y for _, y in data.splits.values()])
    assert x.shape == (8, 1, 4, 4) and np.bincount(y).tolist() == [4, 4]
    assert np.bincount(data.splits["test"][1]).tolist() == [1, 1]
    assert not Images(data).has("val") and Images(data).has("test")
    # The resized all-white image stays all white; the red one became its luminance.
    assert np.isclose(x.reshape(8, -1).min(axis=1), 1.0).sum() == 1
    assert np.isclose(x.reshape(8, -1).max(axis=1), 0.299, atol=1 / 255).sum() == 1


def test_folder_given_size_channels_and_classes(folder):
    with pytest.warns(UserWarning):
        data = load_images(ImageDataConfig(data=str(folder)), classes=["dogs", "cats", "fish"], size=(5, 5), channels=3)
    assert data.classes == ["dogs", "cats", "fish"] and (data.channels, data.size) == (3, (5, 5))
    x = np.concatenate([x for x, _ in data.splits.values()])
    y = np.concatenate([y for _, y in data.splits.values()])
    red = np.isclose(x[:, 0], 1).all(axis=(1, 2)) & np.isclose(x[:, 1], 0).all(axis=(1, 2))
    assert y[red].tolist() == [0]  # the red dog is a dog, class 0 in the given order
    with pytest.warns(UserWarning), pytest.raises(AttnlabError, match="class 'cats' is not one of .*: dogs, fish"):
        load_images(ImageDataConfig(data=str(folder)), classes=["dogs", "fish"])


def test_missing_or_empty_data_is_an_error(tmp_path):
    with pytest.raises(AttnlabError, match="image data not found: .*nowhere .use digits, a folder"):
        load_images(ImageDataConfig(data=str(tmp_path / "nowhere")))
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(AttnlabError, match="no class sub-folders with images"):
        load_images(ImageDataConfig(data=str(tmp_path / "empty")))


# ---- .npz -------------------------------------------------------------------------------------


def test_npz_uint8_with_string_labels(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(30, 5, 7), dtype=np.uint8)
    labels = np.array(["zebra", "ant", "moth"] * 10)
    np.savez(tmp_path / "d.npz", images=images, labels=labels)
    data = load_images(ImageDataConfig(data=str(tmp_path / "d.npz")))
    assert data.classes == ["ant", "moth", "zebra"] and (data.channels, data.size) == (1, (5, 7))
    x, y = data.splits["train"]
    # Each training image is one of the originals /255, with its own label.
    for img, label in zip(x, y):
        match = np.flatnonzero((images == np.round(img[0] * 255)).all(axis=(1, 2)))
        assert len(match) == 1 and labels[match[0]] == data.classes[label]
    assert sum(len(y) for _, y in data.splits.values()) == 30


def test_npz_channels_last_float_and_int_labels(tmp_path):
    images = np.full((12, 3, 3, 3), 0.5, dtype=np.float32)
    np.savez(tmp_path / "c.npz", images=images, labels=np.array([10, 2] * 6))
    data = load_images(ImageDataConfig(data=str(tmp_path / "c.npz")))
    assert data.classes == ["2", "10"] and (data.channels, data.size) == (3, (3, 3))
    assert np.all(data.splits["train"][0] == 0.5)


def test_npz_as_separate_test_set(tmp_path):
    np.savez(tmp_path / "t.npz", images=np.zeros((4, 8, 8), np.uint8), labels=np.array([3, 3, 7, 7]))
    data = load_images(ImageDataConfig(test=str(tmp_path / "t.npz")))
    x, y = data.splits["test"]
    assert x.shape == (4, 1, 8, 8) and y.tolist() == [3, 3, 7, 7]
    assert len(data.splits["train"][1]) + len(data.splits["val"][1]) == 1797


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((3, 4, 4))}, "no array 'labels'"),
        ({"images": np.zeros((3, 4, 4)), "labels": np.zeros(2, int)}, "must be .N,. with N = 3 images"),
        ({"images": np.zeros((3, 4)), "labels": np.zeros(3, int)}, "must be .N, H, W. or"),
        ({"images": np.array([None] * 3), "labels": np.zeros(3, int)}, "cannot read as a .npz"),
    ],
)
def test_npz_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "e.npz", **arrays)
    with pytest.raises(AttnlabError, match=message):
        load_images(ImageDataConfig(data=str(tmp_path / "e.npz")))


# ---- batches ----------------------------------------------------------------------------------


def test_batches_shapes_and_reproducible(digits):
    source = Images(digits)
    x, y = source.batch("train", 16, np.random.default_rng(3), (0, 1))
    assert x.shape == (16, 1, 8, 8) and x.dtype == torch.float32 and y.shape == (16,) and y.dtype == torch.int64
    x2, y2 = source.batch("train", 16, np.random.default_rng(3), (0, 1))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    half, _ = source.batch("train", 16, np.random.default_rng(3), (1, 2))
    assert torch.equal(half, x[8:])  # a process keeps its slice of the same global batch
    assert source.describe() == "1,294 training images of 1x8x8, 10 classes"
    assert source.per_example == (1, "images")


def _moved(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """img (C, H, W) moved down dy and right dx pixels: np.roll, then zeros where it wrapped around."""
    out = np.roll(img, (dy, dx), axis=(1, 2))
    out[:, slice(0, dy) if dy >= 0 else slice(dy, None)] = 0
    out[:, :, slice(0, dx) if dx >= 0 else slice(dx, None)] = 0
    return out


def test_augment_shifts_training_images_only(digits):
    plain, shifted = Images(digits), Images(digits, augment=1)
    rows = np.random.default_rng(5).integers(0, len(digits.splits["train"][1]), size=64)
    x, y = shifted.batch("train", 64, np.random.default_rng(5), (0, 1))
    originals, labels = plain.collate("train", rows)
    assert torch.equal(y, labels) and not torch.equal(x, originals)
    offsets = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    for img, orig in zip(x.numpy(), originals.numpy()):
        assert any(np.array_equal(img, _moved(orig, dy, dx)) for dy, dx in offsets)
    moved = [i for i in range(64) if not np.array_equal(x[i].numpy(), originals[i].numpy())]
    assert len(moved) > 40  # 8 of the 9 offsets move an image: about 57 of 64
    val = shifted.batch("val", 64, np.random.default_rng(5), (0, 1))
    assert torch.equal(val[0], plain.batch("val", 64, np.random.default_rng(5), (0, 1))[0])


def test_shift_moves_a_pixel_down_and_left():
    from attnlab.data.images import shift

    x = torch.zeros(1, 1, 3, 3)
    x[0, 0, 1, 1] = 1
    out = shift(x, np.array([[1, -1]]), most=1)
    assert out[0, 0].nonzero().tolist() == [[2, 0]]
    assert np.array_equal(out[0].numpy(), _moved(x[0].numpy(), 1, -1))
