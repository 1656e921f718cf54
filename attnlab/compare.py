"""Train several models on one generated task with the same data and budget, and compare them.

compare("sentiment", ["encoder", "bow"], Path("runs/compare")) -> rows of test accuracy,
macro-F1, parameters and training time; writes compare.json and a bar chart compare.png.
"""

from __future__ import annotations

from pathlib import Path

from attnlab import checkpoint as ck
from attnlab.data.labeled import BUILTIN_TASKS, LabeledDataConfig
from attnlab.errors import AttnlabError
from attnlab.tasks.classify import MODELS, train_labeled


def compare(task: str, models: list[str], out: Path, force: bool = False, progress: bool = True) -> list[dict]:
    if task not in BUILTIN_TASKS:
        raise AttnlabError(f"unknown task {task!r}; choose from {', '.join(BUILTIN_TASKS)}")
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


def format_table(rows: list[dict]) -> str:
    lines = [f"{'model':<10} {'accuracy':>9} {'macro-F1':>9} {'parameters':>11} {'train time':>11}"]
    for r in rows:
        lines.append(f"{r['model']:<10} {r['accuracy']:>9.2%} {r['macro_f1']:>9.4f} {r['parameters']:>11,} "
                     f"{r['train_seconds']:>10.0f}s")  # fmt: skip
    return "\n".join(lines)
