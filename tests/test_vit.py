"""The Vision Transformer and the MLP baseline: patches, positions, invariances, sizes, learning."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.mlp import ImageMLP, MLPConfig
from attnlab.models.vit import PAPER_PARAMS, PRESETS, PatchEmbedding, ViT, ViTConfig, patchify
from attnlab.nn import GridPositions, sinusoidal_2d_table, sinusoidal_table

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def tiny(**kw) -> ViTConfig:
    base = dict(n_layer=2, n_head=2, d_model=16, image_size=8, channels=3, patch_size=4, n_labels=5)
    return ViTConfig(**{**base, **kw})


def unpatchify(patches: torch.Tensor, c: int, h: int, w: int, p: int) -> torch.Tensor:
    """The inverse of the formula, as loops: patch k, entry c*P*P + a*P + b is pixel
    (c, (k // (W/P))*P + a, (k % (W/P))*P + b)."""
    out = torch.zeros(patches.shape[0], c, h, w)
    for k in range(patches.shape[1]):
        row, col = divmod(k, w // p)
        for ch in range(c):
            for a in range(p):
                for b in range(p):
                    out[:, ch, row * p + a, col * p + b] = patches[:, k, ch * p * p + a * p + b]
    return out


def test_patchify_puts_every_pixel_where_the_formula_says():
    x = torch.randn(2, 3, 6, 9)  # a 2 x 3 grid of 3 x 3 patches, not square
    patches = patchify(x, 3)
    assert patches.shape == (2, 6, 27)
    for k in range(6):
        row, col = divmod(k, 3)
        for ch in range(3):
            for a in range(3):
                for b in range(3):
                    assert patches[1, k, ch * 9 + a * 3 + b] == x[1, ch, row * 3 + a, col * 3 + b]
    assert torch.equal(unpatchify(patches, 3, 6, 9, 3), x)


def test_convolution_path_equals_cut_flatten_linear_path():
    torch.manual_seed(0)
    model = ViT(tiny(image_size=12, image_width=8, patch_size=4))
    x = torch.rand(3, 3, 12, 8)
    model.patches.path = "linear"
    linear = model.patches(x)
    by_hand = patchify(x, 4) @ model.patches.proj.weight.flatten(1).T + model.patches.proj.bias
    model.patches.path = "conv"
    conv = model.patches(x)
    assert conv.shape == (3, 6, 16)
    torch.testing.assert_close(conv, linear, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear, by_hand, atol=1e-5, rtol=1e-5)


def test_rectangular_patches_cut_as_the_formula_says():
    """Patches of 8 x 2 on a 8 x 12 image: 6 columns, each patch the pixels of its two columns."""
    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 12)
    patches = patchify(x, (8, 2))  # (B, 6, 16)
    assert patches.shape == (2, 6, 16)
    for k in range(6):
        assert torch.equal(patches[:, k], x[:, 0, :, 2 * k : 2 * k + 2].flatten(1))
    emb = PatchEmbedding(1, (8, 2), 16)
    emb.path = "linear"
    linear = emb(x)
    emb.path = "conv"
    torch.testing.assert_close(emb(x), linear, atol=1e-5, rtol=1e-5)


def _permuted(x: torch.Tensor, perm: torch.Tensor, p: int) -> torch.Tensor:
    b, c, h, w = x.shape
    return unpatchify(patchify(x, p)[:, perm], c, h, w, p)


@pytest.mark.parametrize("positions, equivariant", [("none", True), ("learned", False), ("sinusoidal", False)])
def test_without_positions_patches_are_a_set(positions, equivariant):
    """No positions: moving patches around moves their outputs the same way and leaves [CLS]'s
    output unchanged. Positions (learned or 2-D sinusoidal) break that, as they should."""
    torch.manual_seed(0)
    model = ViT(tiny(positions=positions)).eval()
    with torch.no_grad():  # positions start near zero: make them count
        for p in model.pos.parameters():
            p.normal_(0, 1)
    x = torch.rand(2, 3, 8, 8)
    perm = torch.tensor([3, 0, 2, 1])
    h, _ = model.hidden(x)
    hp, _ = model.hidden(_permuted(x, perm, 4))
    same_cls = torch.allclose(h[:, 0], hp[:, 0], atol=1e-5)
    same_patches = torch.allclose(h[:, 1:][:, perm], hp[:, 1:], atol=1e-5)
    assert same_cls == equivariant and same_patches == equivariant


def test_grid_positions_are_row_and_column_tables():
    table = sinusoidal_2d_table(3, 4, 8)  # (12, 8)
    rows, cols = sinusoidal_table(3, 4), sinusoidal_table(4, 4)
    for k in range(12):
        i, j = divmod(k, 4)
        assert torch.equal(table[k, :4], rows[i]) and torch.equal(table[k, 4:], cols[j])
    pos = GridPositions(3, 4, 8, lead=1)
    x = torch.zeros(1, 13, 8)
    assert torch.equal(pos(x)[0, 0], torch.zeros(8)) and torch.equal(pos(x)[0, 1:], table)
    with pytest.raises(ValueError, match="divisible by 4"):
        sinusoidal_2d_table(2, 2, 6)


def test_attention_weights_path_agrees_with_fused_path_and_rows_sum_to_one():
    torch.manual_seed(0)
    model = ViT(tiny(n_layer=3)).eval()
    x = torch.rand(2, 3, 8, 8)
    fused, none = model.hidden(x)
    slow, weights = model.hidden(x, return_weights=True)
    assert none == [] and len(weights) == 3
    torch.testing.assert_close(fused, slow, atol=1e-5, rtol=1e-5)
    assert weights[0].shape == (2, 2, 5, 5)  # (B, H, 1 + 4 patches, 1 + 4 patches)
    torch.testing.assert_close(weights[2].sum(-1), torch.ones(2, 2, 5))


def test_vit_base_16_has_86_million_parameters():
    with torch.device("meta"):  # shapes only: no 86 M weights drawn
        model = ViT(PRESETS["vit-base/16"])
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / PAPER_PARAMS["vit-base/16"] - 1) < 0.02, n
    assert model.cfg.context == 197  # 14 x 14 patches of 16 pixels + [CLS]


def test_config_rejects_sizes_that_do_not_cut_into_patches():
    with pytest.raises(ValueError, match="does not cut into 3x3 patches"):
        tiny(patch_size=3)
    assert tiny(image_size=12, image_width=8, patch_size=4).grid == (3, 2)


@pytest.mark.parametrize("make", [lambda: ViT(tiny()), lambda: ImageMLP(MLPConfig(channels=3, n_labels=5))])
def test_image_models_say_which_shape_they_take(make):
    model = make()
    with pytest.raises(ValueError, match="takes images of 3x8x8"):
        model(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match="floating point"):
        model(torch.zeros(2, 3, 8, 8, dtype=torch.long))
    logits, loss = model(torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 4]))
    assert logits.shape == (4, 5) and loss.item() > 0


@pytest.mark.parametrize(
    "make", [lambda: ViT(tiny(patch_size=2, label_smoothing=0.0)), lambda: ImageMLP(MLPConfig(channels=3, n_labels=5))]
)
def test_a_tiny_model_overfits_a_few_images(make):
    torch.manual_seed(0)
    model = make()
    x, y = torch.rand(10, 3, 8, 8), torch.arange(10) % 5
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert loss.item() < 0.05 and (model(x).argmax(-1) == y).all()


def test_zero_initialized_head_gives_uniform_first_predictions():
    model = ViT(tiny()).eval()
    probs = model(torch.rand(2, 3, 8, 8)).softmax(-1)
    torch.testing.assert_close(probs, torch.full((2, 5), 0.2))


def test_label_smoothing_applies_in_training_only():
    torch.manual_seed(0)
    model = ViT(tiny(label_smoothing=0.2))
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    model.eval()
    logits, eval_loss = model(x, y)
    torch.testing.assert_close(eval_loss, torch.nn.functional.cross_entropy(logits, y))
    model.train()  # no dropout in tiny(): the same logits, a smoothed loss
    _, train_loss = model(x, y)
    torch.testing.assert_close(train_loss, torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.2))


def test_a_hybrid_stem_lets_a_patch_see_one_pixel_around_it_and_no_further():
    """With stem > 0 a 3x3 convolution comes first: patch k's vector changes with the pixels of its
    own 4 x 4 cell and of the ring one pixel around it, and with nothing beyond."""
    torch.manual_seed(0)
    emb = PatchEmbedding(1, 4, 8, stem=6)
    x = torch.rand(1, 1, 8, 16)  # 2 x 4 patches; patch 1 is rows 0-3, columns 4-7
    base = emb(x)[0, 1]
    for (r, c), seen in {(0, 3): True, (4, 8): True, (2, 5): True, (0, 2): False, (5, 9): False}.items():
        y = x.clone()
        y[0, 0, r, c] += 1.0
        assert (not torch.allclose(emb(y)[0, 1], base)) == seen, (r, c)
