"""Generated sentiment task: short restaurant reviews that a bag of words cannot classify.

Every review is built from clauses `the ASPECT COPULA [NEGATION] [INTENSIFIER] ADJECTIVE`:

    the food was good                                  positive
    the restaurant is not too terrible                 positive  (a negation flips the adjective)
    the food was good but the service was terrible     negative  (after "but", the last part wins)
    the food was terrible but the service was good     positive  (same words, other order, other label)
    the food was good but the service was not          negative  (elided: "the service was not good")
    the food was good but not great                    negative  (one aspect, two predicates)
    the food is tasty and the staff is friendly        positive  ("and" joins parts of one sentiment)

Rules: "but" always joins parts of opposite sentiment, "and" parts of the same one, and the
label is the sentiment of the last part. Most "but" reviews (60%) come with a twin made of the
same words in another order and with the opposite label, so word counts alone carry no signal
for them: a model has to read word order. Text is lowercase, one space between words.
"""

from __future__ import annotations

import functools
import random

LABELS = ("negative", "positive")  # index = class id; polarity -1 -> 0, +1 -> 1

ASPECTS = (
    "food",
    "service",
    "staff",
    "restaurant",
    "music",
    "price",
    "view",
    "dessert",
    "room",
    "wine",
    "menu",
    "atmosphere",
)
COPULAS = ("was", "is")
INTENSIFIERS = ("very", "really", "extremely", "quite")
NEGATIONS = (("not",), ("not", "too"), ("never",), ("hardly",))
# Adjectives for every aspect, mildest first: "good but not great" reads right, "great but not good" does not.
POSITIVE = ("decent", "nice", "pleasant", "good", "lovely", "great", "wonderful", "excellent", "superb")
NEGATIVE = ("mediocre", "poor", "disappointing", "bad", "awful", "terrible", "horrible", "dreadful")
# Adjectives that only suit some aspects ("the view was rude" is not English): (positive, negative).
SPECIFIC = {
    "food": (("tasty", "fresh"), ("bland", "cold")),
    "dessert": (("tasty", "sweet"), ("bland", "stale")),
    "service": (("fast", "friendly"), ("slow", "rude")),
    "staff": (("friendly", "helpful"), ("rude", "slow")),
    "price": (("fair", "cheap"), ("high", "steep")),
    "music": (("lively", "soft"), ("loud", "boring")),
    "room": (("clean", "spacious"), ("dirty", "cramped")),
    "view": (("stunning", "beautiful"), ("dull", "ugly")),
    "wine": (("smooth", "rich"), ("sour", "flat")),
    "menu": (("varied", "creative"), ("limited", "boring")),
    "atmosphere": (("cozy", "relaxed"), ("noisy", "gloomy")),
    "restaurant": (("cozy", "clean"), ("dirty", "noisy")),
}
TWIN_RATE = 0.6  # chance that a two-part review is followed by its opposite-label twin
# Pattern mix: one clause, "and", "but" with two clauses, elided "but", one aspect with two predicates.
WEIGHTS = {"one": 0.2, "and": 0.1, "but": 0.25, "elided": 0.2, "short": 0.25}


def adjectives(aspect: str) -> dict[str, int]:
    """The adjectives that suit `aspect`, each with its polarity (+1 positive, -1 negative)."""
    pos, neg = SPECIFIC.get(aspect, ((), ()))
    return {**{a: 1 for a in POSITIVE + pos}, **{a: -1 for a in NEGATIVE + neg}}


# ---- parsing: the rule that defines the labels ------------------------------------------------


def _word(words: list[str], i: int) -> str:
    return words[i] if i < len(words) else ""


def _predicate(words: list[str], i: int, aspect: str) -> tuple[int, str, int]:
    """Parse `[NEGATION] [INTENSIFIER] ADJECTIVE` at words[i:]: (sentiment, adjective, next index)."""
    flip = 1
    if words[i : i + 2] == ["not", "too"] or _word(words, i) in ("never", "hardly"):
        flip, i = -1, i + (2 if words[i] == "not" else 1)  # no intensifier after these
    elif _word(words, i) == "not":
        flip, i = -1, i + 1 + (_word(words, i + 1) in INTENSIFIERS)  # "not very good"
    elif _word(words, i) in INTENSIFIERS:
        i += 1
    adj = _word(words, i)
    if adj not in adjectives(aspect):
        raise ValueError(f"expected an adjective for {aspect!r} at word {i}, got {adj!r}")
    return flip * adjectives(aspect)[adj], adj, i + 1


def _clause(words: list[str], i: int) -> tuple[int, str, str, int]:
    """Parse `the ASPECT COPULA predicate` at words[i:]: (sentiment, adjective, aspect, next index)."""
    if _word(words, i) != "the" or _word(words, i + 1) not in ASPECTS or _word(words, i + 2) not in COPULAS:
        raise ValueError(f"expected 'the ASPECT was|is' at word {i}")
    sentiment, adj, j = _predicate(words, i + 3, words[i + 1])
    return sentiment, adj, words[i + 1], j


def label_of(text: str) -> str:
    """The label the grammar's rules give `text`; ValueError if `text` is not in the grammar."""
    words = text.split(" ")
    try:
        first, adj, aspect, i = _clause(words, 0)
        if i == len(words):
            return LABELS[first > 0]
        conj, rest = words[i], words[i + 1 :]
        if conj == "and":
            last, _, aspect2, i = _clause(words, i + 1)
        elif conj != "but":
            raise ValueError(f"expected 'and' or 'but' at word {i}, got {conj!r}")
        elif (
            rest[:1] == ["the"]
            and _word(rest, 1) in ASPECTS
            and _word(rest, 2) in COPULAS
            and rest[3:] in ([], ["not"])
        ):
            # Elided second clause: "... but the service was [not]" reuses the first adjective.
            aspect2, i = rest[1], len(words)
            if adj not in adjectives(aspect2):
                raise ValueError(f"cannot elide {adj!r} after 'the {aspect2} {rest[2]}'")
            last = adjectives(aspect2)[adj] * (-1 if rest[3:] else 1)
        elif rest[:1] == ["the"]:
            last, _, aspect2, i = _clause(words, i + 1)
        else:  # a second predicate on the same aspect: "good but not great"
            last, _, i = _predicate(words, i + 1, aspect)
            aspect2 = None
        if i != len(words):
            raise ValueError(f"unexpected words after word {i}")
        if aspect2 == aspect:
            raise ValueError(f"both clauses are about {aspect!r}")
        if (last == first) != (conj == "and"):
            raise ValueError(f"'{conj}' must join parts of {'the same' if conj == 'and' else 'opposite'} sentiment")
    except (ValueError, IndexError) as e:
        raise ValueError(f"not in the sentiment grammar: {text!r} ({e})") from None
    return LABELS[last > 0]


# ---- generation -------------------------------------------------------------------------------

Example = tuple[list[str], int]  # (words, polarity)


def _pred(rng: random.Random, aspect: str, sentiment: int, negate: bool, pool: str = "any") -> list[str]:
    """Modifiers and an adjective with overall `sentiment`; `negate` puts a negation in front.

    pool: "any" adjective that suits `aspect`, "generic" (suits every aspect) or "specific" (only this one).
    """
    adj_pol = -sentiment if negate else sentiment
    words = {"any": adjectives(aspect), "generic": adjectives(""), "specific": {}}[pool]
    specific = SPECIFIC[aspect][adj_pol < 0] if pool == "specific" else ()
    adj = rng.choice([a for a, p in words.items() if p == adj_pol] + list(specific))
    intensifier = [rng.choice(INTENSIFIERS)] if rng.random() < 0.3 else []
    if not negate:
        return intensifier + [adj]
    # "not too" softens a fault ("not too bad"); "not too good" is rare in real reviews.
    negation = list(rng.choice(NEGATIONS if adj_pol < 0 else NEGATIONS[:1] + NEGATIONS[2:]))
    return negation + (intensifier if negation == ["not"] else []) + [adj]


def _head(aspect: str, copula: str) -> list[str]:
    return ["the", aspect, copula]


def _one(rng: random.Random, y: int, aspects: list[str], cop: str) -> list[Example]:
    return [(_head(aspects[0], cop) + _pred(rng, aspects[0], y, rng.random() < 0.4), y)]


def _and(rng: random.Random, y: int, aspects: list[str], cop: str) -> list[Example]:
    a, b = aspects
    return [
        (
            _head(a, cop)
            + _pred(rng, a, y, rng.random() < 0.3)
            + ["and"]
            + _head(b, cop)
            + _pred(rng, b, y, rng.random() < 0.3),
            y,
        )
    ]


def _but(rng: random.Random, y: int, aspects: list[str], cop: str) -> list[Example]:
    """Two clauses of opposite sentiment; the twin swaps them (same words, opposite label)."""
    a, b = aspects
    first = _head(a, cop) + _pred(rng, a, -y, rng.random() < 0.3)
    last = _head(b, cop) + _pred(rng, b, y, rng.random() < 0.3)
    return [(first + ["but"] + last, y), (last + ["but"] + first, -y)]


def _elided(rng: random.Random, y: int, aspects: list[str], cop: str) -> list[Example]:
    """ "A but the B was not" (label: not A's adjective) and its twin "not A but the B was" (A's adjective)."""
    a, b = aspects
    q = rng.choice((-1, 1))  # the adjective's own polarity
    mods = _pred(rng, a, q, negate=False, pool="generic")  # [intensifier] adjective
    ends_not = _head(a, cop) + mods + ["but"] + _head(b, cop) + ["not"]
    starts_not = _head(a, cop) + ["not"] + mods + ["but"] + _head(b, cop)
    pair = [(ends_not, -q), (starts_not, q)]
    return pair if pair[0][1] == y else pair[::-1]


def _short(rng: random.Random, y: int, aspects: list[str], cop: str) -> list[Example]:
    """One aspect, two predicates: "tasty but cold" / "cold but tasty", "good but not great" / "not good but great"."""
    a, head = aspects[0], _head(aspects[0], cop)
    if rng.random() < 0.5:
        p, q = _pred(rng, a, -y, False, pool="specific"), _pred(rng, a, y, False, pool="specific")
        return [(head + p + ["but"] + q, y), (head + q + ["but"] + p, -y)]
    s = rng.choice((-1, 1))  # both adjectives have this polarity; the negation decides the label
    scale = POSITIVE if s > 0 else NEGATIVE
    first, second = sorted(rng.sample(scale, 2), key=scale.index)  # milder one first
    pair = [(head + [first, "but", "not", second], -s), (head + ["not", first, "but", second], s)]
    return pair if pair[0][1] == y else pair[::-1]


PATTERNS = {"one": _one, "and": _and, "but": _but, "elided": _elided, "short": _short}


def generate(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` distinct (text, label) reviews, shuffled; the same seed always gives the same list."""
    return list(_generated(n, seed))


# The 24,000 reviews of the built-in task take seconds to draw, and a run draws them when it is set
# up and again when its data are prepared: drawn once a process, kept as immutable tuples.
@functools.lru_cache(maxsize=4)
def _generated(n: int, seed: int) -> tuple[tuple[str, str], ...]:
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _ in range(50 * n + 1000):  # the grammar has millions of reviews; this only guards a huge n
        if len(out) >= n:
            break
        y = rng.choice((-1, 1))  # choose the label first: classes stay balanced
        name = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        examples = PATTERNS[name](rng, y, rng.sample(ASPECTS, 2), rng.choice(COPULAS))
        for words, polarity in examples[: 2 if rng.random() < TWIN_RATE else 1]:
            text = " ".join(words)
            if text not in seen and len(out) < n:
                seen.add(text)
                out.append((text, LABELS[polarity > 0]))
    if len(out) < n:
        raise ValueError(f"could not draw {n} distinct reviews; ask for fewer")
    rng.shuffle(out)  # twins are drawn together; spread them out
    return tuple(out)


def splits(seed: int = 0, sizes: tuple[int, int, int] = (20000, 2000, 2000)) -> dict[str, list[tuple[str, str]]]:
    """Train, val and test sets with no text in two of them (a twin may sit in another split)."""
    data = generate(sum(sizes), seed)  # distinct texts, so slicing keeps the splits disjoint
    n_train, n_val, _ = sizes
    return {
        "train": data[:n_train],
        "val": data[n_train : n_train + n_val],
        "test": data[n_train + n_val :],
    }
