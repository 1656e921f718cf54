"""The field's standard tests of word vectors: analogy questions and human similarity ratings.

- Analogies (Mikolov et al. 2013, `questions-words.txt`): sections headed `: name`, then lines
  `a b c d` ("athens greece baghdad iraq"); a question is answered right when the word nearest
  to b - a + c, among the `limit` most frequent words and other than a, b, c, is d. Only
  questions whose four words are among those words count (the rest are reported as coverage).
- Similarity (WordSim-353 and alike): lines `word1 word2 score` (tab-separated, `#` comments);
  the Spearman rank correlation between the scores and the cosines of the pairs whose two words
  are known, with the share of pairs left out.
Words are compared lowercased, as gensim does by default. Both files ship in gensim's wheel under
gensim/test/test_data/, and any file of the same shape can be given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.wordvec.keyed import WordVectors

ANALOGY_LIMIT = 30_000  # candidate answers: the most frequent words, as word2vec's compute-accuracy does


def _lines(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise AttnlabError(f"evaluation file not found: {p}")
    return p.read_text(encoding="utf-8", errors="replace").splitlines()


def _lowered(words: list[str]) -> dict[str, int]:
    """Lowercased word -> index of its most frequent casing."""
    index: dict[str, int] = {}
    for i, w in enumerate(words):
        index.setdefault(w.lower(), i)
    return index


def _batched_answers(wv: WordVectors, questions: np.ndarray, limit: int) -> np.ndarray:
    """The best answer (a word index) to each question (Q, 3) of word indices, 1,000 at a time."""
    unit = wv.unit[:limit]  # (L, D)
    answers = np.empty(len(questions), dtype=np.int64)
    for lo in range(0, len(questions), 1000):
        q = questions[lo : lo + 1000]
        target = unit[q[:, 1]] - unit[q[:, 0]] + unit[q[:, 2]]  # (Q, D)
        scores = target @ unit.T  # (Q, L): ranking by cosine, the target's norm changes nothing
        scores[np.arange(len(q))[:, None], q] = -np.inf  # never one of the question's words
        answers[lo : lo + 1000] = scores.argmax(axis=1)
    return answers


def analogies(wv: WordVectors, path: str | Path, limit: int = ANALOGY_LIMIT) -> dict:
    """Accuracy over the answerable questions, overall and per section, and the coverage."""
    lower = _lowered(wv.words[:limit])
    sections: list[dict] = []
    asked, answerable = 0, []
    for line in _lines(path):
        if line.startswith(":"):
            sections.append({"section": line[1:].strip(), "questions": 0, "answerable": 0, "correct": 0})
            continue
        words = line.lower().split()
        if len(words) != 4:
            continue
        if not sections:
            sections.append({"section": "questions", "questions": 0, "answerable": 0, "correct": 0})
        asked += 1
        sections[-1]["questions"] += 1
        if all(w in lower for w in words):
            answerable.append([lower[w] for w in words] + [len(sections) - 1])
    if not asked:
        raise AttnlabError(f"{path}: no analogy questions found (expected lines 'a b c d')")
    table = np.array(answerable, dtype=np.int64).reshape(-1, 5)
    right = _batched_answers(wv, table[:, :3], limit) == table[:, 3] if len(table) else np.zeros(0, bool)
    for section, ok in zip(table[:, 4], right):
        sections[section]["answerable"] += 1
        sections[section]["correct"] += int(ok)
    for s in sections:
        s["accuracy"] = s["correct"] / s["answerable"] if s["answerable"] else None
    semantic = [s for s in sections if not s["section"].startswith("gram")]
    syntactic = [s for s in sections if s["section"].startswith("gram")]
    return {
        "accuracy": float(right.mean()) if len(right) else 0.0,
        "correct": int(right.sum()),
        "answerable": len(table),
        "questions": asked,
        "coverage": len(table) / asked,
        "semantic": _share(semantic),
        "syntactic": _share(syntactic),
        "sections": sections,
    }


def _share(sections: list[dict]) -> float | None:
    n = sum(s["answerable"] for s in sections)
    return sum(s["correct"] for s in sections) / n if n else None


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    return float(np.corrcoef(rx, ry)[0, 1])


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x), dtype=np.float64)
    r[order] = np.arange(1, len(x) + 1)
    _, inverse = np.unique(x, return_inverse=True)
    return (np.bincount(inverse, weights=r) / np.bincount(inverse))[inverse]


def similarity(wv: WordVectors, path: str | Path) -> dict:
    """Spearman correlation between human ratings and cosines, over the pairs the vectors know."""
    lower = _lowered(wv.words)
    human, model, pairs = [], [], 0
    for line in _lines(path):
        fields = line.strip().split("\t") if "\t" in line else line.split()
        if line.startswith("#") or len(fields) != 3:
            continue
        try:
            score = float(fields[2])
        except ValueError:
            continue
        pairs += 1
        a, b = fields[0].lower(), fields[1].lower()
        if a in lower and b in lower:
            human.append(score)
            model.append(float(wv.unit[lower[a]] @ wv.unit[lower[b]]))
    if not pairs:
        raise AttnlabError(f"{path}: no word pairs found (expected lines 'word1<TAB>word2<TAB>score')")
    return {
        "spearman": spearman(np.array(human), np.array(model)) if len(human) > 1 else None,
        "pairs": pairs,
        "known": len(human),
        "oov": 1 - len(human) / pairs,
    }
