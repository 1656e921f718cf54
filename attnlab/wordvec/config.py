"""The settings of `attnlab train vectors`: one dataclass, whose fields are the command's flags."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import option as _f
from attnlab.errors import AttnlabError

METHODS = ("skipgram", "cbow", "fasttext", "glove")


@dataclass
class VectorsConfig:
    method: str = _f("skipgram", "skipgram, cbow (Word2Vec), fasttext (skip-gram over character n-grams) or glove",
                     METHODS)  # fmt: skip
    dim: int = _f(100, "vector dimension")
    window: int = _f(5, "context words on each side (Word2Vec and FastText draw 1..window per word; GloVe: fixed)")
    min_count: int = _f(5, "drop words seen fewer times")
    max_vocab: int = _f(0, "keep only this many most frequent words (0: no limit)")
    epochs: int = _f(5, "passes over the corpus")
    negative: int = _f(5, "noise words per context word (negative sampling)")
    sample: float = _f(1e-3, "subsampling threshold for frequent words (0: keep every word)")
    alpha: float = _f(0.025, "starting learning rate of Word2Vec and FastText")
    min_alpha: float = _f(1e-4, "learning rate at the end (falls linearly)")
    minn: int = _f(3, "fasttext: shortest character n-gram")
    maxn: int = _f(6, "fasttext: longest character n-gram")
    buckets: int = _f(2_000_000, "fasttext: hash buckets shared by the n-grams")
    x_max: float = _f(100.0, "glove: co-occurrence count at which a pair's weight reaches 1")
    power: float = _f(0.75, "glove: exponent of the weighting function below x_max")
    eta: float = _f(0.05, "glove: AdaGrad's learning rate")
    tokens: str = _f("words", "words: lowercased letters and digits (prose); split: whitespace (pre-tokenized text)",
                     ("words", "split"))  # fmt: skip
    threads: int = _f(0, "threads (0: every core)")
    seed: int = _f(0, "random seed (results repeat exactly with --threads 1)")

    def __post_init__(self) -> None:

        if self.method not in METHODS:
            raise AttnlabError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        positive = {"dim": self.dim, "window": self.window, "min_count": self.min_count, "epochs": self.epochs}
        for name, value in positive.items():
            if value < 1:
                raise AttnlabError(f"{name} must be at least 1, got {value}")
        if self.method == "fasttext" and not 1 <= self.minn <= self.maxn:
            raise AttnlabError(f"fasttext needs 1 <= minn <= maxn, got {self.minn} and {self.maxn}")
        if self.method != "glove" and self.negative < 1:
            raise AttnlabError(f"negative must be at least 1, got {self.negative}")
