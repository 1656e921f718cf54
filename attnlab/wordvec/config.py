"""The settings of `attnlab train vectors`: one dataclass, whose fields are the command's flags."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import check_seed, check_types
from attnlab.config import option as _f
from attnlab.errors import AttnlabError

METHODS = ("skipgram", "cbow", "fasttext", "glove")


@dataclass
class VectorsConfig:
    method: str = _f(
        "skipgram", "skipgram, cbow (Word2Vec), fasttext (skip-gram over character n-grams) or glove", METHODS
    )
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
    tokens: str = _f(
        "words",
        "words: lowercased letters and digits (prose); split: whitespace (pre-tokenized text)",
        ("words", "split"),
    )
    threads: int = _f(0, "threads (0: every core)")
    seed: int = _f(0, "random seed (results repeat exactly with --threads 1)")

    def __post_init__(self) -> None:
        check_types(self)
        check_seed("seed", self.seed)
        if self.method not in METHODS:
            raise AttnlabError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        positive = {
            "dim": self.dim,
            "window": self.window,
            "min_count": self.min_count,
            "epochs": self.epochs,
            "buckets": self.buckets,
        }
        for name, value in positive.items():
            if value < 1:
                raise AttnlabError(f"{name} must be at least 1, got {value}")
        for name in ("max_vocab", "threads"):  # 0: no limit, every core
            if getattr(self, name) < 0:
                raise AttnlabError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("alpha", "x_max", "eta"):
            if not getattr(self, name) > 0:
                raise AttnlabError(f"{name} must be above 0, got {getattr(self, name)}")
        if not 0 <= self.min_alpha <= self.alpha:
            raise AttnlabError(f"min_alpha must be from 0 to alpha ({self.alpha}), got {self.min_alpha}")
        if not self.sample >= 0:
            raise AttnlabError(f"sample must be 0 (keep every word) or more, got {self.sample}")
        if not self.power > 0:
            raise AttnlabError(f"power must be above 0, got {self.power}")
        if self.method == "fasttext" and not 1 <= self.minn <= self.maxn:
            raise AttnlabError(f"fasttext needs 1 <= minn <= maxn, got {self.minn} and {self.maxn}")
        if self.method != "glove" and self.negative < 1:
            raise AttnlabError(f"negative must be at least 1, got {self.negative}")

    def training_bytes(self, words: list[str]) -> int:
        """The float32 tables training allocates for this vocabulary, in bytes: Word2Vec's input and
        output vectors (FastText adds at most one row per n-gram bucket its words use), GloVe's
        word and context vectors and their AdaGrad sums; and the vectors saved at the end."""
        rows = len(words)
        if self.method == "glove":
            return 5 * rows * self.dim * 4
        if self.method == "fasttext":  # at most len + 2 - n + 1 n-grams of each length n per word (with < >)
            ngrams = sum(len(w) + 2 for w in words) * (self.maxn - self.minn + 1)
            rows += min(self.buckets, ngrams)
        return (rows + 2 * len(words)) * self.dim * 4
