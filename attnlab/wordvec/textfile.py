"""Word-vector text files: GloVe's `word v1 ... vE` per line, word2vec's with a `count E` line first.

Files run to gigabytes, so they are read line by line and, when only some words are wanted, only
those lines' numbers are parsed.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from attnlab.errors import AttnlabError


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    # Some published files hold a few invalid UTF-8 bytes; those words simply never match.
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def _header(line: str) -> int | None:
    """The dimension announced by a word2vec header line `count dim`, else None."""
    parts = line.split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[1])
    return None


def _vector(line: str, dim: int | None) -> tuple[str, list[float]] | None:
    """(word, values) from `word v1 ... v_dim`, or None if the line does not parse.

    With dim known, the values are split from the right, so a word containing spaces (GloVe
    840B has a few) stays whole; unknown, every field after the first is a value."""
    fields = line.rstrip().split(" ") if dim is None else line.rstrip().rsplit(" ", dim)
    if len(fields) < 2 or (dim is not None and len(fields) != dim + 1) or not fields[0]:
        return None
    try:
        return fields[0], [float(v) for v in fields[1:]]
    except ValueError:
        return None


def check_dim(dim: int, expected: int, path: Path) -> int:
    if dim != expected:
        raise AttnlabError(
            f"{path}: vectors of dimension {dim} do not fit an embedding of width {expected}: make it {dim}"
        )
    return dim


def text_entries(path: Path, dim: int | None = None, firsts: set[str] | None = None) -> Iterator[tuple[str, list]]:
    """(word, values) for each vector of a text file; with dim, a file of another dimension is
    refused. With firsts, only lines whose first field (lowercased) is one of them are parsed."""
    parsed, expected, dim = False, dim, None  # dim: the file's own, from its header or first vector
    for n, line in enumerate(_lines(path)):
        if n == 0 and (announced := _header(line)) is not None:
            dim = announced if expected is None else check_dim(announced, expected, path)  # word2vec's `count dim`
            continue
        if parsed and firsts is not None and line.partition(" ")[0].lower() not in firsts:
            continue  # not a wanted word: its numbers are never parsed
        entry = _vector(line, dim)
        if entry is None:
            continue
        if not parsed:
            # The first vector decides the dimension when no header announced it.
            dim = len(entry[1]) if expected is None else check_dim(len(entry[1]), expected, path)
            parsed = True
        yield entry
    if not parsed:
        raise AttnlabError(f"{path}: no word vectors found (expected lines 'word v1 v2 ... v{dim or 'D'}')")
