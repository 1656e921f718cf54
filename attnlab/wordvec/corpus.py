"""A text as word ids: the vocabulary, sentences, subsampling and the noise distribution.

Legend: V vocabulary size, N words in the corpus (after dropping rare ones).

Word2Vec, FastText and GloVe all start the same way: split the text into sentences of words
(a context window never crosses a sentence's end), count the words, keep those seen at least
`min_count` times (the rest are dropped from the text, as the reference tools do) and number
them from the most frequent down.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from attnlab.errors import AttnlabError

MAX_SENTENCE = 10_000  # longer lines are cut into pieces of this many words (as word2vec and gensim do)
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)*")  # letters and digits, with an apostrophe inside (don't)


def split_words(line: str, tokens: str) -> list[str]:
    """`split`: the line's whitespace-separated fields as they are (a pre-tokenized corpus);
    `words`: lowercased runs of letters and digits, punctuation dropped (raw prose)."""
    if tokens == "split":
        return line.split()
    if tokens == "words":
        return _WORD.findall(line.lower())
    raise AttnlabError(f"tokens must be 'split' or 'words', not {tokens!r}")


def sentences(text: str, tokens: str = "words") -> list[list[str]]:
    """One sentence per non-empty line (a paragraph of prose, or a line of a corpus file)."""
    out = []
    for line in text.splitlines():
        words = split_words(line, tokens)
        out.extend(words[i : i + MAX_SENTENCE] for i in range(0, len(words), MAX_SENTENCE))
    return out


@dataclass
class Vocab:
    words: list[str]  # most frequent first
    counts: np.ndarray  # (V,) int64
    index: dict[str, int]

    @classmethod
    def build(cls, sents: Iterable[list[str]], min_count: int, max_size: int | None = None) -> Vocab:
        counts = Counter(w for s in sents for w in s)
        kept = sorted(((c, w) for w, c in counts.items() if c >= min_count), key=lambda cw: (-cw[0], cw[1]))
        kept = kept[:max_size] if max_size else kept
        if not kept:
            raise AttnlabError(f"no word occurs {min_count} times or more: lower --min-count or give more text")
        words = [w for _, w in kept]
        return cls(words, np.array([c for c, _ in kept], dtype=np.int64), {w: i for i, w in enumerate(words)})

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index


@dataclass
class Corpus:
    """Every sentence's vocabulary words as ids, end to end, and where each sentence starts."""

    ids: np.ndarray  # (N,) int32
    starts: np.ndarray  # (S + 1,) int64: sentence s is ids[starts[s]:starts[s + 1]]
    raw_words: int  # words in the text before rare ones were dropped

    @classmethod
    def of(cls, sents: list[list[str]], vocab: Vocab) -> Corpus:
        index = vocab.index
        ids = [[index[w] for w in s if w in index] for s in sents]
        lengths = np.array([len(s) for s in ids], dtype=np.int64)
        flat = np.fromiter((i for s in ids for i in s), dtype=np.int32, count=int(lengths.sum()))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        return cls(flat, starts, sum(len(s) for s in sents))

    def chunks(self, words: int) -> np.ndarray:
        """Sentence indices (K + 1,) that cut the corpus into K pieces of about `words` words each,
        on sentence boundaries: the units of work the threads share."""
        marks = np.searchsorted(self.starts, np.arange(0, self.starts[-1], words), side="right") - 1
        return np.unique(np.concatenate([marks, [len(self.starts) - 1]]))


def keep_probability(counts: np.ndarray, sample: float) -> np.ndarray:
    """Frequent-word subsampling (Mikolov et al. 2013, as in word2vec's code): a word that makes up
    a share f of the corpus is kept with probability (sqrt(f / sample) + 1) * sample / f, capped
    at 1; sample 0 keeps every word."""
    if sample <= 0:
        return np.ones(len(counts), dtype=np.float32)
    share = counts / counts.sum()
    return np.minimum(1.0, (np.sqrt(share / sample) + 1) * sample / share).astype(np.float32)


def noise_table(counts: np.ndarray, power: float = 0.75) -> tuple[np.ndarray, np.ndarray]:
    """The noise distribution of negative sampling, unigram counts raised to 3/4 (which draws rare
    words more often than their frequency would), as Walker's alias table (keep (V,), alias (V,)):
    draw a word i uniformly, keep it with probability keep[i], else take alias[i]. Exact, and two
    small arrays that stay in cache (a word2vec-style table of 10^8 entries does not)."""
    p = counts.astype(np.float64) ** power
    scaled = p * len(p) / p.sum()  # mean 1
    keep, alias = np.ones(len(p)), np.arange(len(p), dtype=np.int32)
    small, large = [i for i, x in enumerate(scaled) if x < 1], [i for i, x in enumerate(scaled) if x >= 1]
    while small and large:
        s, g = small.pop(), large[-1]
        keep[s], alias[s] = scaled[s], g  # s's column: s itself up to scaled[s], the rest goes to g
        scaled[g] -= 1 - scaled[s]
        if scaled[g] < 1:
            small.append(large.pop())
    return keep.astype(np.float32), alias
