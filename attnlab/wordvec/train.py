"""`attnlab train vectors`: Word2Vec (skip-gram, CBOW), FastText or GloVe on a text, into a run folder.

    attnlab train vectors --method skipgram --data english --out runs/w2v
    attnlab vectors runs/w2v --neighbors python

The run folder holds attnlab.json (the marker), config.json (the settings and what was read),
model.safetensors (the word vectors, their words and counts; FastText adds its n-gram rows) and
metrics.jsonl (the loss and speed as training went).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from attnlab.data.english import english_text
from attnlab.data.text import read_texts, resolve_sources
from attnlab.errors import AttnlabError
from attnlab.io import write_json, write_safetensors
from attnlab.progress import tqdm
from attnlab.runs.folder import CONFIG, METRICS, WEIGHTS, check_dir, discard_unstarted, fresh_dir
from attnlab.runs.marker import record
from attnlab.runtime.memory import check_fits
from attnlab.wordvec.config import VectorsConfig
from attnlab.wordvec.corpus import Corpus, Vocab, keep_probability, noise_table, sentences
from attnlab.wordvec.glove import cooccurrence, fit_epoch
from attnlab.wordvec.keyed import FAMILY, Subwords, WordVectors
from attnlab.wordvec.sgns import Tables, train_chunks
from attnlab.wordvec.subwords import input_rows

CHUNK_WORDS = 10_000  # words a thread trains on before taking the next piece of the corpus
BUILTIN = "english"  # the standard library's docstrings and comments (attnlab.data.english)


def read_corpus_text(data: str, progress: bool = True) -> str:
    """`english` (built in, no download), a text file, or a folder of them."""
    if data == BUILTIN:
        return english_text()

    return "\n".join(read_texts(resolve_sources(data), progress="reading" if progress else None))


def _threads(cfg: VectorsConfig) -> int:
    """--threads, or every core this process may use."""
    if cfg.threads:
        return cfg.threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _bar(total: int, desc: str, progress: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit=" words", unit_scale=True, disable=not progress, leave=False)


def _train_sgns(cfg: VectorsConfig, vocab: Vocab, corpus: Corpus, metrics, progress: bool) -> WordVectors:
    """Word2Vec or FastText: every epoch, the corpus in chunks, a group of chunks per kernel call."""

    V, rng = len(vocab), np.random.default_rng(cfg.seed)
    if cfg.method == "fasttext":
        rows_at, rows = input_rows(vocab.words, cfg.minn, cfg.maxn, cfg.buckets)
        # Only buckets some word's n-grams hash into are ever trained: give just those a row.
        used = np.unique(rows[rows >= V])
        rows = np.where(rows >= V, V + np.searchsorted(used, rows), rows).astype(np.int32)
    else:
        rows_at, rows, used = np.arange(V + 1, dtype=np.int64), np.arange(V, dtype=np.int32), np.empty(0, np.int32)
    w_in = (2 * rng.random((V + len(used), cfg.dim), dtype=np.float32) - 1) / cfg.dim
    w_out = np.zeros((V, cfg.dim), dtype=np.float32)
    keep, (noise_keep, noise_alias) = keep_probability(vocab.counts, cfg.sample), noise_table(vocab.counts)
    bounds, N, threads = corpus.chunks(CHUNK_WORDS), len(corpus.ids), _threads(cfg)
    group = 16 * threads  # chunks per call: about a quarter of a second of work
    tables = Tables(corpus.ids, corpus.starts, keep, noise_keep, noise_alias, rows_at, rows, w_in, w_out)
    total = N * cfg.epochs
    with _bar(corpus.raw_words * cfg.epochs, cfg.method, progress) as bar:
        for epoch in range(cfg.epochs):
            start, loss, scored = time.perf_counter(), 0.0, 0.0
            for g in range(0, len(bounds) - 1, group):
                part = bounds[g : g + group + 1]
                done = epoch * N + corpus.starts[part[0]]
                seed = cfg.seed * 1_000_003 + epoch * 10_007 + g + 1
                losses, n = train_chunks(tables, part, cfg, done, total, seed, threads)
                loss, scored = loss + losses.sum(), scored + n.sum()
                words = corpus.starts[part[-1]] - corpus.starts[part[0]]
                bar.update(round(words * corpus.raw_words / max(N, 1)))
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss / max(scored, 1):.4f}")
            seconds = time.perf_counter() - start
            metrics(epoch=epoch + 1, loss=loss / max(scored, 1), words_per_s=corpus.raw_words / seconds)
    vectors = w_in[:V].copy()
    sub = None
    if cfg.method == "fasttext":  # a word's vector is the mean of its rows, as in training
        vectors = np.stack([w_in[rows[rows_at[w] : rows_at[w + 1]]].mean(axis=0) for w in range(V)])
        sub = Subwords(cfg.minn, cfg.maxn, cfg.buckets, used.astype(np.int64) - V, w_in[V:].copy())
    return WordVectors(vocab.words, vectors, vocab.counts, sub)


def _train_glove(cfg: VectorsConfig, vocab: Vocab, corpus: Corpus, metrics, progress: bool) -> WordVectors:

    V, D, rng = len(vocab), cfg.dim, np.random.default_rng(cfg.seed)
    with _bar(corpus.raw_words, "counting", progress) as bar:
        start = time.perf_counter()
        rows, cols, counts = cooccurrence(
            corpus, V, cfg.window, lambda n: bar.update(n * corpus.raw_words // len(corpus.ids))
        )
        metrics(cooccurrences=len(counts), count_seconds=time.perf_counter() - start)
    w, c = ((rng.random((V, D), dtype=np.float32) - 0.5) / D for _ in range(2))
    bw, bc = np.zeros(V, np.float32), np.zeros(V, np.float32)
    gw, gc, gbw, gbc = (
        np.ones((V, D), np.float32),
        np.ones((V, D), np.float32),
        np.ones(V, np.float32),
        np.ones(V, np.float32),
    )
    threads, piece = _threads(cfg), 1_000_000
    with _bar(len(counts) * cfg.epochs, "glove", progress) as bar:
        bar.unit = " pairs"
        for epoch in range(cfg.epochs):
            start, cost = time.perf_counter(), 0.0
            order = rng.permutation(len(counts))
            for lo in range(0, len(order), piece):
                cost += fit_epoch(
                    order[lo : lo + piece],
                    rows,
                    cols,
                    counts,
                    w,
                    c,
                    bw,
                    bc,
                    gw,
                    gc,
                    gbw,
                    gbc,
                    cfg.eta,
                    cfg.x_max,
                    cfg.power,
                    threads,
                )
                bar.update(min(piece, len(order) - lo))
                bar.set_postfix(epoch=epoch + 1, cost=f"{cost / (lo + min(piece, len(order) - lo)):.4f}")
            seconds = time.perf_counter() - start
            metrics(epoch=epoch + 1, loss=cost / len(counts), words_per_s=corpus.raw_words / seconds)
    return WordVectors(vocab.words, w + c, vocab.counts)


def train_vectors(
    out: str | Path,
    cfg: VectorsConfig,
    data: str = BUILTIN,
    *,
    force: bool = False,
    progress: bool = True,
    text: str | None = None,
) -> dict:
    """Train word vectors on `data` (or on `text` given directly) and write the run to `out`;
    returns a summary (vocabulary, corpus words, seconds, words per second, final loss)."""
    out = Path(out)
    check_dir(out, resume=False, force=force)
    started = time.perf_counter()
    if text is None:
        text = read_corpus_text(data, progress)
    else:
        data = "(text given)"
    sents = sentences(text, cfg.tokens)
    vocab = Vocab.build(sents, cfg.min_count, cfg.max_vocab or None)
    corpus = Corpus.of(sents, vocab)
    del sents
    if len(corpus.ids) < 2:
        raise AttnlabError("the corpus has fewer than two words of the vocabulary: give more text")
    check_fits(
        cfg.training_bytes(vocab.words),
        f"{cfg.method} vectors of dimension {cfg.dim} for {len(vocab):,} words",
        "lower --dim, or --max-vocab / raise --min-count",
    )
    fresh_dir(out)
    record(out, METRICS, WEIGHTS, CONFIG)
    try:
        return _fit_and_save(out, cfg, vocab, corpus, data, progress, started)
    except BaseException:  # an error or Ctrl-C before the vectors are saved: leave no half-made run
        discard_unstarted(out)
        raise


def _fit_and_save(
    out: Path, cfg: VectorsConfig, vocab: Vocab, corpus: Corpus, data: str, progress: bool, started: float
) -> dict:
    """Train, then write the vectors and config.json into the fresh run folder `out`; the summary."""
    log = open(out / METRICS, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    rows: list[dict] = []

    def metrics(**row) -> None:
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()

    try:
        fit = time.perf_counter()
        train = _train_glove if cfg.method == "glove" else _train_sgns
        wv = train(cfg, vocab, corpus, metrics, progress)
        fit = time.perf_counter() - fit
    finally:
        log.close()
    summary = {
        "method": cfg.method,
        "vocabulary": len(vocab),
        "corpus_words": corpus.raw_words,
        "trained_words": int(len(corpus.ids)),
        "train_seconds": round(fit, 2),
        "words_per_s": round(corpus.raw_words * cfg.epochs / fit),
        "loss": rows[-1].get("loss"),
        "seconds": round(time.perf_counter() - started, 2),
    }
    arrays, meta = wv.tensors()
    write_safetensors(out / WEIGHTS, {k: _tensor(v) for k, v in arrays.items()}, meta)
    config = {"family": FAMILY, "model": asdict(cfg), "train": {}, "data": {"data": data}, "summary": summary}
    write_json(out / CONFIG, config)
    return summary


def _tensor(array: np.ndarray):

    return torch.from_numpy(np.ascontiguousarray(array))
