"""digits-strips: a captioning task with no download, from scikit-learn's 8x8 handwritten digits.

2 to 4 digit images side by side on an 8x48 canvas, with random gaps (0-3 px) after a small random
left offset (0-3 px), captioned with the number in words:

    [7, 4]        "seventy-four"
    [1, 0, 5]     "one hundred five"
    [2, 0, 1, 9]  "two thousand nineteen"

One word may depend on two digits ("fourteen" on the tens and the units) and on position (a 7
is "seven", "seventy" or "seven hundred"), as words in real captions depend on regions of the
image. `caption_words` says which digits each word depends on, and `patch_of_box` which of the
2 x 12 patches cover a digit, so attention can be checked against where the words come from.

The 1,797 digit images are cut once, per class, into disjoint train/val/test pools (70/10/20%):
a strip of a split uses only its own pool, so test strips are made of digit images never seen
in training, not only new arrangements of seen ones.

The text starts near the left edge, as writing does. Offsets anywhere in the free width (up to
32 px) were tried first: after 2,000 steps both captioners still wrote a caption of the right
length with the wrong digits (measured), since "the first word" then means "the leftmost ink",
which a model must find before it can read it.

Legend: N strips, H height, W width.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from attnlab.data.images import _digits, stratified_cut
from attnlab.data.numbers import ONES, TENS, english

HEIGHT, WIDTH, PATCH = 8, 48, 4  # canvas (1 channel) and ViT patch: 2 x 12 patches
DIGIT = 8  # a digit image is 8x8
MIN_DIGITS, MAX_DIGITS = 2, 4
MAX_GAP = 3  # pixels between neighbouring digits, 0..MAX_GAP
MAX_OFFSET = 3  # pixels before the first digit, 0..MAX_OFFSET: text starts at the left, as written
STRIP_SPLITS = ("train", "val", "test")
POOL_FRACTIONS = {"test": 0.2, "val": 0.125}  # val is cut from what test leaves: 10% of all, train 70%
POOL_SEED = 0  # the pools never change: a test digit image stays a test image for every --data-seed
DEFAULT_COUNTS = {"train": 8000, "val": 500, "test": 1000}

Box = tuple[int, int]  # columns [x0, x1) of one digit on the canvas


@dataclass
class Strip:
    image: np.ndarray  # (HEIGHT, WIDTH) float32 in [0, 1]
    digits: list[int]  # left to right; the first is never 0
    boxes: list[Box]  # boxes[i]: the columns of digits[i]
    caption: str  # english(the number the digits write)
    sources: list[int]  # sources[i]: the row of scikit-learn's load_digits() drawn for digits[i]


# ---- the digit pools --------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _pools() -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    """All digit images (1797, 8, 8) and, per split, the rows of each class 0..9 in its pool."""
    images, labels, _ = _digits()  # (1797, 1, 8, 8) in [0, 1]
    cut = stratified_cut(labels, POOL_FRACTIONS, POOL_SEED)  # per class, so every pool has every digit
    pools = {name: [rows[labels[rows] == d] for d in range(10)] for name, rows in cut.items()}
    return images[:, 0], pools


def pool_rows(split: str) -> np.ndarray:
    """The rows of load_digits() that strips of `split` may use, sorted."""
    _, pools = _pools()
    return np.sort(np.concatenate(pools[_checked(split)]))


def _checked(split: str) -> str:
    if split not in STRIP_SPLITS:
        raise ValueError(f"split must be one of {', '.join(STRIP_SPLITS)}, got {split!r}")
    return split


# ---- strips -----------------------------------------------------------------------------------


def strips(split: str, n: int | None = None, seed: int = 0) -> list[Strip]:
    """`n` strips of `split` (default DEFAULT_COUNTS[split]), the same for the same (split, n, seed).

    Every random choice comes from one (N, 13) array of uniforms, a row per strip, drawn from one
    generator per split and seed: 8,000 strips cost one numpy call and a loop of slicing, and
    strips(s, 10) is strips(s, 100)[:10], since a row does not depend on how many follow it.
    """
    n = DEFAULT_COUNTS[_checked(split)] if n is None else n
    digit_images, pools = _pools()
    rng = np.random.default_rng([seed, STRIP_SPLITS.index(split)])  # its own stream per split
    u = rng.random((n, 13))  # (N, 13): count, 4 digits, 3 gaps, offset, 4 image picks
    count = MIN_DIGITS + (u[:, 0] * (MAX_DIGITS - MIN_DIGITS + 1)).astype(int)  # (N,) 2..4
    digits = (u[:, 1:5] * 10).astype(int)  # (N, 4), only the first count[i] used
    digits[:, 0] = 1 + (u[:, 1] * 9).astype(int)  # a leading 0 would write no word
    gaps = (u[:, 5:8] * (MAX_GAP + 1)).astype(int)  # (N, 3)
    offset_u, pick_u = u[:, 8], u[:, 9:]  # left offset as a share of the room left; image of each digit
    out = []
    for i in range(n):
        k = int(count[i])
        ds = [int(d) for d in digits[i, :k]]
        gap = [int(g) for g in gaps[i, : k - 1]]
        room = WIDTH - (DIGIT * k + sum(gap))  # >= 48 - 41: the widest strip always fits
        x = int(offset_u[i] * (min(room, MAX_OFFSET) + 1))
        boxes: list[Box] = []
        for j in range(k):
            boxes.append((x, x + DIGIT))
            x += DIGIT + (gap[j] if j < k - 1 else 0)
        sources = [int(pools[split][d][int(p * len(pools[split][d]))]) for d, p in zip(ds, pick_u[i])]
        out.append(Strip(_draw(digit_images, sources, boxes), ds, boxes, english(_number(ds)), sources))
    return out


def _draw(digit_images: np.ndarray, sources: list[int], boxes: list[Box]) -> np.ndarray:
    image = np.zeros((HEIGHT, WIDTH), dtype=np.float32)  # (H, W) black background, as the digits'
    for row, (x0, x1) in zip(sources, boxes):
        image[:, x0:x1] = digit_images[row]
    return image


def _number(digits: list[int]) -> int:
    return int("".join(map(str, digits)))


def as_arrays(strips: list[Strip]) -> tuple[np.ndarray, list[str]]:
    """Images (N, 1, H, W) float32 and their captions, as the captioning task reads them."""
    images = np.stack([s.image for s in strips])[:, None] if strips else np.zeros((0, 1, HEIGHT, WIDTH), np.float32)
    return images.astype(np.float32, copy=False), [s.caption for s in strips]


# ---- which digits each word depends on ----------------------------------------------------------

Word = tuple[str, tuple[int, ...]]  # a caption token and the indices (into the digits) it depends on


def caption_words(digits: list[int]) -> list[Word]:
    """The caption of `digits` as the word tokenizer's tokens, each with the digits it depends on.

    Built from the digits, not by parsing the caption, so each word knows where it came from:
    [7, 4] -> ("seventy", (0,)), ("-", (0, 1)), ("four", (1,)). A teen word ("ten", "fourteen")
    depends on the tens and the units; "hundred" on the hundreds digit, as does that digit's own
    word; "thousand" on the digits of the thousands (one digit in a strip). Zeros write no word.
    """
    if not 1 <= len(digits) <= 6:
        raise ValueError(f"1 to 6 digits (numbers below {10**6:,}), got {len(digits)}")
    if not any(digits):
        return [("zero", tuple(range(len(digits))))]
    split = max(0, len(digits) - 3)  # digits before `split` count the thousands
    words = []
    if any(digits[:split]):
        words += _below_1000(digits, range(split))
        words.append(("thousand", tuple(range(split))))
    return words + _below_1000(digits, range(split, len(digits)))


def _below_1000(digits: list[int], where: range) -> list[Word]:
    """Words of the (up to 3) digits at indices `where`, e.g. 3 4 2 -> three hundred forty - two."""
    at = [None] * (3 - len(where)) + list(where)  # indices of hundreds, tens, units (None: absent)
    h, t, u = (0 if i is None else digits[i] for i in at)
    ih, it, iu = at
    words: list[Word] = []
    if h:
        words += [(ONES[h], (ih,)), ("hundred", (ih,))]
    if t >= 2:
        words.append((TENS[t], (it,)))
        if u:
            words += [("-", (it, iu)), (ONES[u], (iu,))]  # the hyphen joins the tens to the units
    elif t == 1:
        words.append((ONES[10 + u], (it, iu)))  # ten..nineteen: one word for two digits
    elif u:
        words.append((ONES[u], (iu,)))
    return words


def patch_of_box(box: Box, patch: tuple[int, int] = (PATCH, PATCH)) -> set[int]:
    """Patches of `patch` = (height, width) pixels (row-major over the grid) that lie within a digit's box.

    A patch is within the box when its columns share at least half a patch width (2 px for the
    default 4 x 4) with the box's columns [x0, x1): a digit placed off the patch grid covers one
    patch by a pixel or two at each side, and attention there is as much on the neighbouring gap
    or digit as on it. Digits fill the canvas's height, so every row of the grid counts.
    """
    (x0, x1), (ph, pw) = box, patch
    cols = [c for c in range(WIDTH // pw) if min(x1, (c + 1) * pw) - max(x0, c * pw) >= pw / 2]
    return {r * (WIDTH // pw) + c for r in range(HEIGHT // ph) for c in cols}


def word_patches(strip: Strip, patch: tuple[int, int] = (PATCH, PATCH)) -> list[tuple[str, set[int]]]:
    """Each caption token of `strip` with the patches of the digits it depends on."""
    return [
        (word, set().union(*(patch_of_box(strip.boxes[i], patch) for i in deps)))
        for word, deps in caption_words(strip.digits)
    ]
