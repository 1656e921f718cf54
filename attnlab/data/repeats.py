"""A built-in corpus for studying induction heads: random letters in which earlier spans recur.

The text is a stream of random letters (Latin, Greek and Cyrillic, 165 of them) in which, again and
again, a span of 6 to 20 letters from the last WINDOW letters is copied to the end: "...qZfKwλ" then
later "...ZfKw". A fresh letter cannot be predicted (ln 165 = 5.1 nats); a copied one can, from its
second letter on, by a model that finds where the current letter occurred before and predicts the
letter that followed it there, which is what an induction head does (Olsson et al., 2022). Where a
copy starts, how long it is and how far back its source lies are all random, so no head that
attends a fixed distance back, nor one that counts from a marker, can do the same: the model has to
match the current token. (On text where a segment is repeated at once, "XX", a 2-layer model with
rotary positions learned to look back the segment's length instead, and the detector on repeated
random tokens found no induction head; measured.)

`attnlab train lm --data repeats` reads it; it is written once, from a fixed seed, into the token
cache's folder.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from attnlab.io import atomic_write

# Many symbols, so that the current letter rarely occurred earlier in the window by chance (a chance
# match points an induction head at the wrong letter): with the 52 Latin letters alone, 2-layer
# models stayed on their plateau for 3,000 steps; with 165 they left it after about 1,000 (measured).
GREEK = [chr(c) for c in range(0x3B1, 0x3CA)] + [chr(c) for c in range(0x391, 0x3AA) if c != 0x3A2]
CYRILLIC = [chr(c) for c in range(0x410, 0x450)]
LETTERS = list(string.ascii_letters) + GREEK + CYRILLIC
LENGTH = 1_200_000  # letters, about 2.2 MB of UTF-8
WINDOW = 48  # a copy's source starts within this many letters of its end: inside a 64-token context
FRESH = (4, 16)  # fresh letters between copies (low, high], and copy lengths, drawn uniformly
COPY = (6, 21)
PER_LINE = 1000  # a line break every this many letters, for editors


def repeats_text(length: int = LENGTH, seed: int = 0) -> str:
    """`length` letters: runs of fresh random letters, each followed by a copy of an earlier span."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    while len(ids) < length:
        ids.extend(rng.integers(0, len(LETTERS), size=rng.integers(*FRESH)).tolist())
        n = int(rng.integers(*COPY))
        if len(ids) >= WINDOW:
            start = int(rng.integers(len(ids) - WINDOW, len(ids) - n))
            ids.extend(ids[start : start + n])
    letters = [LETTERS[i] for i in ids[:length]]
    return "\n".join("".join(letters[i : i + PER_LINE]) for i in range(0, length, PER_LINE)) + "\n"


def repeats_file(folder: Path) -> Path:
    """The corpus as a file in `folder`, written on first use (the same text every time)."""
    path = Path(folder) / f"repeats-{len(LETTERS)}-{LENGTH}-{WINDOW}-{COPY[1]}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = repeats_text()
        atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path
