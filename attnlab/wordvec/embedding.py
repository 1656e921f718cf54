"""Pretrained word vectors (GloVe, word2vec, an `attnlab train vectors` run) copied into a model's embedding.

Legend: V vocabulary, E embedding width.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.wordvec.keyed import WordVectors, vectors_file
from attnlab.wordvec.textfile import check_dim, text_entries

# Tokens such as [PAD], [CLS], <unk>, <|endoftext|>: no pretrained file has a vector for them.
_SPECIAL = re.compile(r"\[[A-Za-z_]+\]|<\|?[A-Za-z_/]+\|?>")

# How well a file's word matches a vocabulary word, best first: the word itself, its lowercase
# form, another casing of it; NONE: not found yet.
EXACT, LOWER, ANY_CASE, NONE = 0, 1, 2, 3


def is_special(word: str) -> bool:
    return _SPECIAL.fullmatch(word) is not None


def vector_entries(path: Path, dim: int | None = None, firsts: set[str] | None = None) -> Iterator[tuple[str, list]]:
    """(word, values) for each vector of a text file, of a safetensors file written by attnlab, or
    of an `attnlab train vectors` run; with dim, a file of another dimension is refused. With
    firsts, only text lines whose first field (lowercased) is one of them are parsed."""
    path = Path(path)
    if not (path.is_dir() or path.suffix == ".safetensors"):
        yield from text_entries(path, dim, firsts)
        return
    wv = WordVectors.load(vectors_file(path) if path.is_dir() else path)
    if dim is not None:
        check_dim(wv.vectors.shape[1], dim, path)
    yield from zip(wv.words, wv.vectors.tolist())


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
