"""Training batches of like length: every row as likely as with uniform draws, each batch from one
group of lengths, less padding, small data sets drawn uniformly."""

import numpy as np

from attnlab.data.batches import LengthGroups, draw_rows
from attnlab.data.supervised import Example, Supervised


def lengths(n: int = 4000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)  # mostly short rows, a third long ones (chained conversations)
    return np.where(rng.random(n) < 0.3, rng.integers(150, 440, n), rng.integers(40, 100, n))


def test_each_batch_comes_from_one_group_and_pads_less():
    ls = lengths()
    groups = LengthGroups(list(ls), batch=32)
    assert len(groups.groups) == 8
    edges = [(ls[g].min(), ls[g].max()) for g in groups.groups]
    rng, urng = np.random.default_rng(1), np.random.default_rng(1)
    grouped, uniform = [], []
    for _ in range(300):
        rows = draw_rows(len(ls), 32, rng, groups)
        assert any(lo <= ls[rows].min() and ls[rows].max() <= hi for lo, hi in edges)
        grouped.append(ls[rows].max())
        uniform.append(ls[draw_rows(len(ls), 32, urng)].max())
    assert np.mean(uniform) / np.mean(grouped) > 1.8  # the padded batch: 2.15x shorter on this mix


def test_every_row_is_as_likely_as_with_uniform_draws():
    ls = lengths(1000)
    groups = LengthGroups(list(ls), batch=8, groups=5, spread=1)
    counts = np.zeros(len(ls))
    rng = np.random.default_rng(2)
    for _ in range(20000):
        np.add.at(counts, groups.draw(8, rng), 1)
    # each row expects 160 draws; a group drawn too often or too seldom would shift a fifth of them
    per_group = [counts[g].mean() for g in groups.groups]
    assert np.allclose(per_group, 160, rtol=0.05), per_group


def test_a_small_data_set_is_one_group():
    groups = LengthGroups(list(lengths(100)), batch=32)
    assert len(groups.groups) == 1 and len(groups.groups[0]) == 100


def test_sft_batches_group_training_rows_only():
    ls = lengths(2000)
    examples = [Example(np.arange(n) % 50, np.ones(n, dtype=bool)) for n in ls]
    data = Supervised({"train": examples, "val": examples}, batch=16)
    rng = np.random.default_rng(3)
    train = [data.batch("train", 16, rng, (0, 1))[0].shape[1] for _ in range(100)]
    val = [data.batch("val", 16, rng, (0, 1))[0].shape[1] for _ in range(100)]
    assert np.mean(val) / np.mean(train) > 1.8
