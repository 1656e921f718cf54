"""`attnlab train vectors` and `attnlab vectors RUN`: word vectors trained, queried, evaluated, drawn."""

from __future__ import annotations

import argparse
import json
import sys

from attnlab.config import add_config_flags, checked, flags_of
from attnlab.errors import AttnlabError
from attnlab.wordvec import evaluate, load_vectors
from attnlab.wordvec.config import VectorsConfig
from attnlab.wordvec.picture import plot_vectors
from attnlab.wordvec.train import train_vectors


def cmd_train_vectors(args: argparse.Namespace) -> int:

    cfg = checked(VectorsConfig, flags_of(args, "vectors"), where="[vectors]")
    summary = train_vectors(args.out, cfg, args.data, force=args.force, progress=sys.stderr.isatty())
    print(f"{args.out}: {summary['method']} vectors for {summary['vocabulary']:,} words from "
          f"{summary['corpus_words']:,} corpus words; {summary['train_seconds']}s of training, "
          f"{summary['words_per_s']:,} words/s, final loss {summary['loss']:.4f}. "
          f"Try: attnlab vectors {args.out} --neighbors WORD")  # fmt: skip
    return 0


def _pairs(words: list[tuple[str, float]]) -> str:
    return ", ".join(f"{w} {s:.3f}" for w, s in words)


def cmd_vectors(args: argparse.Namespace) -> int:

    wv = load_vectors(args.run)
    report: dict = {"words": len(wv), "dim": int(wv.vectors.shape[1])}
    lines = [f"{args.run}: {len(wv):,} words, dimension {wv.vectors.shape[1]}"]
    for word in args.neighbors or ():
        found = wv.neighbors(word, args.top)
        report.setdefault("neighbors", {})[word] = found
        lines.append(f"nearest to {word}: {_pairs(found)}")
    if args.analogy:
        a, b, c = args.analogy
        found = wv.analogy(a, b, c, k=args.top)
        report["analogy"] = {"question": [a, b, c], "answers": found}
        lines.append(f"{a} is to {b} as {c} is to: {_pairs(found)}")
    if args.similarity:
        a, b = args.similarity
        report["similarity"] = wv.similarity(a, b)
        lines.append(f"similarity({a}, {b}) = {report['similarity']:.4f}")
    if args.analogies:
        r = report["analogies"] = evaluate.analogies(wv, args.analogies)
        lines.append(f"analogies: {r['accuracy']:.2%} of {r['answerable']:,} answerable questions right "
                     f"(coverage {r['coverage']:.1%} of {r['questions']:,})")  # fmt: skip
        lines += [f"  {s['section']:<28} {s['correct']:>5} / {s['answerable']:<5}" for s in r["sections"]]
    if args.wordsim:
        r = report["wordsim"] = evaluate.similarity(wv, args.wordsim)
        rho = "n/a" if r["spearman"] is None else f"{r['spearman']:.4f}"
        lines.append(f"word similarity: Spearman {rho} over {r['known']} of {r['pairs']} pairs")
    if args.export:
        _export(wv, args.export)
        lines.append(f"wrote {args.export}")
    if args.plot:
        shown = plot_vectors(wv, args.plot, words=args.words.split(",") if args.words else None,
                             top=args.top_words, analogies=args.arrows, method=args.projection)  # fmt: skip
        lines.append(f"drew {len(shown)} words in {args.plot}")
    print(json.dumps(report, default=float) if args.json else "\n".join(lines))
    return 0


def _export(wv, path: str) -> None:
    if path.endswith(".safetensors"):
        wv.save(path)
    elif path.endswith((".txt", ".vec")):
        wv.save_word2vec(path)
    else:
        raise AttnlabError(f"--export: name a .txt or .vec file (word2vec text) or a .safetensors file, not {path}")


def add_train_command(tasks) -> None:
    """`attnlab train vectors`, beside the tasks the engine trains."""
    p = tasks.add_parser(
        "vectors",
        help="word vectors: Word2Vec (skip-gram, CBOW), FastText or GloVe",
        description="Train word vectors on a text. --data english (the default) is the built-in corpus: the "
        "docstrings and comments of Python's standard library (about 545k words), no download.",
    )
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--force", action="store_true", help="replace --out if it is an attnlab run")
    p.add_argument("--data", default="english", help="english (built in), a text file or a folder (default: english)")
    add_config_flags(p, "vectors", VectorsConfig, "word vectors")
    p.set_defaults(func=cmd_train_vectors)


def add_commands(sub) -> None:
    v = sub.add_parser("vectors", help="query, evaluate, draw or export trained word vectors",
                       description="Ask a vectors run (or a word2vec/GloVe text file) for neighbours, analogies "
                       "and similarities; score it on analogy questions and similarity ratings; draw or export "
                       "it.")  # fmt: skip
    v.add_argument("run", help="vectors run directory, .safetensors file, or word2vec/GloVe text file")
    v.add_argument("--neighbors", nargs="+", metavar="WORD", help="the nearest words to each WORD")
    v.add_argument("--analogy", nargs=3, metavar=("A", "B", "C"),
                   help="A is to B as C is to ?: the words nearest to B - A + C (man king woman -> queen)")  # fmt: skip
    v.add_argument("--similarity", nargs=2, metavar=("A", "B"), help="the cosine similarity of two words")
    v.add_argument("--top", type=int, default=10, help="how many words to list (default: 10)")
    v.add_argument("--analogies", metavar="FILE", help="score on analogy questions (questions-words.txt)")
    v.add_argument("--wordsim", metavar="FILE", help="score on similarity ratings (wordsim353.tsv): Spearman")
    v.add_argument("--export", metavar="FILE", help="write the vectors: .txt/.vec (word2vec text) or .safetensors")
    v.add_argument("--plot", metavar="FILE", help="draw words in 2-D (.png, .svg, or .json: the points)")
    v.add_argument("--words", help="comma-separated words to draw (default: the most frequent)")
    v.add_argument("--top-words", type=int, default=60, help="how many frequent words to draw (default: 60)")
    v.add_argument("--arrows", nargs="*", metavar="A:B", default=(), help="draw an arrow from A to B for each pair "
                   "(e.g. man:king woman:queen)")  # fmt: skip
    v.add_argument("--projection", choices=("pca", "tsne"), default="pca", help="2-D projection (default: pca)")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=cmd_vectors)
