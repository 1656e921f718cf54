"""ViT pictures: attention rollout against a loop reference, [CLS] maps on the grid, PNGs written."""

import numpy as np
import pytest
import torch

from attnlab.interpret.patches import attention_rollout, cls_maps, patch_panels, plot_patch_attention
from attnlab.viz.patches import grid_title, plot_prediction_grid

pytestmark = pytest.mark.usefixtures("one_thread")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def random_attention(rng, n_layer, n_head, t):
    """L arrays (H, T, T) whose rows are softmaxes of random scores."""
    scores = rng.normal(size=(n_layer, n_head, t, t)) * 2
    p = np.exp(scores)
    return list(p / p.sum(-1, keepdims=True))


def rollout_loops(weights, residual):
    """The rollout formula written out entry by entry, as a reference for the vectorized one."""
    t = len(weights[0][0])
    rollout = [[1.0 if i == j else 0.0 for j in range(t)] for i in range(t)]
    for layer in weights:
        n_head = len(layer)
        a = [[0.0] * t for _ in range(t)]
        for i in range(t):
            for j in range(t):
                mean = sum(layer[h][i][j] for h in range(n_head)) / n_head
                a[i][j] = residual * (1.0 if i == j else 0.0) + (1 - residual) * mean
            total = sum(a[i])
            a[i] = [x / total for x in a[i]]
        # this layer acts after everything before it: rollout <- a @ rollout
        rollout = [[sum(a[i][k] * rollout[k][j] for k in range(t)) for j in range(t)] for i in range(t)]
    return np.array(rollout)


@pytest.mark.parametrize("residual", [0.0, 0.3, 0.5, 0.9])
def test_rollout_matches_loop_reference(residual):
    weights = random_attention(np.random.default_rng(0), 3, 2, 5)
    r = attention_rollout(weights, residual)
    np.testing.assert_allclose(r, rollout_loops(weights, residual), atol=1e-12)
    np.testing.assert_allclose(r.sum(-1), 1.0, atol=1e-12)


def test_rollout_order_matters_and_inputs_agree():
    weights = random_attention(np.random.default_rng(1), 2, 3, 4)
    r = attention_rollout(weights)
    assert not np.allclose(r, attention_rollout(weights[::-1]))  # later layers must go on the left
    np.testing.assert_allclose(attention_rollout(np.stack(weights)), r)  # one (L, H, T, T) array
    np.testing.assert_allclose(attention_rollout([torch.tensor(w, requires_grad=True) for w in weights]), r)


def test_rollout_one_layer_without_residual_is_head_mean():
    weights = random_attention(np.random.default_rng(2), 1, 4, 6)
    np.testing.assert_allclose(attention_rollout(weights, residual=0.0), weights[0].mean(0), atol=1e-12)


def test_rollout_of_identity_attention_is_identity():
    eye = np.broadcast_to(np.eye(5), (3, 5, 5))  # (H, T, T)
    np.testing.assert_allclose(attention_rollout([eye] * 4), np.eye(5))


def test_cls_maps_put_each_patch_in_its_cell():
    gh, gw = 3, 4  # not square, so a transposed layout would fail
    t = 1 + gh * gw
    for k in range(gh * gw):
        w = np.full((2, 3, t, t), 1 / t)  # (L, H, T, T)
        w[:, :, 0, :] = 0
        w[:, :, 0, 1 + k] = 1  # [CLS] looks at patch k only
        maps = cls_maps(list(w), (gh, gw))
        assert maps.shape == (2, 3, gh, gw)
        r, c = divmod(k, gw)
        assert (maps[:, :, r, c] == 1).all()
        assert maps.sum() == 2 * 3  # and nowhere else


def test_cls_maps_reject_a_grid_that_does_not_fit():
    with pytest.raises(ValueError, match="patch grid"):
        cls_maps(random_attention(np.random.default_rng(3), 1, 1, 17), (4, 5))


def test_patch_panels_titles_and_maps():
    n_layer, n_head, grid = 2, 3, (2, 3)
    weights = random_attention(np.random.default_rng(4), n_layer, n_head, 7)
    rows = patch_panels(weights, grid)
    panels = [p for row in rows for p in row]
    assert len(panels) == n_layer * (n_head + 1) + 3
    titles = [name for _, name in panels]
    assert titles[:4] == ["layer 1 head 1", "layer 1 head 2", "layer 1 head 3", "layer 1: mean of heads"]
    assert titles[-3:] == ["image", "rollout", "layer 2: mean of heads"]
    assert panels[-3][0] is None
    maps = cls_maps(weights, grid)
    np.testing.assert_allclose(rows[1][1][0], maps[1, 1])
    np.testing.assert_allclose(rows[1][-1][0], maps[1].mean(0))
    np.testing.assert_allclose(panels[-2][0], attention_rollout(weights)[0, 1:].reshape(grid))


def read_png(path):
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image  # read back only by the tests that draw

    return matplotlib.image.imread(path)  # (height, width, channels)


@pytest.mark.parametrize("channels, side, grid", [(1, 8, (4, 4)), (3, 16, (4, 4)), (3, 12, (2, 3))])
def test_plot_patch_attention_writes_png(tmp_path, channels, side, grid):
    n_layer, n_head = 2, 2
    image = np.random.default_rng(5).random((channels, side, side))
    weights = random_attention(np.random.default_rng(6), n_layer, n_head, 1 + grid[0] * grid[1])
    path = tmp_path / "patches.png"
    plot_patch_attention(image, weights, grid, path, title="digit 3: where [CLS] looked")
    png = read_png(path)
    # at least ~1.6 inches per panel at >= 100 dpi: (L + 1) rows, H + 1 columns
    assert png.shape[0] >= (n_layer + 1) * 160
    assert png.shape[1] >= (n_head + 1) * 160
    assert png.shape[0] < 3000 and png.shape[1] < 3000
    assert png[..., :3].std() > 0.01  # something was drawn


def test_plot_patch_attention_rejects_a_bad_image(tmp_path):
    weights = random_attention(np.random.default_rng(7), 1, 1, 5)
    with pytest.raises(ValueError, match="C = 1 or 3"):
        plot_patch_attention(np.zeros((2, 8, 8)), weights, (2, 2), tmp_path / "x.png")


def test_grid_title_counts_right_predictions():
    assert grid_title(["3", "5", "7"], ["3", "1", "7"], "digits") == "digits — 2/3 right"
    assert grid_title(np.array([1, 2, 3, 4]), np.array([1, 2, 3, 4])) == "4/4 right"
    assert grid_title(np.array([0, 1]), ["0", "0"], "mixed") == "mixed — 1/2 right"
    with pytest.raises(ValueError):
        grid_title(["a"], ["a", "b"])


@pytest.mark.parametrize("probs_ndim", [None, 1, 2])
def test_plot_prediction_grid_writes_png(tmp_path, probs_ndim):
    rng = np.random.default_rng(8)
    n = 45  # more than max_images: only 40 drawn, 8 per row
    images = rng.random((n, 1, 8, 8))
    true = [str(d) for d in rng.integers(0, 10, n)]
    pred = [t if i % 5 else "x" for i, t in enumerate(true)]
    probs = {None: None, 1: rng.random(n), 2: rng.dirichlet(np.ones(10), n)}[probs_ndim]
    path = tmp_path / "grid.png"
    plot_prediction_grid(images, true, pred, path, title="digits", probs=probs)
    png = read_png(path)
    assert png.shape[1] >= 8 * 160 and png.shape[0] >= 5 * 160
    assert grid_title(true[:40], pred[:40], "digits") == "digits — 32/40 right"
