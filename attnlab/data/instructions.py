"""Built-in instruction data, generated (nothing downloaded): small tasks with one checkable answer,
that a tiny character-level model can learn on a CPU, and preference pairs made from them.

    Reverse "kxqp".                        pqxk
    Write "kxq" in capitals.               KXQ
    First letter of "kxqp"?                k
    Last letter of "kxqp"?                 p
    How many letters in "kxqp"?            4
    What comes after 399?                  400
    Which is larger, 31 or 13?             31
    Say 307 digit by digit.                three zero seven
    First letter of "abc"?  a  And the last?       c     (follow-ups: two user turns, two answers;
    What comes after 19?  20  And after that?     21      the second answer needs the first turn)
    Reverse "abc".  cba  What comes after 9?  10          (chains: 2-4 independent instructions in one
                                                           conversation, each answered in its turn)

Every kind draws from a large space (random letter strings, numbers to 999), so that a hash of the
question text can put about one question in eight into the test split and every kind still has its
fair share of test questions that training never saw: the model has to learn the rule, not the
answers. The splits never share a question, whatever the seed or size. The kinds are ones a 4 x 128
character-level GPT learns from scratch in about 800 steps (sums of two-digit numbers, tried, were
not). A preference pair keeps the right answer as chosen and a near miss as rejected (two letters
swapped, one letter left small or moved on, off by one, the other number, one digit read wrong); a
near miss always differs from the right answer.
"""

from __future__ import annotations

import random
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from attnlab.data.conversations import Conversation, Message, Preference
from attnlab.data.numbers import ONES

TEST_SHARE = 8  # one question in 8 is a test question

Turns = tuple[Message, ...]
Example = tuple[Turns, str, str]  # (the turns before the answer, the right answer, a near miss)


def _letters(rng: random.Random, low: int = 3, high: int = 6) -> str:
    """A random lowercase string: the question space is large, so test strings are unseen ones."""
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(low, high)))


def _other_letter(c: str) -> str:
    """The letter after `c` in the alphabet (z wraps to a), in c's case: a near miss of one letter."""
    alphabet = string.ascii_uppercase if c.isupper() else string.ascii_lowercase
    return alphabet[(alphabet.index(c) + 1) % 26]


def _swapped(text: str, rng: random.Random) -> str:
    """`text` with two neighbouring letters that differ swapped, or one letter changed if none differ."""
    spots = [i for i in range(len(text) - 1) if text[i] != text[i + 1]]
    if not spots:
        return _other_letter(text[0]) + text[1:]
    i = rng.choice(spots)
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


def _off_by_one(n: int, rng: random.Random) -> str:
    return str(n + 1 if n == 0 else n + rng.choice((-1, 1)))


def _one(question: str) -> Turns:
    return (Message("user", question),)


def _reverse(rng: random.Random) -> Example:
    w = _letters(rng, 3, 5)
    return _one(f'Reverse "{w}".'), w[::-1], _swapped(w[::-1], rng)


def _capitals(rng: random.Random) -> Example:
    w = _letters(rng, 3, 5)
    i = rng.randrange(len(w))  # the near miss leaves one letter small
    return _one(f'Write "{w}" in capitals.'), w.upper(), w.upper()[:i] + w[i] + w.upper()[i + 1 :]


def _first(rng: random.Random) -> Example:
    w = _letters(rng)
    return _one(f'First letter of "{w}"?'), w[0], _other_letter(w[0])


def _last(rng: random.Random) -> Example:
    w = _letters(rng)
    return _one(f'Last letter of "{w}"?'), w[-1], _other_letter(w[-1])


def _length(rng: random.Random) -> Example:
    w = _letters(rng, 2, 9)
    return _one(f'How many letters in "{w}"?'), str(len(w)), _off_by_one(len(w), rng)


def _after(rng: random.Random) -> Example:
    n = rng.randint(0, 998)
    return _one(f"What comes after {n}?"), str(n + 1), str(n + 2)


def _larger(rng: random.Random) -> Example:
    a, b = rng.sample(range(100), 2)
    return _one(f"Which is larger, {a} or {b}?"), str(max(a, b)), str(min(a, b))


def _digits(rng: random.Random) -> Example:
    """A number read out digit by digit: words for numbers that a small model can compose."""
    n = str(rng.randint(0, 999))
    i = rng.randrange(len(n))  # the near miss reads one digit as the next one
    near = n[:i] + str((int(n[i]) + 1) % 10) + n[i + 1 :]
    say = lambda digits: " ".join(ONES[int(d)] for d in digits)
    return _one(f"Say {n} digit by digit."), say(n), say(near)


def _first_then_last(rng: random.Random) -> Example:
    """First letter of "abc"? / a / And the last? -> c: the second answer needs the first turn's word."""
    w = _letters(rng)
    turns = (*_one(f'First letter of "{w}"?'), Message("assistant", w[0]), Message("user", "And the last?"))
    return turns, w[-1], _other_letter(w[-1])


def _after_then_after(rng: random.Random) -> Example:
    """What comes after n? / n+1 / And after that? -> n+2: the second answer needs the first turn."""
    n = rng.randint(0, 997)
    turns = (*_one(f"What comes after {n}?"), Message("assistant", str(n + 1)), Message("user", "And after that?"))
    return turns, str(n + 2), str(n + 1)


# Each kind is drawn equally often, so a test set holds them in about equal shares.
KINDS: tuple[Callable[[random.Random], Example], ...] = (
    _reverse,
    _capitals,
    _first,
    _last,
    _length,
    _after,
    _larger,
    _digits,
    _first_then_last,
    _after_then_after,
)


@dataclass(frozen=True)
class Phrasing:
    """How one kind is asked: a conversation of the test split (never trained on), its user turns and
    the answer to each."""

    kind: str
    asks: tuple[str, ...]
    answers: tuple[str, ...]


# What a model fine-tuned on these instructions understands, for the docs and `attnlab chat --help`
# (tests/test_chat_terminal.py checks that each is a test conversation the generator makes).
PHRASINGS = (
    Phrasing("reverse", ('Reverse "irexd".',), ("dxeri",)),
    Phrasing("capitals", ('Write "xjozq" in capitals.',), ("XJOZQ",)),
    Phrasing("first letter", ('First letter of "nzuo"?',), ("n",)),
    Phrasing("last letter", ('Last letter of "wlwfd"?',), ("d",)),
    Phrasing("length", ('How many letters in "eusbfq"?',), ("6",)),
    Phrasing("after", ("What comes after 956?",), ("957",)),
    Phrasing("larger", ("Which is larger, 91 or 81?",), ("91",)),
    Phrasing("digits", ("Say 468 digit by digit.",), ("four six eight",)),
    Phrasing("follow-up", ('First letter of "paguke"?', "And the last?"), ("p", "e")),
    Phrasing("follow-up", ("What comes after 563?", "And after that?"), ("564", "565")),
)


def in_test(question: str) -> bool:
    """The split a question belongs to, from its text alone (so no question is in both)."""
    return zlib.crc32(question.encode()) % TEST_SHARE == 0


def _examples(split: str, n: int, seed: int) -> list[Example]:
    """n distinct examples of `split` (train or test), drawn until there are enough."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(100 * n + 10_000):  # a bound, should someone ask for more questions than there are
        turns, right, near = rng.choice(KINDS)(rng)
        key = "\n".join(m.content for m in turns)
        if in_test(key) == (split == "test") and key not in seen:
            seen.add(key)
            out.append((turns, right, near))
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} distinct {split} instructions were found; ask for fewer")


CHAIN = (2, 4)  # the questions a chained conversation asks, fewest and most (a follow-up's two count)


def instructions(split: str = "train", n: int = 4000, seed: int = 0, chained: float = 0.0) -> list[Conversation]:
    """n instruction conversations of `split`, each ending in its one right answer. chained: the share
    of them that chain 2-4 independent instructions, each answered in its turn, so that a model learns
    to answer a new question asked after others (with only follow-ups as second turns, it never did)."""
    n_chains = round(n * chained)
    rng = random.Random(seed + 1)  # the chains' lengths and order, apart from the questions' draw
    sizes = [rng.randint(*CHAIN) for _ in range(n_chains)]
    # The single ones come first in the draw, so that they are the same whatever the share of chains;
    # a chain takes at most one instruction per question it asks (a follow-up asks two).
    examples = iter(_examples(split, n - n_chains + sum(sizes), seed))
    out = [(*turns, Message("assistant", right)) for turns, right, _ in islice(examples, n - n_chains)]
    for k in sizes:
        chain: list[Message] = []
        for taken, (turns, right, _) in enumerate(examples, 1):
            chain += (*turns, Message("assistant", right))
            if taken >= 2 and sum(m.role == "user" for m in chain) >= k:
                break
        out.append(tuple(chain))
    if n_chains:
        rng.shuffle(out)
    return [Conversation(messages) for messages in out]


def preferences(split: str = "train", n: int = 4000, seed: int = 0) -> list[Preference]:
    """n preference pairs of `split`: the right answer chosen, a near miss rejected."""
    return [
        Preference(turns, (Message("assistant", right),), (Message("assistant", near),))
        for turns, right, near in _examples(split, n, seed)
    ]
