"""Pretrained word vectors (GloVe, word2vec) copied into a model's embedding.

Legend: V vocabulary, E embedding width.

Both text formats hold one word per line, `word v1 v2 ... vE`; word2vec's adds a first line
`count E`. Files run to gigabytes, so they are read line by line and only the vectors of
vocabulary words are parsed.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from attnlab.errors import AttnlabError

# Tokens such as [PAD], [CLS], <unk>, <|endoftext|>: no pretrained file has a vector for them.
_SPECIAL = re.compile(r"\[[A-Za-z_]+\]|<\|?[A-Za-z_/]+\|?>")

# How well a file's word matches a vocabulary word, best first: the word itself, its lowercase
# form, another casing of it; NONE: not found yet.
EXACT, LOWER, ANY_CASE, NONE = 0, 1, 2, 3


def is_special(word: str) -> bool:
    return _SPECIAL.fullmatch(word) is not None


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


def load_word_vectors(
    embedding: nn.Embedding, path: str | Path, itos: list[str], freeze: bool = False
) -> tuple[int, list[str]]:
    """Copy the vectors of a GloVe or word2vec text file (or of an `attnlab train vectors` run, or
    its safetensors file) into the rows of `embedding`.

    Row i receives the vector of vocabulary word itos[i]: the file's entry for the word itself
    if it has one, else for its lowercase form, else for any casing of it. Rows of words the
    file lacks, and of special tokens ([PAD], <unk>, ...), keep their values. With freeze, the
    embedding is no longer trained. Returns the number of rows set and the (non-special)
    vocabulary words that were not found, in vocabulary order.
    """
    path = Path(path)
    if not path.exists():
        raise AttnlabError(f"word vectors file not found: {path}")
    V, E = embedding.weight.shape
    if len(itos) > V:
        raise AttnlabError(f"the vocabulary has {len(itos)} words but the embedding only {V} rows")

    # A word's lowercase form -> the rows of every vocabulary word with that lowercase form.
    wanted: dict[str, list[int]] = {}
    for i, word in enumerate(itos):
        if not is_special(word):
            wanted.setdefault(word.lower(), []).append(i)
    # The first field of a line, lowercased, must be one of these for the line to be parsed.
    firsts = {key.split(" ")[0] for key in wanted}
    best = [NONE] * len(itos)  # quality of the match found so far, per row
    found: dict[int, list[float]] = {}
    for word, values in vector_entries(path, E, firsts):
        for i in wanted.get(word.lower(), ()):
            quality = EXACT if word == itos[i] else LOWER if word == itos[i].lower() else ANY_CASE
            if quality < best[i]:
                best[i], found[i] = quality, values
    if found:
        rows = torch.tensor(sorted(found))
        values = torch.tensor([found[i] for i in rows.tolist()], dtype=embedding.weight.dtype)  # (found, E)
        with torch.no_grad():
            embedding.weight[rows.to(embedding.weight.device)] = values.to(embedding.weight.device)
    if freeze:
        embedding.weight.requires_grad_(False)
    missing = [w for i, w in enumerate(itos) if best[i] == NONE and not is_special(w)]
    return len(found), missing


def _check_dim(dim: int, expected: int, path: Path) -> int:
    if dim != expected:
        raise AttnlabError(
            f"{path}: vectors of dimension {dim} do not fit an embedding of width {expected}: make it {dim}"
        )
    return dim


def vector_entries(path: Path, dim: int | None = None, firsts: set[str] | None = None) -> Iterator[tuple[str, list]]:
    """(word, values) for each vector of a text file, of a safetensors file written by attnlab, or
    of an `attnlab train vectors` run; with dim, a file of another dimension is refused. With
    firsts, only text lines whose first field (lowercased) is one of them are parsed."""
    path = Path(path)
    if path.is_dir() or path.suffix == ".safetensors":
        from attnlab.wordvec.keyed import WordVectors
        from attnlab.wordvec.train import vectors_file

        wv = WordVectors.load(vectors_file(path) if path.is_dir() else path)
        if dim is not None:
            _check_dim(wv.vectors.shape[1], dim, path)
        yield from zip(wv.words, wv.vectors.tolist())
        return
    parsed, expected, dim = False, dim, None  # dim: the file's own, from its header or first vector
    for n, line in enumerate(_lines(path)):
        if n == 0 and (announced := _header(line)) is not None:
            dim = announced if expected is None else _check_dim(announced, expected, path)  # word2vec's `count dim`
            continue
        if parsed and firsts is not None and line.partition(" ")[0].lower() not in firsts:
            continue  # not a wanted word: its numbers are never parsed
        entry = _vector(line, dim)
        if entry is None:
            continue
        if not parsed:
            # The first vector decides the dimension when no header announced it.
            dim = len(entry[1]) if expected is None else _check_dim(len(entry[1]), expected, path)
            parsed = True
        yield entry
    if not parsed:
        raise AttnlabError(f"{path}: no word vectors found (expected lines 'word v1 v2 ... v{dim or 'D'}')")
