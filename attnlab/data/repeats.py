"""A built-in corpus for studying induction heads: random letter strings, each written twice.

A segment of random letters (a-z, A-Z) of random length is written twice, then the next one:
"qZfKw" -> "qZfKwqZfKw", with nothing between segments (a line break after every PER_LINE of
them, for editors). The first copy cannot be predicted (about ln 52 = 3.95 nats per letter);
the second can, by a model that finds where the current letter occurred before and copies the
letter that followed it, which is what an induction head does (Olsson et al., 2022). The lengths
vary and nothing marks where a segment starts, so neither a fixed offset (a head attending "24
back") nor counting from a separator solves the task: only matching the current token does.

`attnlab train lm --data repeats` reads it; it is written once, from a fixed seed, into the
token cache's folder.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from attnlab.engine.rundir import atomic_write

LETTERS = string.ascii_letters  # 52 symbols: few chance repeats inside a segment
SEGMENTS = 40_000  # about 1.2 MB of text
PER_LINE = 40
SHORTEST, LONGEST = 6, 24  # segment lengths, drawn uniformly


def repeats_text(segments: int = SEGMENTS, seed: int = 0, shortest: int = SHORTEST, longest: int = LONGEST) -> str:
    """`segments` random segments of shortest..longest letters, each written twice."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(LETTERS))
    out = []
    for i, n in enumerate(rng.integers(shortest, longest + 1, size=segments)):
        segment = "".join(letters[rng.integers(0, len(letters), size=n)])
        out.append(segment + segment + ("\n" if i % PER_LINE == PER_LINE - 1 else ""))
    return "".join(out)


def repeats_file(folder: Path) -> Path:
    """The corpus as a file in `folder`, written on first use (the same text every time)."""
    path = Path(folder) / f"repeats-{SEGMENTS}-{PER_LINE}-{SHORTEST}-{LONGEST}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = repeats_text()
        atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path
