"""digits-strips (data/strips.py) and captioned image folders (data/captions.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from attnlab.data import strips as S
from attnlab.data.captions import CAPTION_SPLITS, CaptionDataConfig, load_captions
from attnlab.data.numbers import english
from attnlab.data.tokenizers import WordTokenizer
from attnlab.errors import AttnlabError

pytestmark = pytest.mark.usefixtures("one_thread")


def _number(digits: list[int]) -> int:
    return int("".join(map(str, digits)))


# ---- strips -----------------------------------------------------------------------------------


def test_strips_are_deterministic_by_seed():
    a, b, c = S.strips("val", 50, seed=3), S.strips("val", 50, seed=3), S.strips("val", 50, seed=4)
    assert all(np.array_equal(x.image, y.image) and x.digits == y.digits and x.boxes == y.boxes for x, y in zip(a, b))
    assert [x.caption for x in a] != [x.caption for x in c]
    assert [x.digits for x in S.strips("val", 10, seed=3)] == [x.digits for x in a[:10]]  # a prefix
    assert len(S.strips("test")) == S.DEFAULT_COUNTS["test"]


def test_splits_use_disjoint_digit_pools():
    pools = {split: set(S.pool_rows(split).tolist()) for split in S.STRIP_SPLITS}
    assert not pools["train"] & pools["val"] and not pools["train"] & pools["test"] and not pools["val"] & pools["test"]
    assert sum(map(len, pools.values())) == 1797
    assert len(pools["test"]) == pytest.approx(0.2 * 1797, abs=10) and len(pools["val"]) == pytest.approx(180, abs=10)
    for split in S.STRIP_SPLITS:
        used = {row for s in S.strips(split, 300) for row in s.sources}
        assert used <= pools[split]


def test_every_strip_is_well_formed():
    from sklearn.datasets import load_digits

    digits = load_digits()
    for split in S.STRIP_SPLITS:
        for s in S.strips(split, 200, seed=1):
            assert s.caption == english(_number(s.digits))
            assert 2 <= len(s.digits) <= 4 and s.digits[0] != 0 and all(0 <= d <= 9 for d in s.digits)
            assert s.image.shape == (S.HEIGHT, S.WIDTH) and s.image.dtype == np.float32
            assert 0 <= s.image.min() and s.image.max() <= 1
            assert s.boxes[0][0] >= 0 and s.boxes[-1][1] <= S.WIDTH
            for (x0, x1), (n0, _) in zip(s.boxes, s.boxes[1:]):
                assert x1 - x0 == 8 and 0 <= n0 - x1 <= S.MAX_GAP  # in order, not overlapping
            covered = np.zeros(S.WIDTH, dtype=bool)
            for d, row, (x0, x1) in zip(s.digits, s.sources, s.boxes):
                assert digits.target[row] == d
                np.testing.assert_allclose(s.image[:, x0:x1], digits.images[row] / 16, atol=1e-6)
                covered[x0:x1] = True
            assert not s.image[:, ~covered].any()  # nothing drawn outside the boxes


def test_strips_vary_in_length_gaps_and_offset():
    many = S.strips("train", 500)
    assert {len(s.digits) for s in many} == {2, 3, 4}
    assert {s.boxes[1][0] - s.boxes[0][1] for s in many} == set(range(S.MAX_GAP + 1))
    assert {s.boxes[0][0] for s in many} == set(range(S.MAX_OFFSET + 1))  # text starts near the left edge


def test_as_arrays():
    few = S.strips("test", 5)
    images, captions = S.as_arrays(few)
    assert images.shape == (5, 1, S.HEIGHT, S.WIDTH) and images.dtype == np.float32
    assert captions == [s.caption for s in few]
    np.testing.assert_array_equal(images[2, 0], few[2].image)


# ---- which digits each word depends on ----------------------------------------------------------


@pytest.mark.parametrize(
    "digits, words",
    [
        ([7, 4], [("seventy", (0,)), ("-", (0, 1)), ("four", (1,))]),
        ([1, 0, 5], [("one", (0,)), ("hundred", (0,)), ("five", (2,))]),
        ([1, 4], [("fourteen", (0, 1))]),
        ([2, 0, 1, 9], [("two", (0,)), ("thousand", (0,)), ("nineteen", (2, 3))]),
        ([3, 0, 0, 0], [("three", (0,)), ("thousand", (0,))]),
        ([1, 0], [("ten", (0, 1))]),
        (
            [4, 3, 2, 1],
            [
                ("four", (0,)),
                ("thousand", (0,)),
                ("three", (1,)),
                ("hundred", (1,)),
                ("twenty", (2,)),
                ("-", (2, 3)),
                ("one", (3,)),
            ],
        ),
    ],
)
def test_caption_words_by_hand(digits, words):
    assert S.caption_words(digits) == words


def test_caption_words_are_the_tokenizers_tokens():
    for n in range(10, 10_000):  # every number a strip can write (~0.2 s)
        digits = [int(c) for c in str(n)]
        assert [w for w, _ in S.caption_words(digits)] == WordTokenizer.split(english(n)), n


def test_patch_of_box():
    # 2 x 12 grid of 4-px patches; a box over columns [2, 10) shares 2 px with patch column 0,
    # 4 px with column 1 and 2 px with column 2: all three count, in both rows.
    assert S.patch_of_box((2, 10)) == {0, 1, 2, 12, 13, 14}
    assert S.patch_of_box((3, 11)) == {1, 2, 13, 14}  # 1 px of column 0 and 3 of column 2: not column 0
    assert S.patch_of_box((40, 48)) == {10, 11, 22, 23}
    # 8 x 2 column patches (1 x 24): a column counts when 1 px of its 2 is in the box
    assert S.patch_of_box((3, 11), (8, 2)) == {1, 2, 3, 4, 5}


def test_word_patches():
    strip = S.Strip(np.zeros((S.HEIGHT, S.WIDTH), np.float32), [7, 4], [(0, 8), (10, 18)], "seventy-four", [0, 0])
    tens, units = {0, 1, 12, 13}, {2, 3, 4, 14, 15, 16}  # (10, 18) shares 2 px with columns 2 and 4
    assert S.word_patches(strip) == [("seventy", tens), ("-", tens | units), ("four", units)]


# ---- a user's folder ---------------------------------------------------------------------------


def _folder(tmp_path, lines, sizes=((8, 8), (8, 8), (8, 8))):
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(np.full((h, w), 40 * (i + 1), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return tmp_path


LINES = [
    {"image": "0.png", "caption": "a dark square"},
    {"image": "1.png", "caption": "a grey square"},
    {"image": "1.png", "caption": "another grey  square"},
    {"image": "2.png", "caption": "a light square"},
]


def test_load_captions_from_a_folder(tmp_path):
    root = _folder(tmp_path, LINES)
    splits = load_captions(CaptionDataConfig(data=str(root)))
    assert set(splits) == set(CAPTION_SPLITS)
    seen = {}
    for split, (images, captions) in splits.items():
        assert images.shape[1:] == (1, 8, 8) and images.dtype == np.float32 and len(images) == len(captions) >= 1
        for x, c in zip(images, captions):
            seen[c] = (split, round(float(x.mean()) * 255))
    # every caption once, with its own image; both captions of 1.png in one split (cut by image)
    assert seen == {
        "a dark square": (seen["a dark square"][0], 40),
        "a grey square": (seen["a grey square"][0], 80),
        "another grey square": (seen["a grey square"][0], 80),
        "a light square": (seen["a light square"][0], 120),
    }
    again = load_captions(CaptionDataConfig(data=str(root / "captions.jsonl")))
    assert {k: v[1] for k, v in again.items()} == {k: v[1] for k, v in splits.items()}


def test_load_captions_sizes(tmp_path):
    root = _folder(tmp_path, LINES, sizes=((8, 16), (8, 16), (4, 8)))
    with pytest.warns(UserWarning, match="resized"):
        images, _ = load_captions(CaptionDataConfig(data=str(root)))["train"]
    assert images.shape[2:] == (8, 16)
    images, _ = load_captions(CaptionDataConfig(data=str(root), image_size=4))["train"]
    assert images.shape[2:] == (4, 8)  # the height asked for, the width in proportion
    images, _ = load_captions(CaptionDataConfig(image_size=16))["val"]
    assert images.shape == (S.DEFAULT_COUNTS["val"], 1, 16, 96)


@pytest.mark.parametrize(
    "lines, error",
    [
        ([], "no captions"),
        ([{"image": "0.png", "caption": "  "}], "caption of 0.png is empty"),
        ([{"image": "missing.png", "caption": "x"}], "image not found: .*missing.png"),
        ([{"picture": "0.png", "caption": "x"}], "'image' is missing"),
    ],
)
def test_load_captions_errors(tmp_path, lines, error):
    root = _folder(tmp_path, LINES[:1] + lines if lines else [])
    with pytest.raises(AttnlabError, match=error):
        load_captions(CaptionDataConfig(data=str(root)))


def test_load_captions_needs_captions_jsonl(tmp_path):
    with pytest.raises(AttnlabError, match="no captions.jsonl"):
        load_captions(CaptionDataConfig(data=str(tmp_path)))
    with pytest.raises(AttnlabError, match="not found"):
        load_captions(CaptionDataConfig(data=str(tmp_path / "nowhere")))
