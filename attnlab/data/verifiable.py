"""Verifiable tasks: generated questions whose answers a program checks exactly, with a difficulty
that can be raised, for rewards that cannot be gamed (GRPO's "verifiable rewards").

    add        What is 482 + 915?            1397          level: digits of each number
    multiply   What is 482 * 7?              3374          level: digits of the first number
    countdown  Make 24 from 3 5 8 9.         3*8           level: how many numbers are given

A countdown answer is any arithmetic expression (+, -, *, /, brackets) over some of the given numbers,
each used at most as often as it is given, whose divisions come out whole and whose value is the
target; the reference answer is the expression the target was built from, one of possibly many.
Answers are read by a checker of their own (Python's parser, then a walk that allows only numbers and
those four operators), never evaluated. The splits are the built-in instructions' (a hash of the
question text puts one question in eight into the test split), so train and test never share one.

`graded(question, answer, reference)` is how every held-out answer and grpo's exact reward are
judged: by the checker where the question is a verifiable one (so any right countdown expression
counts), by equality with the reference elsewhere. `attnlab train sft|grpo --data add --level 2`
trains on them (data/finetune.py).
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from attnlab.data.conversations import Conversation, Message
from attnlab.data.instructions import in_test
from attnlab.errors import ArgumentValueError

LEVELS = {"add": 3, "multiply": 3, "countdown": 4}  # the default difficulty of each kind
MAX_ANSWER = 64  # characters of an answer the checker reads at most


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # a right answer (for countdown, one of them)


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def _add(rng: random.Random, level: int) -> Problem:
    a, b = _number(rng, level), _number(rng, level)
    return Problem(f"What is {a} + {b}?", str(a + b))


def _multiply(rng: random.Random, level: int) -> Problem:
    a, b = _number(rng, level), rng.randint(2, 9)
    return Problem(f"What is {a} * {b}?", str(a * b))


def _countdown(rng: random.Random, level: int) -> Problem:
    """`level` numbers of 1-10 and a target built from 2 or more of them by a random expression whose
    value is a whole number from 1 to 999."""
    while True:
        numbers = [rng.randint(1, 10) for _ in range(level)]
        used = rng.sample(numbers, rng.randint(2, level))
        terms = [(str(n), Fraction(n)) for n in used]
        while len(terms) > 1:
            (ta, va), (tb, vb) = terms.pop(rng.randrange(len(terms))), terms.pop(rng.randrange(len(terms)))
            op = rng.choice("+-*/")
            if op == "/" and (vb == 0 or (va / vb).denominator != 1):
                op = "*"
            value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else va}[op]
            terms.append((f"({ta}{op}{tb})", value))
        text, value = terms[0]
        if value.denominator == 1 and 1 <= value <= 999:
            return Problem(f"Make {int(value)} from {' '.join(map(str, numbers))}.", text[1:-1])


KINDS: dict[str, Callable[[random.Random, int], Problem]] = {
    "add": _add,
    "multiply": _multiply,
    "countdown": _countdown,
}


def problems(kind: str, split: str = "train", n: int = 1000, seed: int = 0, level: int | None = None) -> list[Problem]:
    """n distinct problems of `kind` in `split` (train or test) at `level` (default LEVELS[kind])."""
    # ArgumentValueError: a ValueError to a Python caller, one line on the command line (--level 9)
    if kind not in KINDS:
        raise ArgumentValueError(f"unknown verifiable task {kind!r} (known: {', '.join(KINDS)})")
    if split not in ("train", "test"):
        raise ArgumentValueError(f"split must be train or test, got {split!r}")
    level = LEVELS[kind] if level is None else level
    if level < (2 if kind == "countdown" else 1):
        raise ArgumentValueError(f"{kind}'s level must be at least {2 if kind == 'countdown' else 1}, got {level}")
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(100 * n + 10_000):
        p = KINDS[kind](rng, level)
        if in_test(p.question) == (split == "test") and p.question not in seen:
            seen.add(p.question)
            out.append(p)
            if len(out) == n:
                return out
    raise ArgumentValueError(
        f"only {len(out)} distinct {split} {kind} problems at level {level}: ask for fewer "
        "(--examples, --test-examples) or raise --level"
    )


def conversations(
    kind: str,
    split: str = "train",
    n: int = 1000,
    seed: int = 0,
    level: int | None = None,
) -> list[Conversation]:
    """The problems as chat conversations ending in their reference answer (for sft)."""
    return [
        Conversation((Message("user", p.question), Message("assistant", p.answer)))
        for p in problems(kind, split, n, seed, level)
    ]


ARITHMETIC = re.compile(r"What is (\d+) ([+*]) (\d+)\?")
COUNTDOWN = re.compile(r"Make (\d+) from ((?:\d+ )*\d+)\.")


def check(question: str, answer: str) -> bool:
    """Whether `answer` is right for `question` (any verifiable kind's); False for a question of no kind."""
    if m := ARITHMETIC.fullmatch(question):
        a, op, b = int(m[1]), m[2], int(m[3])
        return answer.strip() == str(a + b if op == "+" else a * b)
    if m := COUNTDOWN.fullmatch(question):
        value = countdown_value(answer, Counter(int(x) for x in m[2].split()))
        return value is not None and value == int(m[1])
    return False


def question_of(messages: Sequence[Message]) -> str:
    """The question a conversation's next answer answers: its last user message ("" if none)."""
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


def graded(question: str, answer: str, reference: str) -> bool:
    """Whether `answer` is a right answer to `question`, whose stored answer is `reference`: the
    checker's verdict when the question is a verifiable one that the reference passes (a user's file
    may ask "What is 2 + 3?" and expect "It is 5."), else the answer equal to the reference."""
    if check(question, reference):
        return check(question, answer)
    return answer.strip() == reference.strip()


def countdown_value(expression: str, given: Counter) -> Fraction | None:
    """The value of an arithmetic expression over the numbers `given` (each at most as often as given),
    or None: anything but numbers, + - * / and brackets, a division that is not whole, or too long."""
    if len(expression) > MAX_ANSWER:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    used: Counter = Counter()
    value = _value(tree, used)
    return value if value is not None and not used - given else None


OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__}


def _value(node: ast.AST, used: Counter) -> Fraction | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used[node.value] += 1
        return Fraction(node.value)
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, (*OPS, ast.Div)):
        return None
    a, b = _value(node.left, used), _value(node.right, used)
    if a is None or b is None:
        return None
    if isinstance(node.op, ast.Div):
        return a / b if b != 0 and (a / b).denominator == 1 else None
    return OPS[type(node.op)](a, b)
