"""Word vectors drawn in two dimensions: a PCA (or t-SNE) map of chosen words, with analogy arrows.

PCA keeps the two directions of largest variance of the drawn words' vectors, so parallel arrows
(man -> king, woman -> queen) stay parallel when the vectors hold that regularity; t-SNE (from
scikit-learn) keeps neighbourhoods instead and says nothing about directions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.viz.figures import save_figure
from attnlab.wordvec.keyed import WordVectors


def project(points: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """(N, D) -> (N, 2)."""
    if method == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(2, perplexity=min(30.0, max(2.0, (len(points) - 1) / 3)), init="pca",
                    random_state=seed).fit_transform(points)  # fmt: skip
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)  # rows of vt: principal directions
    return centred @ vt[:2].T


def plot_vectors(wv: WordVectors, path: str | Path, words: list[str] | None = None, top: int = 60,
                 analogies: list[str] = (), method: str = "pca") -> list[str]:  # fmt: skip
    """Draw `words` and the arrows `a:b`; returns the words drawn. Without `words`: the arrows' words
    and each one's 4 nearest neighbours, or, with no arrows either, the `top` most frequent words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    xy = project(np.stack([wv[w] for w in shown]), method)
    at = {w: xy[i] for i, w in enumerate(shown)}
    fig, ax = plt.subplots(figsize=(9, 7), dpi=110)
    ax.scatter(xy[:, 0], xy[:, 1], s=12, color="#4c72b0")
    size = 9 if len(shown) <= 80 else 7
    for w, (x, y) in at.items():
        ax.annotate(w, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=size)
    for a, b in arrows:
        ax.annotate("", xy=at[b], xytext=at[a], arrowprops={"arrowstyle": "->", "color": "#c44e52", "lw": 1.4})
    ax.set_title(f"{len(shown)} word vectors, {method.upper()} to 2-D")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, path)
    return shown
