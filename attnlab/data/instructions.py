"""Built-in instruction data, generated (nothing downloaded): small tasks with one checkable answer,
that a tiny model can learn on a CPU, and preference pairs made from them.

    What is 17 + 25?                       42
    Write 73 in words.                     seventy-three
    Spell "house" backwards.               esuoh
    How many letters are in "garden"?      6
    Which is larger, 31 or 13?             31
    What is 3 + 4?  7  And times 2?  14    (a follow-up: two user turns, two answers)

Every question is drawn from a seeded generator; a question lies in the test split when a hash of its
text says so (about one in eight), so the splits never share a question, whatever the seed or size.
A preference pair keeps the right answer as chosen and a near miss as rejected (off by one, two
letters swapped, the other number).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

from attnlab.data.conversations import Conversation, Message, Preference
from attnlab.data.numbers import english

WORDS = ("cat", "house", "garden", "river", "window", "planet", "bottle", "candle", "forest", "market", "pencil",
         "rabbit", "silver", "tunnel", "yellow", "orange", "bridge", "castle", "dragon", "engine", "flower", "guitar",
         "island", "jacket", "kitten", "ladder", "mirror", "needle", "pepper", "rocket", "saddle", "ticket", "violin",
         "wallet", "zipper", "anchor", "basket", "cookie", "desert", "feather")  # fmt: skip
TEST_SHARE = 8  # one question in 8 is a test question


def _sum(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    return f"What is {a} + {b}?", str(a + b), str(a + b + rng.choice((-1, 1)))


def _words(rng: random.Random) -> tuple[str, str, str]:
    n = rng.randint(1, 99)
    return f"Write {n} in words.", english(n), english(n + 1 if n < 99 else n - 1)


def _backwards(rng: random.Random) -> tuple[str, str, str]:
    w = rng.choice(WORDS)
    right = w[::-1]
    i = rng.randrange(len(w) - 1)
    near = right[:i] + right[i + 1] + right[i] + right[i + 2 :] if right[i] != right[i + 1] else right[1:]
    return f'Spell "{w}" backwards.', right, near


def _count(rng: random.Random) -> tuple[str, str, str]:
    w = rng.choice(WORDS)
    return f'How many letters are in "{w}"?', str(len(w)), str(len(w) + rng.choice((-1, 1)))


def _larger(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.sample(range(1, 100), 2)
    return f"Which is larger, {a} or {b}?", str(max(a, b)), str(min(a, b))


SINGLE: tuple[Callable[[random.Random], tuple[str, str, str]], ...] = (_sum, _words, _backwards, _count, _larger)


def in_test(question: str) -> bool:
    """The split a question belongs to, from its text alone (so no question is in both)."""
    return zlib.crc32(question.encode()) % TEST_SHARE == 0


def _follow_up(rng: random.Random) -> tuple[tuple[Message, ...], str, str]:
    """What is a + b? / a+b / And times k? -> (a+b)*k: the second answer needs the first turn."""
    a, b, k = rng.randint(0, 20), rng.randint(0, 20), rng.randint(2, 3)
    first = f"What is {a} + {b}?"
    turns = (Message("user", first), Message("assistant", str(a + b)), Message("user", f"And times {k}?"))
    return turns, str((a + b) * k), str((a + b) * k + rng.choice((-1, 1)))


def _example(rng: random.Random) -> tuple[tuple[Message, ...], str, str]:
    """(the turns before the answer, the right answer, a near miss); one in six a follow-up."""
    if rng.randrange(6) == 0:
        return _follow_up(rng)
    question, right, near = rng.choice(SINGLE)(rng)
    return (Message("user", question),), right, near


def _examples(split: str, n: int, seed: int) -> list[tuple[tuple[Message, ...], str, str]]:
    """n distinct examples of `split` (train or test), drawn until there are enough."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(100 * n + 10_000):  # a bound: the questions are finitely many
        turns, right, near = _example(rng)
        key = "\n".join(m.content for m in turns)
        if in_test(key) == (split == "test") and key not in seen:
            seen.add(key)
            out.append((turns, right, near))
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} distinct {split} instructions were found; ask for fewer")


def instructions(split: str = "train", n: int = 4000, seed: int = 0) -> list[Conversation]:
    """n instruction conversations of `split`, each ending in its one right answer."""
    return [Conversation((*turns, Message("assistant", right))) for turns, right, _ in _examples(split, n, seed)]


def preferences(split: str = "train", n: int = 4000, seed: int = 0) -> list[Preference]:
    """n preference pairs of `split`: the right answer chosen, a near miss rejected."""
    return [Preference(turns, (Message("assistant", right),), (Message("assistant", near),))
            for turns, right, near in _examples(split, n, seed)]  # fmt: skip
