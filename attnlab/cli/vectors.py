"""`attnlab train vectors` and `attnlab vectors RUN`: word vectors trained, queried, evaluated, drawn."""

from __future__ import annotations

import json
import sys
from typing import Any

from attnlab.cli.options import TrainVectorsOptions, VectorsOptions
from attnlab.config import checked
from attnlab.errors import AttnlabError
from attnlab.wordvec import evaluate, load_vectors
from attnlab.wordvec.config import VectorsConfig
from attnlab.wordvec.keyed import WordVectors
from attnlab.wordvec.picture import plot_vectors
from attnlab.wordvec.train import train_vectors


def run_train_vectors(opts: TrainVectorsOptions, settings: dict[str, Any]) -> int:
    cfg = checked(VectorsConfig, settings, where="[vectors]")
    summary = train_vectors(opts.out, cfg, opts.data, force=opts.force, progress=sys.stderr.isatty())
    print(
        f"{opts.out}: {summary['method']} vectors for {summary['vocabulary']:,} words from "
        f"{summary['corpus_words']:,} corpus words; {summary['train_seconds']}s of training, "
        f"{summary['words_per_s']:,} words/s, final loss {summary['loss']:.4f}. "
        f"Try: attnlab vectors {opts.out} --neighbors WORD"
    )
    return 0


def _pairs(words: list[tuple[str, float]]) -> str:
    return ", ".join(f"{w} {s:.3f}" for w, s in words)


def run_vectors(opts: VectorsOptions) -> int:
    wv = load_vectors(opts.run)
    report: dict = {"words": len(wv), "dim": int(wv.vectors.shape[1])}
    lines = [f"{opts.run}: {len(wv):,} words, dimension {wv.vectors.shape[1]}"]
    lines += _queries(wv, opts, report) + _scores(wv, opts, report)
    if opts.export:
        _export(wv, opts.export)
        lines.append(f"wrote {opts.export}")
    if opts.plot:
        shown = plot_vectors(
            wv,
            opts.plot,
            words=opts.words.split(",") if opts.words else None,
            top=opts.top_words,
            analogies=opts.arrows,
            method=opts.projection,
        )
        lines.append(f"drew {len(shown)} words in {opts.plot}")
    print(json.dumps(report, default=float) if opts.json else "\n".join(lines))
    return 0


def _queries(wv: WordVectors, opts: VectorsOptions, report: dict) -> list[str]:
    """Neighbours, an analogy, a similarity: what was asked of the vectors, into `report` and as lines."""
    lines = []
    for word in opts.neighbors or ():
        found = wv.neighbors(word, opts.top)
        report.setdefault("neighbors", {})[word] = found
        lines.append(f"nearest to {word}: {_pairs(found)}")
    if opts.analogy:
        a, b, c = opts.analogy
        found = wv.analogy(a, b, c, k=opts.top)
        report["analogy"] = {"question": [a, b, c], "answers": found}
        lines.append(f"{a} is to {b} as {c} is to: {_pairs(found)}")
    if opts.similarity:
        a, b = opts.similarity
        report["similarity"] = wv.similarity(a, b)
        lines.append(f"similarity({a}, {b}) = {report['similarity']:.4f}")
    return lines


def _scores(wv: WordVectors, opts: VectorsOptions, report: dict) -> list[str]:
    """Analogy questions and similarity ratings: the benchmarks word vectors are judged by."""
    lines = []
    if opts.analogies:
        r = report["analogies"] = evaluate.analogies(wv, opts.analogies)
        lines.append(
            f"analogies: {r['accuracy']:.2%} of {r['answerable']:,} answerable questions right "
            f"(coverage {r['coverage']:.1%} of {r['questions']:,})"
        )
        lines += [f"  {s['section']:<28} {s['correct']:>5} / {s['answerable']:<5}" for s in r["sections"]]
    if opts.wordsim:
        r = report["wordsim"] = evaluate.similarity(wv, opts.wordsim)
        rho = "n/a" if r["spearman"] is None else f"{r['spearman']:.4f}"
        lines.append(f"word similarity: Spearman {rho} over {r['known']} of {r['pairs']} pairs")
    return lines


def _export(wv: WordVectors, path: str) -> None:
    if path.endswith(".safetensors"):
        wv.save(path)
    elif path.endswith((".txt", ".vec")):
        wv.save_word2vec(path)
    else:
        raise AttnlabError(f"--export: name a .txt or .vec file (word2vec text) or a .safetensors file, not {path}")
