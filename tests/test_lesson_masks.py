"""A learner who uses a mask the wrong way round is told so, not shown a bare "nan": lesson 1's
masked attention and lesson 3's additive attention, answered with the mask inverted (with and without
nan_to_num), and with a row of only -inf for another reason."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

LESSONS = Path(__file__).resolve().parent.parent / "lessons"


@pytest.fixture(scope="module", autouse=True)
def lessons_on_path():
    """lessons/ importable as the lessons see it (`from checks.attention import ...`)."""
    sys.path.insert(0, str(LESSONS))
    yield
    sys.path.remove(str(LESSONS))


def scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def inverted(q, k, v, mask):  # -inf where the mask is True: the last query sees no key, its row is nan
    return scores(q, k).masked_fill(mask, float("-inf")).softmax(-1) @ v


def inverted_no_nan(q, k, v, mask):
    return torch.nan_to_num(inverted(q, k, v, mask))


def first_key_hidden(q, k, v, mask):  # the right mask, and key 0 hidden too: query 0 sees nothing
    hide = ~mask
    hide[..., 0] = True
    return scores(q, k).masked_fill(hide, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize(
    "answer, says",
    [
        (inverted, r"^rows \[4\] are entirely masked, giving nan: the mask is inverted, .*\(~mask\) with -inf$"),
        (inverted_no_nan, r"^the mask is inverted: each query sees the future keys .*\(~mask\) with -inf$"),
        (first_key_hidden, r"^rows \[0\] are nan: every key of those queries got -inf, though each query may"),
    ],
)
def test_masked_attention_with_a_wrong_mask_is_told_what_is_wrong(answer, says):
    from checks._common import WrongAnswer
    from checks.attention import check_attention

    with pytest.raises(WrongAnswer, match=says) as wrong:
        check_attention(answer)
    assert "nan at" not in str(wrong.value) and "non-finite" not in str(wrong.value)


@pytest.mark.parametrize("clean", [False, True], ids=["nan", "nan_to_num"])
def test_additive_attention_with_the_mask_inverted_is_told(clean):
    from checks._common import WrongAnswer
    from checks.translation import check_additive_attention

    def answer(query, keys, values, mask, v):
        weights = (torch.tanh(keys + query[:, None, :]) @ v).masked_fill(mask, float("-inf")).softmax(-1)
        weights = torch.nan_to_num(weights) if clean else weights
        return (weights[:, None, :] @ values)[:, 0], weights

    with pytest.raises(WrongAnswer, match=r"^row 0 is entirely masked, giving nan: the mask is inverted"):
        check_additive_attention(answer)
