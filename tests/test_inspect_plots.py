"""Pictures of a run's insides: learning rate, position vectors, token embeddings (interpret/plots.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli.main import main
from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.errors import AttnlabError
from attnlab.interpret.plots import WHAT, plot_run, position_table, token_labels
from attnlab.models.baselines import BagOfWords, BagOfWordsConfig, Pooled, PooledConfig
from attnlab.models.gpt import GPT
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import ViT, ViTConfig
from attnlab.nn import sinusoidal_2d_table, sinusoidal_table
from attnlab.runs.run import Run
from attnlab.viz.curves import plot_lr
from attnlab.viz.embeddings import embedding_pca, plot_embeddings, plot_positions
from tests.conftest import TEXT, flags, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    return path.read_bytes()[:8] == PNG


def tiny_vit(positions: str) -> ViT:
    cfg = ViTConfig(
        n_layer=1, n_head=2, d_model=16, image_size=8, channels=1, patch_size=4, n_labels=3, positions=positions
    )
    return ViT(cfg)


def rows_with_spread(v: int = 40, d: int = 6) -> np.ndarray:
    """Random rows with clearly different variances per direction (no near-ties between components)."""
    rng = np.random.default_rng(0)
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return rng.normal(size=(v, d)) * np.array([5.0, 3.0, 1.5, 1.0, 0.5, 0.2]) @ rotation + 7.0


# --- PCA --------------------------------------------------------------------------------------


def test_embedding_pca_matches_the_eigenvectors_of_the_covariance():
    x = rows_with_spread()
    points = embedding_pca(x, k=2)
    xc = x - x.mean(axis=0)
    evals, evecs = np.linalg.eigh(xc.T @ xc / (len(x) - 1))  # ascending
    top = evecs[:, ::-1][:, :2]  # (D, 2), largest variance first
    assert points.shape == (40, 2)
    assert np.allclose(points.var(axis=0, ddof=1), evals[::-1][:2])  # variance along each = its eigenvalue
    assert np.allclose(np.abs(points), np.abs(xc @ top))
    # With the same sign rule (largest-magnitude entry positive), the coordinates agree exactly.
    top = top * np.sign(top[np.abs(top).argmax(axis=0), [0, 1]])
    assert np.allclose(points, xc @ top)


def test_embedding_pca_is_deterministic_in_sign():
    x = rows_with_spread()
    points = embedding_pca(x, k=3)
    assert np.array_equal(points, embedding_pca(x, k=3))
    # -X has the same directions: the sign rule picks the same ones, so the coordinates just flip.
    assert np.allclose(embedding_pca(-x, k=3), -points)
    assert np.allclose(embedding_pca(x + 100.0, k=3), points)  # centred: a shift changes nothing
    perm = np.random.default_rng(1).permutation(len(x))
    assert np.allclose(embedding_pca(x[perm], k=3), points[perm])  # row order changes nothing
    # The direction behind each coordinate has its largest-magnitude entry positive.
    directions, *_ = np.linalg.lstsq(x - x.mean(axis=0), points, rcond=None)  # (D, K)
    assert (directions[np.abs(directions).argmax(axis=0), range(3)] > 0).all()


@pytest.mark.parametrize("k", [0, 7])
def test_embedding_pca_rejects_impossible_k(k):
    with pytest.raises(ValueError, match="matrix"):
        embedding_pca(rows_with_spread(), k=k)


# --- positions --------------------------------------------------------------------------------


def test_position_table_of_learned_positions_is_the_embedding_weight():
    model = GPT(tiny_model(positions="learned", vocab_size=20))
    table, label = position_table(model)
    assert table.shape == (32, 32) and label == "learned positions"
    assert np.array_equal(table, model.pos.embedding.weight.detach().numpy())


def test_position_table_of_sinusoidal_positions_is_the_sin_cos_table():
    table, label = position_table(GPT(tiny_model(positions="sinusoidal", vocab_size=20)))
    assert label == "sinusoidal positions"
    assert np.array_equal(table, sinusoidal_table(32, 32).numpy())


def test_position_table_of_a_vit_is_its_grid_table():
    table, label = position_table(tiny_vit("sinusoidal"))
    expected = torch.cat([torch.zeros(1, 16), sinusoidal_2d_table(2, 2, 16)])  # [CLS], then 2 x 2 patches
    assert table.shape == (5, 16) and "grid" in label
    assert np.array_equal(table, expected.numpy())
    learned = tiny_vit("learned")
    assert np.array_equal(position_table(learned)[0], learned.pos.embedding.weight.detach().numpy())


def test_position_table_of_seq2seq_is_the_encoders():
    model = Seq2Seq(
        Seq2SeqConfig(n_layer=1, n_head=2, d_model=16, context=8, src_vocab=10, tgt_vocab=12, positions="learned")
    )
    table, label = position_table(model)
    assert label == "encoder learned positions"
    assert np.array_equal(table, model.src_pos.embedding.weight.detach().numpy())


def test_position_table_refuses_models_without_positions():
    with pytest.raises(AttnlabError, match="positions 'none'"):
        position_table(GPT(tiny_model(positions="none", vocab_size=20)))
    with pytest.raises(AttnlabError, match="Pooled model has no position vectors"):
        position_table(Pooled(PooledConfig(vocab_size=20, d_embed=8)))


# --- labels and pictures ----------------------------------------------------------------------


def test_token_labels_skip_specials_and_put_words_first():
    tok = WordTokenizer(["the", ",", "x", "self", "\n", "def"])  # ids 5..10 after the 5 specials
    labels = token_labels(tok, n_rows=tok.vocab_size + 3, shift=3, max_tokens=4)
    assert len(labels) == 14
    # Words of several letters in vocabulary order, then the single letter; no specials, no comma.
    assert {i - 3: s for i, s in enumerate(labels) if s} == {5: "the", 8: "self", 10: "def", 7: "x"}
    chars = CharTokenizer("ab ,\n")  # ids 0, 1 specials; then the characters as given, from 2
    labels = token_labels(chars, n_rows=chars.vocab_size, shift=0, max_tokens=3)
    assert [s for s in labels if s] == ["a", "b", "·"]  # letters first, then the rest with whitespace shown


def test_plot_lr_positions_and_embeddings_write_pngs(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 3.0, "lr": min(s, 5) / 5 * 1e-3} for s in range(1, 21)] + [{"step": 20, "val_loss": 2}]
    metrics.write_text("\n".join(json.dumps(r) for r in rows))
    plot_lr(metrics, tmp_path / "lr.png")
    plot_positions(sinusoidal_table(16, 8).numpy(), "sinusoidal positions", tmp_path / "pos.png")
    points = embedding_pca(rows_with_spread())
    labels = ["$x$", "def", "\\n"] + [""] * (len(points) - 3)  # a "formula" must stay text
    plot_embeddings(points, labels, tmp_path / "emb.png", "three tokens")
    for name in ("lr.png", "pos.png", "emb.png"):
        assert is_png(tmp_path / name), name
    with pytest.raises(ValueError, match="one per point"):
        plot_embeddings(points, ["a"], tmp_path / "bad.png", "too few labels")
    metrics.write_text(json.dumps({"step": 1, "loss": 3.0}))
    with pytest.raises(AttnlabError, match="no learning rate"):
        plot_lr(metrics, tmp_path / "none.png")


def test_plot_run_refuses_what_the_model_lacks(tmp_path):
    vit = Run(tmp_path, tiny_vit("learned"), None, {"family": "vit"}, 0)
    with pytest.raises(AttnlabError, match="image run"):
        plot_run(vit, "embeddings", tmp_path / "e.png")
    bow = Run(tmp_path, BagOfWords(BagOfWordsConfig(vocab_size=20)), WordTokenizer(["a"]), {"family": "bow"}, 0)
    with pytest.raises(AttnlabError, match="bow model has no token embedding"):
        plot_run(bow, "embeddings", tmp_path / "e.png")
    with pytest.raises(AttnlabError, match="no losses logged"):
        plot_run(bow, "loss", tmp_path / "l.png")  # no metrics.jsonl at all
    assert not list(tmp_path.glob("*.png"))


# --- a trained run ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A GPT trained for 10 steps on the conftest corpus (the pictures are checked here, not the model)."""
    tmp = tmp_path_factory.mktemp("inspect")
    corpus, run = tmp / "corpus.txt", tmp / "run"
    corpus.write_text(TEXT * 40)
    args = [
        "train",
        "lm",
        "--data",
        corpus,
        "--out",
        run,
        *flags(preset="gpt-nano", n_layer=1, d_model=32, n_head=2, context=32, max_steps=10, batch_size=4),
        *flags(eval_interval=5, eval_batches=1, device="cpu", tokenizer="char"),
    ]
    assert main([str(a) for a in args]) == 0
    return attnlab.load(run, device="cpu")


@pytest.mark.parametrize("what", [w for w in WHAT if "expert" not in w])  # experts: tests/test_moe.py
def test_plot_run_draws_every_picture_of_a_trained_gpt(gpt_run, what, tmp_path):
    out = tmp_path / f"{what}.png"
    description = plot_run(gpt_run, what, out)
    assert is_png(out) and isinstance(description, str) and "\n" not in description
    expected = {
        "loss": "training loss at 10 steps and validation loss at",
        "lr": "learning rate at 10 steps",
        "positions": "learned positions of 32 x 32 (position x dimension)",
        "embeddings": f"token embeddings of {gpt_run.tokenizer.vocab_size} x 32 (token x dimension)",
    }[what]
    assert description.startswith(expected), description


def test_plot_run_labels_the_tokens_and_names_the_choices(gpt_run, tmp_path):
    description = plot_run(gpt_run, "embeddings", tmp_path / "e.png", max_tokens=5)
    assert description.endswith("5 tokens labelled")
    with pytest.raises(AttnlabError, match="loss, lr, positions, embeddings"):
        plot_run(gpt_run, "attention", tmp_path / "a.png")
