"""Word2Vec and FastText training: skip-gram and CBOW with negative sampling, one epoch at a time.

Legend: V vocabulary, R input rows (V words, plus the n-gram buckets for FastText), D dimension,
K negative samples.

The updates are the classic ones (Mikolov et al. 2013; Bojanowski et al. 2017): for each kept word
of a sentence and each context word within a window drawn uniformly from 1..window,
  skip-gram: the centre word's input vector h (for FastText: the mean of the rows of the word and
             of its character n-grams) scores the context word against K words drawn from the noise
             distribution, with the logistic loss -log s(h.u_ctx) - sum_k log s(-h.u_noise_k);
  CBOW:      the mean of the context words' input vectors scores the centre word the same way;
and plain SGD with a learning rate falling linearly to min_alpha over the whole training, each
(centre, context) pair's gradient applied at once. FastText adds h's gradient to each of its
rows whole, as gensim does (fastText's own code divides it by the number of rows, which on a
small corpus trains the n-grams far too slowly: WordSim-353 0.46 against 0.71 here); h itself, the
rows' mean, is moved by the same amount rather than summed again (the rows are most of the work).

Why numba: these updates touch a handful of rows per word, millions of times a second. Batched in
PyTorch, each batch sums many updates of the same frequent rows before applying them, and gathers
and scatters cost more than the arithmetic; a compiled loop does the reference algorithm itself,
with the two cores sharing the vectors without locks (Hogwild, as word2vec and gensim do).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from attnlab.wordvec.config import VectorsConfig
from attnlab.wordvec.hogwild import hogwild
from attnlab.wordvec.jit import njit

# Random numbers: SplitMix64 (a counter passed through a bijective mix), whose every output bit is
# usable; word2vec's linear congruential generator is cheaper but its low bits and consecutive
# outputs are correlated, and one draw here feeds several decisions.
_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_INV53 = 1.0 / 9007199254740992.0  # 2^-53
MAX_SCORE = np.float32(6.0)  # as word2vec: a score beyond +-6 is left alone (its sigmoid is saturated)
# The logistic function tabulated on [-6, 6] at 1,000 bin centres (as word2vec's code does): a
# lookup instead of an exp per score; the error, under 0.0015, is far below SGD's own noise.
_BINS = 1000
_SIGMOID = (1 / (1 + np.exp(-(np.arange(_BINS) + 0.5) * (12 / _BINS) + 6))).astype(np.float32)
_PER_UNIT = np.float32(_BINS / 12)


@njit(inline="always")
def _next(state):
    """The next state; _bits(state) is its random 64-bit output."""
    return state + _GOLDEN


@njit(inline="always")
def _bits(state):
    z = (state ^ (state >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(inline="always")
def _uniform(state):
    return float(_bits(state) >> np.uint64(11)) * _INV53


@njit(inline="always")
def _noise(state, keep, alias):
    """A word from the noise distribution (Walker's alias table, see corpus.noise_table): the high
    32 bits pick a column, the low 32 decide between it and its alias."""
    r = _bits(state)
    i = int(r >> np.uint64(32)) % len(keep)
    return i if float(r & np.uint64(0xFFFFFFFF)) * 2.3283064365386963e-10 < keep[i] else alias[i]


@njit(inline="always")
def _score(h, w_out, target, label, alpha, grad, measure):
    """One logistic step of h against output row `target`: updates the row and adds h's gradient
    to grad; returns the loss if `measure` (a log per score would cost a sixth of the time)."""
    row = w_out[target]
    f = np.float32(0.0)
    for d in range(h.shape[0]):
        f += h[d] * row[d]
    if f <= -MAX_SCORE or f >= MAX_SCORE:
        return 0.0
    s = _SIGMOID[int((f + MAX_SCORE) * _PER_UNIT)]
    g = np.float32((label - s) * alpha)
    for d in range(h.shape[0]):
        r = row[d]
        grad[d] += g * r
        row[d] = r + g * h[d]
    if not measure:
        return 0.0
    return -math.log(s + 1e-12) if label == 1.0 else -math.log(1.0 - s + 1e-12)


@njit(inline="always")
def _against_noise(h, w_out, predicted, negative, noise_keep, noise_alias, alpha, grad, state):
    """h scores `predicted` (label 1) and `negative` noise words (label 0), grad gathering h's
    gradient; returns the generator's state, the loss of the scores measured (one in 16, drawn at
    random) and how many were."""
    loss, scored = 0.0, 0.0
    for k in range(negative + 1):
        target = predicted
        state = _next(state)
        if k > 0:
            target = _noise(state, noise_keep, noise_alias)
            if target == predicted:
                continue
        measure = (_bits(state) & np.uint64(15)) == 0
        loss += _score(h, w_out, target, 1.0 if k == 0 else 0.0, alpha, grad, measure)
        scored += measure
    return state, loss, scored


@njit(inline="always")
def _kept(ids, begin, end, keep, sen, state):
    """The sentence ids[begin:end] after subsampling, written to sen; returns how many words and the
    generator's state."""
    n = 0
    for i in range(begin, end):
        state = _next(state)
        if keep[ids[i]] >= 1.0 or _uniform(state) < keep[ids[i]]:
            sen[n] = ids[i]
            n += 1
    return n, state


@njit(inline="always")
def _cbow(sen, i, lo, hi, w_in, w_out, negative, noise_keep, noise_alias, alpha, h, grad, state):
    """CBOW for the word sen[i]: the mean of its context's input rows predicts it."""
    if hi - lo < 2:
        return state, 0.0, 0.0  # a word alone in its (subsampled) sentence has no context
    h[:] = 0.0
    for j in range(lo, hi):
        if j != i:
            h += w_in[sen[j]]
    h /= hi - lo - 1
    state, loss, scored = _against_noise(h, w_out, sen[i], negative, noise_keep, noise_alias, alpha, grad, state)
    for j in range(lo, hi):
        if j != i:
            w_in[sen[j]] += grad
    return state, loss, scored


@njit(inline="always")
def _skipgram(
    sen, i, lo, hi, rows_at, rows, subwords, w_in, w_out, negative, noise_keep, noise_alias, alpha, h, grad, state
):
    """Skip-gram for the word sen[i]. FastText: the centre's rows (the word and its n-grams) predict
    each context word, as fastText does. Word2Vec: each context word's row predicts the centre, as
    word2vec and gensim do."""
    loss, scored = 0.0, 0.0
    a, z = rows_at[sen[i]], rows_at[sen[i] + 1]
    if subwords:
        h[:] = 0.0
        for r in range(a, z):
            h += w_in[rows[r]]
        h /= z - a
    for j in range(lo, hi):
        if j == i:
            continue
        predicted = sen[j] if subwords else sen[i]
        if not subwords:
            a, z = sen[j], sen[j] + 1
            h[:] = w_in[sen[j]]
        grad[:] = 0.0
        state, lj, sj = _against_noise(h, w_out, predicted, negative, noise_keep, noise_alias, alpha, grad, state)
        loss, scored = loss + lj, scored + sj
        for r in range(a, z):
            w_in[rows[r]] += grad
        h += grad  # the mean of the rows, each moved by grad
    return state, loss, scored


class Tables(NamedTuple):
    """What every chunk reads, and the vectors it moves: the corpus (ids, sentence starts), the
    subsampling and noise tables (corpus.py), each word's input rows, and the input/output vectors."""

    ids: np.ndarray
    starts: np.ndarray
    keep: np.ndarray
    noise_keep: np.ndarray
    noise_alias: np.ndarray
    rows_at: np.ndarray
    rows: np.ndarray
    w_in: np.ndarray
    w_out: np.ndarray


@njit(cache=True, nogil=True, fastmath=True)
def _train_chunk(c, t, bounds, window, negative, cbow, alpha0, min_alpha, done, total, seed, loss, scored):
    """Train on chunk c, the sentences bounds[c]..bounds[c + 1]; adds its sampled loss and their
    number to loss[c], scored[c]. Runs without the GIL: threads share the vectors (Hogwild). t: Tables."""
    ids, starts, keep, noise_keep, noise_alias, rows_at, rows, w_in, w_out = t
    dim = w_in.shape[1]
    origin = starts[bounds[0]]  # `done` counts up to here
    # Summed here and stored once at the end: loss[c] and loss[c + 1] share a cache line, and two
    # threads adding to it at every score would pass that line back and forth between cores.
    total_loss, total_scored = 0.0, 0.0
    subwords = rows_at[-1] > len(rows_at) - 1  # FastText: words have more rows than themselves
    state = _bits(np.uint64(seed)) + np.uint64(c) * np.uint64(0xD1B54A32D192ED03)
    h = np.empty(dim, dtype=np.float32)
    grad = np.empty(dim, dtype=np.float32)
    sen = np.empty(10_000, dtype=np.int32)
    for s in range(bounds[c], bounds[c + 1]):
        n, state = _kept(ids, starts[s], starts[s + 1], keep, sen, state)
        progress = (done + starts[s] - origin) / total
        alpha = max(min_alpha, alpha0 - (alpha0 - min_alpha) * progress)
        for i in range(n):
            state = _next(state)
            b = int(_bits(state) >> np.uint64(33)) % window
            lo, hi = max(0, i - window + b), min(n, i + window - b + 1)
            grad[:] = 0.0
            if cbow:
                state, lw, sw = _cbow(
                    sen, i, lo, hi, w_in, w_out, negative, noise_keep, noise_alias, alpha, h, grad, state
                )
            else:
                state, lw, sw = _skipgram(
                    sen,
                    i,
                    lo,
                    hi,
                    rows_at,
                    rows,
                    subwords,
                    w_in,
                    w_out,
                    negative,
                    noise_keep,
                    noise_alias,
                    alpha,
                    h,
                    grad,
                    state,
                )
            total_loss, total_scored = total_loss + lw, total_scored + sw
    loss[c] = total_loss
    scored[c] = total_scored


def train_chunks(
    t: Tables, bounds, cfg: VectorsConfig, done: int, total: int, seed: int, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Train on the chunks of sentences bounds[c]..bounds[c + 1], `threads` at a time (the compiled
    loop releases the GIL, so Python threads run it side by side; one thread: in order, repeatable).

    t: the corpus, its tables and the vectors (Tables); cfg: the window, negatives, method and rates.
    rows_at/rows: word w's input rows are rows[rows_at[w]:rows_at[w + 1]] (the word itself for
    Word2Vec; the word and its n-gram buckets for FastText). done: corpus words trained before
    this call, total: corpus words of the whole training (both set the learning rate).
    Returns, per chunk, the summed loss of one score in 16 (drawn at random) and how many."""
    n = len(bounds) - 1
    loss, scored = np.zeros(n), np.zeros(n)
    options = (cfg.window, cfg.negative, cfg.method == "cbow", cfg.alpha, cfg.min_alpha)
    args = (t, bounds, *options, done, total, seed, loss, scored)
    hogwild(lambda c: _train_chunk(c, *args), range(n), threads)
    return loss, scored
