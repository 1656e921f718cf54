"""GloVe (Pennington et al. 2014): word vectors fitted to the log of co-occurrence counts.

Legend: V vocabulary, D dimension, P distinct co-occurring pairs.

1. Count: for each pair of words at distance d <= window in one sentence, add 1/d to X[a, b] and
   X[b, a]. X is sparse; it is built a slice of the corpus at a time, each slice's pairs summed
   (a sort) and merged into the running total, so memory follows P, never V^2.
2. Fit: minimise sum over pairs of f(X_ab) (w_a . c_b + b_a + b'_b - log X_ab)^2, where
   f(x) = min(1, (x / x_max)^power) keeps rare pairs from counting much and frequent ones too
   much, with AdaGrad over the pairs in a random order each epoch (both cores, without locks).
   A word's vector is w + c, the paper's choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from attnlab.wordvec.corpus import Corpus
from attnlab.wordvec.hogwild import hogwild
from attnlab.wordvec.jit import njit

SLICE_WORDS = 500_000  # corpus words counted at a time
MERGE_AT = 20_000_000  # pending pair entries before they are summed into the total


def _sum_pairs(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, where = np.unique(keys, return_inverse=True)
    return unique, np.bincount(where, weights=values).astype(np.float64)


def cooccurrence(corpus: Corpus, V: int, window: int, tick: Callable[[int], None] = lambda n: None):
    """The symmetric, distance-weighted co-occurrence counts as (rows, cols, counts), int32, int32,
    float64, sorted by (row, col)."""
    ids = corpus.ids.astype(np.int64)
    sentence = np.repeat(np.arange(len(corpus.starts) - 1), np.diff(corpus.starts))
    keys, values, pending = [], [], 0
    total = (np.empty(0, np.int64), np.empty(0, np.float64))
    for lo in range(0, len(ids), SLICE_WORDS):
        hi = min(len(ids), lo + SLICE_WORDS)
        for d in range(1, window + 1):
            left = np.arange(lo, min(hi, len(ids) - d))  # pairs (left, left + d) starting in the slice
            left = left[sentence[left] == sentence[left + d]]
            a, b = ids[left], ids[left + d]
            keys += [a * V + b, b * V + a]
            values.append(np.full(2 * len(left), 1.0 / d))
            pending += 2 * len(left)
        if pending > MERGE_AT or hi == len(ids):
            total = _sum_pairs(np.concatenate([total[0], *keys]), np.concatenate([total[1], *values]))
            keys, values, pending = [], [], 0
        tick(hi - lo)
    pairs, counts = total
    return (pairs // V).astype(np.int32), (pairs % V).astype(np.int32), counts


@njit(cache=True, nogil=True, fastmath=True)
def _fit_slice(order, rows, cols, counts, w, c, bw, bc, gw, gc, gbw, gbc, eta, x_max, power):
    """One AdaGrad step per pair in `order`; returns the summed weighted squared error (halved, as
    GloVe's code reports it). Runs without the GIL: threads share the vectors (Hogwild)."""
    cost = 0.0
    dim = w.shape[1]
    for e in order:
        a, b, x = rows[e], cols[e], counts[e]
        diff = bw[a] + bc[b] - math.log(x)
        for d in range(dim):
            diff += w[a, d] * c[b, d]
        weight = 1.0 if x >= x_max else (x / x_max) ** power
        g = weight * diff
        cost += 0.5 * g * diff
        g *= eta  # as GloVe's code: the squared steps, learning rate included, feed AdaGrad's sums
        for d in range(dim):
            ga, gb = g * c[b, d], g * w[a, d]
            w[a, d] -= ga / math.sqrt(gw[a, d])
            c[b, d] -= gb / math.sqrt(gc[b, d])
            gw[a, d] += ga * ga
            gc[b, d] += gb * gb
        bw[a] -= g / math.sqrt(gbw[a])
        bc[b] -= g / math.sqrt(gbc[b])
        gbw[a] += g * g
        gbc[b] += g * g
    return cost


def fit_epoch(order, rows, cols, counts, w, c, bw, bc, gw, gc, gbw, gbc, eta, x_max, power, threads: int = 1) -> float:
    """One AdaGrad pass over the pairs in `order`, cut into one slice per thread; the summed cost."""
    args = (rows, cols, counts, w, c, bw, bc, gw, gc, gbw, gbc, eta, x_max, power)
    return sum(hogwild(lambda part: _fit_slice(part, *args), np.array_split(order, threads), threads))
