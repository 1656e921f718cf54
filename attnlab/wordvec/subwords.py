"""FastText's character n-grams: a word is its own vector plus those of its pieces.

The word is wrapped in boundary marks, `<where>`, and cut into every run of minn..maxn characters
(`<wh`, `whe`, ..., `ere>`, `<whe`, ...). There are far too many distinct n-grams to give each a
row, so each is hashed (32-bit FNV-1a of its UTF-8 bytes, as fastText does) into one of `buckets`
shared rows; a word never seen in training still gets a vector from its n-grams' rows.
"""

from __future__ import annotations

import numpy as np

_FNV_OFFSET, _FNV_PRIME, _MASK = 2166136261, 16777619, 0xFFFFFFFF


def fnv1a(text: str) -> int:
    """32-bit FNV-1a hash of the text's UTF-8 bytes."""
    h = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def ngrams(word: str, minn: int, maxn: int) -> list[str]:
    """Every minn..maxn-character piece of `<word>`, shortest first."""
    marked = f"<{word}>"
    return [marked[i : i + n] for n in range(minn, maxn + 1) for i in range(len(marked) - n + 1)]


def ngram_buckets(word: str, minn: int, maxn: int, buckets: int) -> list[int]:
    return [fnv1a(g) % buckets for g in ngrams(word, minn, maxn)]


def input_rows(words: list[str], minn: int, maxn: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Each word's input rows as (rows_at (V + 1,), rows): word w's are rows[rows_at[w]:rows_at[w + 1]],
    its own row w first, then V + bucket for each of its n-grams."""
    V = len(words)
    per_word = [[w, *(V + b for b in ngram_buckets(word, minn, maxn, buckets))] for w, word in enumerate(words)]
    rows_at = np.cumsum([0] + [len(r) for r in per_word]).astype(np.int64)
    return rows_at, np.fromiter((r for rs in per_word for r in rs), dtype=np.int32, count=int(rows_at[-1]))
