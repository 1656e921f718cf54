"""Train several models on one generated task with the same data and budget, and compare them.

compare("sentiment", ["encoder", "bow"], Path("runs/compare")) -> rows of test accuracy,
macro-F1, parameters and training time; writes compare.json and a bar chart compare.png.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from attnlab.data.captions import CaptionDataConfig
from attnlab.data.images import ImageDataConfig
from attnlab.data.labeled import BUILTIN_TASKS, LabeledDataConfig
from attnlab.data.parallel import GENERATED, ParallelDataConfig
from attnlab.engine.train import TrainRequest, run
from attnlab.errors import AttnlabError
from attnlab.io import write_json
from attnlab.models import FAMILIES
from attnlab.tasks import TASKS
from attnlab.viz.confusion import CLASSIFY_BARS, plot_comparison
from attnlab.wordvec import load_vectors


def compare(task: str, models: list[str], out: Path, force: bool = False, progress: bool = True,
            word_vectors: str | Path | None = None, freeze_vectors: bool = True) -> list[dict]:  # fmt: skip
    """Train each model on the task with its tuned settings; a table row each (test scores,
    parameters, time). With word_vectors (sentiment, tagging), each model that has a word
    embedding is trained a second time from those vectors (kept frozen unless freeze_vectors is
    False), as the row `MODEL+vectors`."""
    if task in GENERATED:
        return _compare_translation(task, models, out, force, progress)
    if task == "digits":
        return _compare_images(task, models, out, force, progress)
    if task == "caption":
        return _compare_captions(models, out, force, progress)
    if task not in BUILTIN_TASKS:
        raise AttnlabError(f"unknown task {task!r}; choose from {', '.join((*BUILTIN_TASKS, *GENERATED))}")
    labeled = TASKS[BUILTIN_TASKS[task]]
    _check_models(models, labeled.models, "")
    if labeled.name == "tag" and "bow" in models:
        raise AttnlabError("bow gives one label per text: it cannot tag; leave it out of --models")
    one = _trainer(labeled, LabeledDataConfig(data=task), out, force, progress)
    if word_vectors is not None:
        one, models = _with_vectors(one, models, word_vectors, freeze_vectors)
    rows = _train_each(models, one, ("accuracy", "macro_f1"), progress)
    return _report(task, rows, out, f"{task}: test scores, same data and budget")


VECTORS = "+vectors"  # the suffix of a model trained from pretrained word vectors


def _with_vectors(one, models: list[str], path, freeze: bool):
    """Models that have a `d_embed` also start from the vectors (embedding width set to theirs)."""

    dim = int(load_vectors(path).vectors.shape[1])
    embedded = {m for m in models if "d_embed" in {f.name for f in dataclasses.fields(FAMILIES[m][0])}}
    options = {"word_vectors": str(path), "freeze_vectors": freeze}

    def train(name: str) -> dict:
        if name.endswith(VECTORS):
            return one(name[: -len(VECTORS)], {"d_embed": dim}, options, name)
        return one(name)

    return train, [v for m in models for v in ([m, m + VECTORS] if m in embedded else [m])]


def _compare_translation(task: str, models: list[str], out: Path, force: bool, progress: bool) -> list[dict]:
    _check_models(models, TASKS["translate"].models, f" for {task}")
    one = _trainer(TASKS["translate"], ParallelDataConfig(data=task), out, force, progress)

    rows = _train_each(models, one, ("exact_match", "bleu", "chrf"), progress)
    return _report(task, rows, out, f"{task}: test scores (greedy), same data and budget", TRANSLATION_BARS)


def _compare_images(task: str, models: list[str], out: Path, force: bool, progress: bool) -> list[dict]:

    _check_models(models, TASKS["image"].models, f" for {task}")
    one = _trainer(TASKS["image"], ImageDataConfig(data=task), out, force, progress)

    rows = _train_each(models, one, ("accuracy", "macro_f1"), progress)
    return _report(task, rows, out, f"{task}: test scores, same data split")


def _compare_captions(models: list[str], out: Path, force: bool, progress: bool) -> list[dict]:
    """The captioners on digits-strips: exact match, BLEU, chrF, and how often a digit word's most
    attended patch is on its digit."""

    _check_models(models, TASKS["caption"].models, " for caption")
    one = _trainer(TASKS["caption"], CaptionDataConfig(), out, force, progress)
    rows = _train_each(models, one, ("exact_match", "bleu", "chrf", "attention_on_digit"), progress)
    bars = (*TRANSLATION_BARS, ("attention_on_digit", "digit word's attention on its digit", 1.0))
    return _report("digits-strips", rows, out, "digits-strips captions: test scores (greedy), same data", bars)


TRANSLATION_BARS = (("exact_match", "exact match", 1.0), ("bleu", "BLEU / 100", 100.0), ("chrf", "chrF / 100", 100.0))


def _trainer(task, data, out: Path, force: bool, progress: bool) -> Callable[[str], dict]:
    """Train one model of `task` on `data` into out/NAME, with the task's tuned settings."""

    def one(name: str, fields: dict | None = None, options: dict | None = None, folder: str | None = None) -> dict:
        return run(task, TrainRequest(out / (folder or name), name, fields or {}, data=data, force=force,
                                      progress=progress, options=options or {}))  # fmt: skip

    return one


def _check_models(models: list[str], known, where: str) -> None:
    unknown = [m for m in models if m not in known]
    if unknown:
        raise AttnlabError(f"unknown model {unknown[0]!r}{where}; choose from {', '.join(known)}")


def _train_each(models: list[str], train: Callable[[str], dict], scores: tuple, progress: bool) -> list[dict]:
    """One row per model: its test `scores`, parameters and training time."""
    rows = []
    for name in models:
        if progress:
            print(f"== {name}")
        r = train(name)
        rows.append({"model": name, **{k: r["test"][k] for k in scores},
                     "parameters": r["parameters"], "train_seconds": r["train_seconds"]})  # fmt: skip
    return rows


def _report(task: str, rows: list[dict], out: Path, title: str, bars: tuple | None = None) -> list[dict]:
    """compare.json and the bar chart compare.png of the rows."""
    write_json(out / "compare.json", {"task": task, "rows": rows})

    plot_comparison(rows, out / "compare.png", title, bars or CLASSIFY_BARS)
    return rows


def format_table(rows: list[dict]) -> str:
    if rows and "exact_match" in rows[0]:
        where = "attention_on_digit" in rows[0]  # captions: a digit word's attention on its digit
        lines = [f"{'model':<14} {'exact':>8} {'BLEU':>7} {'chrF':>7}" + (f" {'on digit':>9}" if where else "")
                 + f" {'parameters':>11} {'train time':>11}"]  # fmt: skip
        lines += [f"{r['model']:<14} {r['exact_match']:>8.2%} {r['bleu']:>7.2f} {r['chrf']:>7.2f}"
                  + (f" {r['attention_on_digit']:>9.2%}" if where else "")
                  + f" {r['parameters']:>11,} {r['train_seconds']:>10.0f}s" for r in rows]  # fmt: skip
        return "\n".join(lines)
    lines = [f"{'model':<22} {'accuracy':>9} {'macro-F1':>9} {'parameters':>11} {'train time':>11}"]
    for r in rows:
        lines.append(f"{r['model']:<22} {r['accuracy']:>9.2%} {r['macro_f1']:>9.4f} {r['parameters']:>11,} "
                     f"{r['train_seconds']:>10.0f}s")  # fmt: skip
    return "\n".join(lines)
