"""Word vectors drawn: which words to show (chosen, the arrows' neighbours, or the most frequent)
and their map in two dimensions (viz/vectors.py draws it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.viz.vectors import draw_word_map
from attnlab.wordvec.keyed import WordVectors


def plot_vectors(
    wv: WordVectors,
    path: str | Path,
    words: list[str] | None = None,
    top: int = 60,
    analogies: list[str] = (),
    method: str = "pca",
) -> list[str]:
    """Draw `words` and the arrows `a:b`; returns the words drawn. Without `words`: the arrows' words
    and each one's 4 nearest neighbours, or, with no arrows either, the `top` most frequent words."""
    arrows = [pair.split(":") for pair in analogies]
    if any(len(a) != 2 for a in arrows):
        raise AttnlabError("--arrows: give pairs as A:B (e.g. man:king)")
    ends = [w for a in arrows for w in a]
    missing = [w for w in [*(words or []), *ends] if w not in wv]
    if missing:
        raise AttnlabError(f"not in the vectors: {', '.join(missing[:10])}")
    if not words:
        words = [n for w in ends for n, _ in wv.neighbors(w, 4)] if ends else wv.words[:top]
    shown = list(dict.fromkeys([*words, *ends]))
    if len(shown) < 3:
        raise AttnlabError("draw at least 3 words")
    draw_word_map(np.stack([wv[w] for w in shown]), shown, [(a, b) for a, b in arrows], path, method)
    return shown
