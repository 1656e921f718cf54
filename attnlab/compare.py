"""Train several models on one generated task with the same data and budget, and compare them.

compare("sentiment", ["encoder", "bow"], Path("runs/compare")) -> rows of test accuracy,
macro-F1, parameters and training time; writes compare.json and a bar chart compare.png.
"""

from __future__ import annotations

from pathlib import Path

from attnlab import checkpoint as ck
from attnlab.data.labeled import BUILTIN_TASKS, LabeledDataConfig
from attnlab.data.parallel import GENERATED, ParallelDataConfig
from attnlab.errors import AttnlabError
from attnlab.tasks.classify import MODELS, train_labeled


def compare(task: str, models: list[str], out: Path, force: bool = False, progress: bool = True) -> list[dict]:
    if task in GENERATED:
        return _compare_translation(task, models, out, force, progress)
    if task == "digits":
        return _compare_images(task, models, out, force, progress)
    if task not in BUILTIN_TASKS:
        raise AttnlabError(f"unknown task {task!r}; choose from {', '.join((*BUILTIN_TASKS, *GENERATED))}")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise AttnlabError(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    kind = BUILTIN_TASKS[task]
    if kind == "tag" and "bow" in models:
        raise AttnlabError("bow gives one label per text: it cannot tag; leave it out of --models")
    rows = []
    for name in models:
        if progress:
            print(f"== {name}")
        r = train_labeled(out / name, kind, name, data=LabeledDataConfig(data=task), force=force, progress=progress)
        t = r["test"]
        rows.append({"model": name, "accuracy": t["accuracy"], "macro_f1": t["macro_f1"],
                     "parameters": r["parameters"], "train_seconds": r["train_seconds"]})  # fmt: skip
    ck.write_json(out / "compare.json", {"task": task, "rows": rows})
    from attnlab.viz.confusion import plot_comparison

    plot_comparison(rows, out / "compare.png", f"{task}: test scores, same data and budget")
    return rows


def _compare_translation(task: str, models: list[str], out: Path, force: bool, progress: bool) -> list[dict]:
    from attnlab.tasks.translate import MODELS as SEQ2SEQ
    from attnlab.tasks.translate import train_translate

    unknown = [m for m in models if m not in SEQ2SEQ]
    if unknown:
        raise AttnlabError(f"unknown model {unknown[0]!r} for {task}; choose from {', '.join(SEQ2SEQ)}")
    rows = []
    for name in models:
        if progress:
            print(f"== {name}")
        r = train_translate(out / name, name, data=ParallelDataConfig(data=task), force=force, progress=progress)
        rows.append({"model": name, **{k: r["test"][k] for k in ("exact_match", "bleu", "chrf")},
                     "parameters": r["parameters"], "train_seconds": r["train_seconds"]})  # fmt: skip
    ck.write_json(out / "compare.json", {"task": task, "rows": rows})
    from attnlab.viz.confusion import plot_comparison

    bars = (("exact_match", "exact match", 1.0), ("bleu", "BLEU / 100", 100.0), ("chrf", "chrF / 100", 100.0))
    plot_comparison(rows, out / "compare.png", f"{task}: test scores (greedy), same data and budget", bars)
    return rows


def _compare_images(task: str, models: list[str], out: Path, force: bool, progress: bool) -> list[dict]:
    from attnlab.data.images import ImageDataConfig
    from attnlab.tasks.image import MODELS as IMAGE_MODELS
    from attnlab.tasks.image import train_image

    unknown = [m for m in models if m not in IMAGE_MODELS]
    if unknown:
        raise AttnlabError(f"unknown model {unknown[0]!r} for {task}; choose from {', '.join(IMAGE_MODELS)}")
    rows = []
    for name in models:
        if progress:
            print(f"== {name}")
        r = train_image(out / name, name, data=ImageDataConfig(data=task), force=force, progress=progress)
        rows.append({"model": name, "accuracy": r["test"]["accuracy"], "macro_f1": r["test"]["macro_f1"],
                     "parameters": r["parameters"], "train_seconds": r["train_seconds"]})  # fmt: skip
    ck.write_json(out / "compare.json", {"task": task, "rows": rows})
    from attnlab.viz.confusion import plot_comparison

    plot_comparison(rows, out / "compare.png", f"{task}: test scores, same data split")
    return rows


def format_table(rows: list[dict]) -> str:
    if rows and "exact_match" in rows[0]:
        lines = [f"{'model':<14} {'exact':>8} {'BLEU':>7} {'chrF':>7} {'parameters':>11} {'train time':>11}"]
        lines += [f"{r['model']:<14} {r['exact_match']:>8.2%} {r['bleu']:>7.2f} {r['chrf']:>7.2f} "
                  f"{r['parameters']:>11,} {r['train_seconds']:>10.0f}s" for r in rows]  # fmt: skip
        return "\n".join(lines)
    lines = [f"{'model':<10} {'accuracy':>9} {'macro-F1':>9} {'parameters':>11} {'train time':>11}"]
    for r in rows:
        lines.append(f"{r['model']:<10} {r['accuracy']:>9.2%} {r['macro_f1']:>9.4f} {r['parameters']:>11,} "
                     f"{r['train_seconds']:>10.0f}s")  # fmt: skip
    return "\n".join(lines)
