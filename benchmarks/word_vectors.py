"""attnlab's Word2Vec, FastText and GloVe against gensim, side by side on one corpus.

    .venv/bin/python benchmarks/word_vectors.py                 # skipgram, cbow, fasttext, glove; 20 epochs
    .venv/bin/python benchmarks/word_vectors.py --methods skipgram --epochs 5

The corpus, the questions and the ratings are gensim's test files (its wheel ships them under
gensim/test/test_data/): head500.noblanks.cor (331k words of English Wikipedia, stemmed),
questions-words.txt (Google's 19,544 analogy questions) and wordsim353.tsv. Both libraries get
the same settings (dimension 100, window 5, min-count 5, negative 5, the same epochs, 2 threads)
and the same clock: from the tokenized sentences to trained vectors. Both are scored by attnlab's
evaluation and by gensim's, which must agree. GloVe has no gensim counterpart: its row stands
beside the skip-gram ones. gensim is a benchmark and test dependency only (the dev extra).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import cpu_name

THREADS = int(os.environ.get("BENCH_THREADS", "2"))


def gensim_data() -> str:
    import gensim

    return os.path.join(os.path.dirname(gensim.__file__), "test", "test_data")


def run_gensim(method: str, sents: list[list[str]], epochs: int, seed: int):
    from gensim.models import FastText, Word2Vec

    kw = dict(vector_size=100, window=5, min_count=5, negative=5, workers=THREADS, epochs=epochs, seed=seed)
    start = time.perf_counter()
    if method == "fasttext":
        model = FastText(sentences=sents, sg=1, **kw)
    else:
        model = Word2Vec(sentences=sents, sg=int(method == "skipgram"), **kw)
    return model.wv, time.perf_counter() - start


def run_attnlab(method: str, text: str, epochs: int, seed: int, out: str, **settings):
    from attnlab.wordvec import load_vectors, train_vectors
    from attnlab.wordvec.config import VectorsConfig

    cfg = VectorsConfig(method=method, epochs=epochs, tokens="split", seed=seed, threads=THREADS, **settings)
    start = time.perf_counter()
    train_vectors(out, cfg, text=text, force=True, progress=False)
    return load_vectors(out), time.perf_counter() - start


def scores(wv, data: str) -> dict:
    from attnlab.wordvec import evaluate

    analogy = evaluate.analogies(wv, f"{data}/questions-words.txt")
    sim = evaluate.similarity(wv, f"{data}/wordsim353.tsv")
    return {"wordsim": sim["spearman"], "analogy": analogy["accuracy"], "coverage": analogy["coverage"]}


def gensim_scores(kv, data: str) -> tuple[float, float]:
    """gensim's own evaluation of the same vectors (lowercased, OOV pairs and questions skipped)."""
    sim = kv.evaluate_word_pairs(f"{data}/wordsim353.tsv")[1].statistic
    return float(sim), float(kv.evaluate_word_analogies(f"{data}/questions-words.txt")[0])


def as_keyed(wv):
    from gensim.models import KeyedVectors

    kv = KeyedVectors(wv.vectors.shape[1])
    kv.add_vectors(wv.words, wv.vectors)
    return kv


def line(method: str, library: str, words: int, results: list[tuple[dict, float, tuple]]) -> str:
    """One table row: speed and scores, the mean over seeds and their spread (min-max)."""

    def spread(values: list[float], fmt: str) -> str:
        mean = format(float(np.mean(values)), fmt)
        return mean if len(values) == 1 else f"{mean} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    speed = [words / seconds for _, seconds, _ in results]
    ws, an = [r["wordsim"] for r, _, _ in results], [r["analogy"] for r, _, _ in results]
    g_ws, g_an = [g[0] for _, _, g in results], [g[1] for _, _, g in results]
    return (
        f"{method:<22}{library:<9}{spread(speed, ',.0f'):>27}  {spread(ws, '.4f'):>24}  {spread(an, '.2%'):>24}"
        f"  {results[0][0]['coverage']:>8.1%}   {np.mean(g_ws):.4f}, {np.mean(g_an):.2%}"
    )


# GloVe beside the others: the paper's weighting (x_max 100) as asked, and x_max 10 with more passes,
# which suits a corpus this small (most pairs are seen a few times, so x_max 100 weighs nearly all down).
GLOVE = {"glove": {"window": 10}, "glove x_max=10 50 ep": {"window": 10, "x_max": 10.0, "epochs": 50}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="skipgram,cbow,fasttext,glove")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds; scores are averaged over them")
    p.add_argument("--out", default="runs/bench-vectors")
    args = p.parse_args()
    from gensim.models.word2vec import LineSentence

    from attnlab.wordvec.keyed import WordVectors

    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()  # numba compiles the kernels on first use (cached on disk after)
    for method in methods:
        run_attnlab(method, "a b c d e f g h\n" * 50, 1, 0, f"{args.out}/warm-up", min_count=1)
    warm = time.perf_counter() - start
    data = gensim_data()
    path = f"{data}/head500.noblanks.cor"
    sents = list(LineSentence(path))
    text = open(path, encoding="utf-8").read()
    words = sum(map(len, sents))
    print(
        f"{cpu_name()}, {THREADS} threads; {path}: {words:,} words; {args.epochs} epochs, dim 100, window 5, "
        f"min-count 5, negative 5; seeds {args.seeds} (mean, and min-max over seeds); attnlab's kernels "
        f"compiled or loaded in {warm:.1f}s\n"
    )
    print(
        f"{'method':<22}{'library':<9}{'words/s':>27}  {'WordSim-353 Spearman':>24}  {'analogy accuracy':>24}"
        f"  {'coverage':>8}   gensim's evaluation (ws, analogy)"
    )
    for method in methods:
        variants = {k: dict(v) for k, v in GLOVE.items()} if method == "glove" else {method: {}}
        for name, settings in variants.items():
            epochs = settings.pop("epochs", args.epochs)
            rows: dict[str, list] = {"gensim": [], "attnlab": []}
            for seed in seeds:  # the two libraries take turns, so neither always runs on a warmer machine
                if method != "glove":
                    kv, seconds = run_gensim(method, sents, epochs, seed)
                    wv = WordVectors(list(kv.index_to_key), np.asarray(kv.vectors))
                    rows["gensim"].append((scores(wv, data), seconds, gensim_scores(kv, data)))
                wv, seconds = run_attnlab(method, text, epochs, seed, f"{args.out}/{method}", **settings)
                rows["attnlab"].append((scores(wv, data), seconds, gensim_scores(as_keyed(wv), data)))
            for library, results in rows.items():
                if results:
                    print(line(name, library, words * epochs, results), flush=True)


if __name__ == "__main__":
    main()
