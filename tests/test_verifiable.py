"""Verifiable tasks: the reference answers check, wrong ones do not, the countdown checker reads only
arithmetic over the given numbers, the splits never share a question, and the level raises difficulty."""

import re
from collections import Counter
from fractions import Fraction

import pytest

from attnlab.data.conversations import Conversation
from attnlab.data.instructions import in_test
from attnlab.data.verifiable import KINDS, check, conversations, countdown_value, problems


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_reference_answers_check_and_near_misses_do_not(kind):
    for p in problems(kind, "train", 300, 1) + problems(kind, "test", 60, 1):
        assert check(p.question, p.answer), p
        if kind != "countdown":
            assert not check(p.question, str(int(p.answer) + 1)) and not check(p.question, p.answer + "0")
    assert not check("What is 2 + 2?", "5") and check("What is 2 + 2?", " 4 ")


def test_countdown_targets_are_what_their_reference_expressions_compute():
    for p in problems("countdown", "train", 300, 2):
        target, numbers = p.question.removeprefix("Make ").removesuffix(".").split(" from ")
        given = Counter(int(x) for x in numbers.split())
        assert countdown_value(p.answer, given) == int(target) and 1 <= int(target) <= 999
        assert len(re.findall(r"\d+", p.answer)) >= 2  # built from two numbers or more


@pytest.mark.parametrize(
    "answer, right",
    [
        ("3*8", True),
        ("(9-5)*(8-3)-(-4)", False),
        ("8*3", True),
        ("(5+3)*(9-8+2)", False),
        ("9+5+8+3-1", False),
        ("(9-3)*(8-5+1)", False),
        ("8*(9-5-1)", False),
        ("3*8*1", False),
        ("8/3*9", False),
        ("3**2", False),
        ("__import__('os').system('true')", False),
        ("3*8 if 1 else 0", False),
        ("3 * 8", True),
        ("24", False),
        ("(9+3)*(8-5)-(5)", False),
        ("9*8/3", True),
        ("(9*8)/3", True),
        ("", False),
        ("3*", False),
        ("8*3.0", False),
        ("True*24", False),
        ("9" + "+0" * 40, False),
    ],
)
def test_the_countdown_checker_reads_only_arithmetic_over_the_given_numbers(answer, right):
    assert check("Make 24 from 3 5 8 9.", answer) is right


def test_whole_division_only_and_numbers_as_often_as_given():
    assert countdown_value("8/4", Counter({8: 1, 4: 1})) == Fraction(2)
    assert countdown_value("9/4", Counter({9: 1, 4: 1})) is None
    assert countdown_value("8/0", Counter({8: 1, 0: 1})) is None
    assert countdown_value("3+3", Counter({3: 1})) is None and countdown_value("3+3", Counter({3: 2})) == 6


def test_the_splits_never_share_a_question_and_are_reproducible():
    for kind in KINDS:
        train, test = problems(kind, "train", 400, 0), problems(kind, "test", 50, 0)
        assert not {p.question for p in train} & {p.question for p in test}
        assert all(not in_test(p.question) for p in train) and all(in_test(p.question) for p in test)
        assert problems(kind, "train", 400, 0) == train and problems(kind, "train", 400, 1) != train


def test_the_level_raises_the_difficulty():
    assert {len(p.answer) for p in problems("add", "train", 50, 0, level=1)} <= {1, 2}
    assert min(len(p.answer) for p in problems("add", "train", 50, 0, level=6)) >= 6
    assert all(len(p.question.split(" from ")[1].split()) == 6 for p in problems("countdown", "train", 20, 0, level=6))
    with pytest.raises(ValueError, match="level must be at least 2"):
        problems("countdown", level=1)
    with pytest.raises(ValueError, match="unknown verifiable task"):
        problems("sudoku")


def test_conversations_end_in_the_reference_answer():
    convs = conversations("multiply", "train", 5, 0)
    assert all(isinstance(c, Conversation) and check(c.messages[0].content, c.messages[1].content) for c in convs)
