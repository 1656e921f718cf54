"""Trained word vectors and what one asks of them: neighbours, analogies, similarities, files.

Legend: V vocabulary, D dimension.

Similarity is the cosine. An analogy "a is to b as c is to ?" is answered by the word nearest to
b - a + c among all but a, b and c (3CosAdd, Mikolov et al. 2013), with each of the three scaled
to unit length first, as word2vec's and gensim's tools do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from attnlab.errors import AttnlabError
from attnlab.runs.folder import CONFIG, WEIGHTS
from attnlab.runs.kind import READ_ELSEWHERE
from attnlab.wordvec.subwords import ngram_buckets
from attnlab.wordvec.textfile import text_entries

FAMILY = "vectors"  # the family config.json records for a word-vectors run
# `attnlab.load` reads models; a vectors run is read here (WordVectors.load, `attnlab vectors`).
READ_ELSEWHERE[FAMILY] = "this is a word-vectors run (attnlab train vectors): ask it with attnlab vectors RUN"


@dataclass
class Subwords:
    """FastText's n-gram rows, for words never seen in training. Only buckets that some training
    word's n-grams hash into are kept (the others were never trained)."""

    minn: int
    maxn: int
    buckets: int
    ids: np.ndarray  # (B,) sorted bucket numbers
    vectors: np.ndarray  # (B, D)

    def vector(self, word: str) -> np.ndarray | None:
        wanted = np.array(ngram_buckets(word, self.minn, self.maxn, self.buckets), dtype=np.int64)
        at = np.searchsorted(self.ids, wanted)
        found = at[(at < len(self.ids)) & (self.ids[np.minimum(at, len(self.ids) - 1)] == wanted)]
        return self.vectors[found].mean(axis=0) if len(found) else None


@dataclass
class WordVectors:
    words: list[str]  # most frequent first
    vectors: np.ndarray  # (V, D) float32
    counts: np.ndarray | None = None  # (V,) training counts
    subwords: Subwords | None = None
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}
        norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
        self.unit = self.vectors / np.maximum(norms, 1e-12)  # (V, D)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index or (self.subwords is not None and self.subwords.vector(word) is not None)

    def __getitem__(self, word: str) -> np.ndarray:
        """The word's vector; for FastText, an unseen word's from its n-grams."""
        if word in self.index:
            return self.vectors[self.index[word]]
        v = self.subwords.vector(word) if self.subwords is not None else None
        if v is None:
            raise AttnlabError(
                f"{word!r} is not in the vocabulary ({len(self):,} words)"
                + ("" if self.subwords is None else " and none of its n-grams was trained")
            )
        return v

    def _unit(self, word: str) -> np.ndarray:
        v = self[word]
        return v / max(float(np.linalg.norm(v)), 1e-12)

    def similarity(self, a: str, b: str) -> float:
        return float(self._unit(a) @ self._unit(b))

    def nearest(
        self, query: np.ndarray, k: int = 10, exclude: set[str] = frozenset(), limit: int | None = None
    ) -> list[tuple[str, float]]:
        """The k words (among the `limit` most frequent) with the highest cosine to the query."""
        unit = self.unit[:limit] if limit else self.unit
        scores = unit @ (query / max(float(np.linalg.norm(query)), 1e-12))  # (V,)
        top = np.argsort(-scores)[: k + len(exclude)]
        return [(self.words[i], float(scores[i])) for i in top if self.words[i] not in exclude][:k]

    def neighbors(self, word: str, k: int = 10) -> list[tuple[str, float]]:
        return self.nearest(self[word], k, exclude={word})

    def analogy(self, a: str, b: str, c: str, k: int = 1, limit: int | None = None) -> list[tuple[str, float]]:
        """a is to b as c is to ...: the words nearest to b - a + c, the three inputs excluded."""
        return self.nearest(self._unit(b) - self._unit(a) + self._unit(c), k, {a, b, c}, limit)

    # ---- files ----------------------------------------------------------------------------

    def save_word2vec(self, path: str | Path) -> None:
        """The word2vec text format: a line `V D`, then `word v1 ... vD` per word (read by
        --word-vectors, gensim's KeyedVectors.load_word2vec_format and most tools)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{len(self)} {self.vectors.shape[1]}\n")
            for word, v in zip(self.words, self.vectors):
                f.write(word + " " + " ".join(f"{x:.6g}" for x in v) + "\n")

    def tensors(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Arrays and string metadata for a safetensors file."""
        arrays = {"vectors": np.ascontiguousarray(self.vectors, dtype=np.float32)}
        meta = {"words": json.dumps(self.words, ensure_ascii=False)}
        if self.counts is not None:
            arrays["counts"] = np.asarray(self.counts, dtype=np.int64)
        if self.subwords is not None:
            s = self.subwords
            arrays |= {"ngram_ids": s.ids.astype(np.int64), "ngram_vectors": s.vectors.astype(np.float32)}
            meta["subwords"] = json.dumps({"minn": s.minn, "maxn": s.maxn, "buckets": s.buckets})
        return arrays, meta

    def save(self, path: str | Path) -> None:

        arrays, meta = self.tensors()
        save_file(arrays, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> WordVectors:
        """From a safetensors file written by save(), or a word2vec/GloVe text file."""
        path = Path(path)
        if not path.is_file():
            raise AttnlabError(f"word vectors file not found: {path}")
        if path.suffix != ".safetensors":
            return cls._from_text(path)

        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
        if meta.get("words") is None or arrays.get("vectors") is None:
            raise AttnlabError(f"{path} holds no word vectors (it lacks 'words' or 'vectors')")
        sub = None
        if "subwords" in meta:
            sub = Subwords(**json.loads(meta["subwords"]), ids=arrays["ngram_ids"], vectors=arrays["ngram_vectors"])
        return cls(json.loads(meta["words"]), arrays["vectors"], arrays.get("counts"), sub)

    @classmethod
    def _from_text(cls, path: Path) -> WordVectors:
        words, rows = [], []
        for word, values in text_entries(path):
            words.append(word)
            rows.append(values)
        if not words:
            raise AttnlabError(f"{path} holds no word vectors")
        return cls(words, np.asarray(rows, dtype=np.float32))


def vectors_file(run: str | Path) -> Path:
    """The safetensors file of a vectors run (a folder), checked to be one."""
    p = Path(run)
    config = p / CONFIG
    try:
        family = json.loads(config.read_text(encoding="utf-8")).get("family")
    except (OSError, ValueError):
        family = None
    if family != FAMILY or not (p / WEIGHTS).is_file():
        raise AttnlabError(f"{p} is not a word-vectors run (made by attnlab train vectors)")
    return p / WEIGHTS


def load_vectors(source: str | Path) -> WordVectors:
    """Word vectors from a vectors run folder, a safetensors file or a word2vec/GloVe text file."""
    p = Path(source)
    return WordVectors.load(vectors_file(p) if p.is_dir() else p)
