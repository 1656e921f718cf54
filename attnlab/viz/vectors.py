"""Word vectors drawn in two dimensions: a PCA (or t-SNE) map of chosen words, with analogy arrows.

PCA keeps the two directions of largest variance of the drawn words' vectors, so parallel arrows
(man -> king, woman -> queen) stay parallel when the vectors hold that regularity; t-SNE (from
scikit-learn) keeps neighbourhoods instead and says nothing about directions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.viz.figures import pyplot, save_figure


def _pca(points: np.ndarray, seed: int) -> np.ndarray:
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)  # rows of vt: principal directions
    return centred @ vt[:2].T


def _tsne(points: np.ndarray, seed: int) -> np.ndarray:
    from sklearn.manifold import TSNE  # scikit-learn's t-SNE: 2 s to import, for --projection tsne alone

    return TSNE(2, perplexity=min(30.0, max(2.0, (len(points) - 1) / 3)), init="pca", random_state=seed).fit_transform(
        points
    )


PROJECTIONS = {"pca": _pca, "tsne": _tsne}  # --projection, by name


def project(points: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """(N, D) -> (N, 2) by a PROJECTIONS method."""
    return PROJECTIONS[method](points, seed)


def draw_word_map(
    vectors: np.ndarray, words: list[str], arrows: list[tuple[str, str]], path: str | Path, method: str = "pca"
) -> None:
    """The words' vectors (N, D) projected to 2-D, each point labelled, with an arrow a -> b for each pair."""
    plt = pyplot()
    xy = project(vectors, method)
    at = {w: xy[i] for i, w in enumerate(words)}
    fig, ax = plt.subplots(figsize=(9, 7), dpi=110)
    ax.scatter(xy[:, 0], xy[:, 1], s=12, color="#4c72b0")
    size = 9 if len(words) <= 80 else 7
    for w, (x, y) in at.items():
        ax.annotate(w, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=size)
    for a, b in arrows:
        ax.annotate("", xy=at[b], xytext=at[a], arrowprops={"arrowstyle": "->", "color": "#c44e52", "lw": 1.4})
    ax.set_title(f"{len(words)} word vectors, {method.upper()} to 2-D")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, path)
