"""Moving images by fractions of a pixel (data/jitter.py) and the captioning batches that use it."""

import numpy as np
import pytest
import torch

from attnlab.data.batches import ImagePairs
from attnlab.data.captions import CaptionDataConfig
from attnlab.data.images import shift
from attnlab.data.jitter import jitter, jitter_offsets, translate


def bilinear_loop(image: np.ndarray, dy: float, dx: float) -> np.ndarray:
    """The formula written out: output pixel (y, x) reads the input at (y - dy, x - dx), mixing the
    four pixels around that point by how close it lies to each; outside the image is 0."""
    h, w = image.shape
    out = np.zeros_like(image)
    for y in range(h):
        for x in range(w):
            sy, sx = y - dy, x - dx
            y0, x0 = int(np.floor(sy)), int(np.floor(sx))
            fy, fx = sy - y0, sx - x0
            for yy, wy in ((y0, 1 - fy), (y0 + 1, fy)):
                for xx, wx in ((x0, 1 - fx), (x0 + 1, fx)):
                    if 0 <= yy < h and 0 <= xx < w:
                        out[y, x] += wy * wx * image[yy, xx]
    return out


def test_translate_matches_the_bilinear_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 8, 12, generator=g)
    offsets = torch.tensor([[0.25, -0.5], [-0.7, 0.3], [1.5, 2.25]])
    out = translate(x, offsets)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        assert np.allclose(out[i, 0].numpy(), bilinear_loop(x[i, 0].numpy(), dy, dx), atol=1e-5)


def test_a_half_pixel_to_the_right_averages_each_pixel_with_its_left_neighbour():
    x = torch.zeros(1, 1, 2, 4)
    x[0, 0, :, 1] = 1.0  # one lit column
    out = translate(x, torch.tensor([[0.0, 0.5]]))[0, 0]
    assert torch.allclose(out, torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 2), atol=1e-6)


def test_whole_pixel_offsets_copy_pixels_like_the_integer_shift():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 2, 8, 8, generator=g)
    offsets = np.array([[1, -1], [0, 2], [-2, 0], [0, 0]])
    assert torch.allclose(translate(x, torch.from_numpy(offsets)), shift(x, offsets, 2), atol=1e-6)


def test_jitter_moves_only_the_drawn_share_and_leaves_the_rest_bit_for_bit():
    rng = np.random.default_rng(3)
    offsets = jitter_offsets(1000, 0.5, 0.5, rng)
    moved = np.any(offsets != 0, axis=1)
    assert 0.45 < moved.mean() < 0.55 and np.abs(offsets).max() <= 0.5
    x = torch.rand(8, 1, 8, 16, generator=torch.Generator().manual_seed(2))
    few = offsets[:8]
    out = jitter(x, few)
    still = ~np.any(few != 0, axis=1)
    assert torch.equal(out[still], x[still]) and not torch.equal(out[~still], x[~still])
    assert torch.equal(jitter(x, np.zeros((8, 2))), x)
    assert np.all(jitter_offsets(50, 0.5, 0.0, rng) == 0) and np.all(np.any(jitter_offsets(50, 0.5, 1.0, rng), axis=1))


def _pairs(shift_px: float) -> ImagePairs:
    g = np.random.default_rng(0)
    images = {s: g.random((20, 1, 8, 16)).astype(np.float32) for s in ("train", "val")}
    targets = {s: [np.array([3 + i % 4, 5]) for i in range(20)] for s in ("train", "val")}
    return ImagePairs(images, targets, shift=shift_px, share=1.0)


def test_caption_batches_move_training_images_only_and_draw_the_same_rows():
    plain, moving = _pairs(0.0), _pairs(0.5)
    a = plain.batch("train", 8, np.random.default_rng(7), (0, 1))
    b = moving.batch("train", 8, np.random.default_rng(7), (0, 1))
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])  # the same captions: rows drawn first
    assert not torch.equal(a[0], b[0])
    assert (a[0] - b[0]).abs().max() < 1.0  # moved by at most half a pixel: a neighbour mix, not noise
    va = plain.batch("val", 8, np.random.default_rng(7), (0, 1))
    vb = moving.batch("val", 8, np.random.default_rng(7), (0, 1))
    assert torch.equal(va[0], vb[0])


def test_each_process_moves_its_slice_as_one_process_moves_the_whole_batch():
    pairs = _pairs(0.5)
    whole = pairs.batch("train", 8, np.random.default_rng(11), (0, 1))[0]
    halves = [pairs.batch("train", 8, np.random.default_rng(11), (rank, 2))[0] for rank in range(2)]
    assert torch.allclose(torch.cat(halves), whole)


@pytest.mark.parametrize("bad", [{"shift": -0.5}, {"shift": float("inf")}, {"shift_share": 1.5}, {"shift_share": -0.1}])
def test_caption_data_refuses_a_bad_shift(bad):
    with pytest.raises(ValueError):
        CaptionDataConfig(**bad)


def test_the_caption_task_moves_training_images_as_its_data_config_says(tmp_path):
    from attnlab.engine.config import TrainConfig
    from attnlab.runtime.distributed import Dist
    from attnlab.tasks.caption import Captioning
    from attnlab.tasks.request import python_request

    task = Captioning()
    data = CaptionDataConfig(n_train=40, n_test=8, shift=0.25, shift_share=1.0)
    req = python_request(task, tmp_path, "transformer", train=TrainConfig(max_steps=1), data=data)
    for name, text in task.setup(req).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    batches = task.prepare(req, Dist()).batches
    assert (batches.shift, batches.share) == (0.25, 1.0)
    images, _, _ = batches.batch("train", 4, np.random.default_rng(0), (0, 1))
    assert not any(torch.equal(img, torch.from_numpy(x)) for img in images for x in batches.src["train"])
