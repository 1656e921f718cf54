"""Generated translation task: English number words to French number words, 0 to 999,999.

    forty-two                                   quarante-deux
    seventy-one                                 soixante et onze
    eighty                                      quatre-vingts
    two hundred eighty thousand                 deux cent quatre-vingt mille
    nine hundred ninety-nine thousand ...       neuf cent quatre-vingt-dix-neuf mille ...

English has no "and" ("three hundred forty-two") and a hyphen inside 21..99. French follows the
traditional spelling: hyphens only between tens and units below 100, spaces elsewhere; "et"
before "un" and "onze" after vingt..soixante but not after quatre-vingt; "cent" and "vingt" (of
quatre-vingts) take an s when multiplied and last in the number, never before "mille"; "mille"
never takes an s nor a "un" in front. The French side is harder than the English one: 71..99
are built from 60 and 80, and the plural marks depend on what follows.
"""

from __future__ import annotations

import random

LIMIT = 1_000_000  # numbers run from 0 to LIMIT - 1

ONES = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
)
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")

# French has single words up to 16; 17..19 are dix-sept, dix-huit, dix-neuf.
UNITES = (
    "zéro",
    "un",
    "deux",
    "trois",
    "quatre",
    "cinq",
    "six",
    "sept",
    "huit",
    "neuf",
    "dix",
    "onze",
    "douze",
    "treize",
    "quatorze",
    "quinze",
    "seize",
)
# Tens with a word of their own; 70..79 are 60 + 10..19 and 90..99 are 80 + 10..19.
DIZAINES = {2: "vingt", 3: "trente", 4: "quarante", 5: "cinquante", 6: "soixante", 8: "quatre-vingt"}


def _check(n: int) -> None:
    if not 0 <= n < LIMIT:
        raise ValueError(f"{n} is outside 0..{LIMIT - 1}")


# ---- English ----------------------------------------------------------------------------------


def _english_below_1000(n: int) -> str:
    """1..999 in words: "three hundred forty-two"."""
    hundreds, rest = divmod(n, 100)
    words = [f"{ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, unit = divmod(rest, 10)
        words.append(TENS[tens] + (f"-{ONES[unit]}" if unit else ""))
    elif rest:
        words.append(ONES[rest])
    return " ".join(words)


def english(n: int) -> str:
    """`n` (0..999,999) in English words, without "and": 12304 -> "twelve thousand three hundred four"."""
    _check(n)
    if n == 0:
        return ONES[0]
    thousands, rest = divmod(n, 1000)
    words = [f"{_english_below_1000(thousands)} thousand"] if thousands else []
    if rest:
        words.append(_english_below_1000(rest))
    return " ".join(words)


# ---- French -----------------------------------------------------------------------------------


def _french_below_100(n: int, last: bool) -> str:
    """1..99 in French; `last`: nothing follows, so 80 is "quatre-vingts" (but "quatre-vingt mille")."""
    if n <= 16:
        return UNITES[n]
    if n < 20:
        return f"dix-{UNITES[n - 10]}"
    tens, rest = divmod(n, 10)
    if tens in (7, 9):
        tens, rest = tens - 1, rest + 10  # 70s count on from 60 (soixante-douze), 90s from 80
    base = DIZAINES[tens]
    if rest == 0:
        return base + ("s" if tens == 8 and last else "")
    if rest in (1, 11) and tens != 8:
        return f"{base} et {UNITES[rest]}"  # vingt et un, soixante et onze; but quatre-vingt-un
    return f"{base}-{_french_below_100(rest, last)}"


def _french_below_1000(n: int, last: bool) -> str:
    """1..999 in French; `last` as in `_french_below_100` (cents/vingts take no s before "mille")."""
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _french_below_100(rest, last)
    head = "cent" if hundreds == 1 else f"{UNITES[hundreds]} cent"
    if not rest:
        return head + ("s" if hundreds > 1 and last else "")  # deux cents, but deux cent un
    return f"{head} {_french_below_100(rest, last)}"


def french(n: int) -> str:
    """`n` (0..999,999) in French words, traditional spelling: 80 -> "quatre-vingts", 1000 -> "mille"."""
    _check(n)
    if n == 0:
        return UNITES[0]
    thousands, rest = divmod(n, 1000)
    words = []
    if thousands:
        # "mille" alone for 1000 (never "un mille"); the multiplier before it keeps no plural s.
        words.append("mille" if thousands == 1 else f"{_french_below_1000(thousands, last=False)} mille")
    if rest:
        words.append(_french_below_1000(rest, last=True))
    return " ".join(words)


# ---- generation -------------------------------------------------------------------------------


def sample(rng: random.Random) -> int:
    """A number with 1..6 digits (equally likely), uniform among those: small and large both common.

    Drawing uniformly from 0..999,999 would make 90% of numbers six digits long and a model
    would rarely see "seven" or "quatre-vingts" standing alone. With distinct numbers (as
    parallel.generate keeps them) the 1,000 below 1,000 soon run out and the mix leans to
    four to six digits.
    """
    digits = rng.randint(1, 6)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)
