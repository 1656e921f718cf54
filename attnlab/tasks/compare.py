"""Train several models on one task with the same data and budget, and compare them.

    run_comparison(CompareOptions(task="sentiment", models="encoder,bow"))
      -> rows of test scores, parameters and training time; compare.json and a bar chart compare.png

Each `--task` of `attnlab compare` is an entry of COMPARISONS: the task that trains the models, its
data, the scores of a row. `lm` compares language-model recipes instead (tasks/lm_compare.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.data import captions
from attnlab.data.images import ImageDataConfig
from attnlab.data.labeled import LabeledDataConfig
from attnlab.data.parallel import GENERATED, ParallelDataConfig
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run
from attnlab.errors import AttnlabError
from attnlab.io import write_json
from attnlab.models import FAMILIES
from attnlab.tasks import TASKS
from attnlab.tasks.compare_options import LADDER_MODELS, CompareOptions
from attnlab.tasks.lm_compare import compare_lm, format_lm_table
from attnlab.tasks.request import python_request
from attnlab.viz.confusion import CLASSIFY_BARS, plot_comparison
from attnlab.wordvec import load_vectors

COMPARISONS: dict[str, Any] = {}  # --task -> what it compares (filled below)
TRANSLATION_BARS = (("exact_match", "exact match", 1.0), ("bleu", "BLEU / 100", 100.0), ("chrf", "chrF / 100", 100.0))
VECTORS = "+vectors"  # the suffix of a model trained from pretrained word vectors
LM_BUDGET = "2m"  # each recipe's training time when --budget is not given


@dataclass(frozen=True)
class ModelComparison:
    """Models of one task trained on one dataset with their tuned settings: a table row each."""

    task: str  # the task that trains them
    data: Callable[[], Any]  # its data config
    models: str  # the default models, comma-separated
    scores: tuple[str, ...]
    title: str
    bars: tuple = CLASSIFY_BARS
    label: str | None = None  # the data's name in compare.json (default: the --task)
    reads_vectors: bool = False  # the models may start from pretrained word vectors

    def run(self, opts: CompareOptions, progress: bool = True) -> tuple[list[dict], str]:
        if opts.word_vectors and not self.reads_vectors:
            raise AttnlabError("--word-vectors: only the text tasks (sentiment, tagging) read word vectors")
        task, models, out = TASKS[self.task], (opts.models or self.models).split(","), Path(opts.out)
        check_models(models, task, opts.task)
        one = trainer(task, self.data(), out, opts.force, progress, opts.budget)
        if opts.word_vectors:
            one, models = with_vectors(one, models, opts.word_vectors, opts.freeze_vectors)
        rows = train_each(models, one, self.scores, progress)
        write_json(out / "compare.json", {"task": self.label or opts.task, "rows": rows})
        plot_comparison(rows, out / "compare.png", self.title, self.bars)
        return rows, format_table(rows)


class RecipeComparison:
    """--task lm: language-model recipes (or blocks) for one time budget (tasks/lm_compare.py)."""

    def run(self, opts: CompareOptions, progress: bool = True) -> tuple[list[dict], str]:
        parts = opts.parts.split(",") if opts.parts else None
        rows = compare_lm(
            Path(opts.out),
            opts.budget or LM_BUDGET,
            opts.data,
            parts,
            force=opts.force,
            progress=progress,
            blocks=opts.blocks,
        )
        return rows, format_lm_table(rows, blocks=opts.blocks)


def run_comparison(opts: CompareOptions, progress: bool = True) -> tuple[list[dict], str]:
    """The rows of the comparison opts.task names, and its table as text."""
    if opts.task not in COMPARISONS:
        raise AttnlabError(f"unknown task {opts.task!r}; choose from {', '.join(COMPARISONS)}")
    return COMPARISONS[opts.task].run(opts, progress)


def check_models(models: list[str], task, where: str) -> None:
    """Every model is one of the task's, and one its settings fit (the bag of words cannot tag)."""
    unknown = [m for m in models if m not in task.models]
    if unknown:
        raise AttnlabError(f"unknown model {unknown[0]!r} for {where}; choose from {', '.join(task.models)}")
    for name in models:
        try:
            task.models[name].config(**dict(task.models[name].fixed))
        except ValueError as e:
            raise AttnlabError(f"{name}: {e}; leave it out of --models") from None


def trainer(task, data, out: Path, force: bool, progress: bool, budget: str | None = None) -> Callable[..., dict]:
    """Train one model of `task` on `data` into out/NAME, with the task's tuned settings; `budget`: each
    model's training time at most (its schedule then follows the clock, see TrainConfig.time_budget)."""

    def one(name: str, fields: dict | None = None, options: dict | None = None, folder: str | None = None) -> dict:
        train = TrainConfig(**{**task.train_defaults(name), "time_budget": budget}) if budget else None
        req = python_request(
            task, out / (folder or name), name, fields, train, data, force=force, progress=progress, options=options
        )
        return run(task, req)

    return one


def with_vectors(one, models: list[str], path, freeze: bool):
    """Models that have a `d_embed` also start from the vectors (embedding width set to theirs)."""
    dim = int(load_vectors(path).vectors.shape[1])
    embedded = {m for m in models if "d_embed" in {f.name for f in dataclasses.fields(FAMILIES[m][0])}}
    options = {"word_vectors": str(path), "freeze_vectors": freeze}

    def train(name: str) -> dict:
        if name.endswith(VECTORS):
            return one(name[: -len(VECTORS)], {"d_embed": dim}, options, name)
        return one(name)

    return train, [v for m in models for v in ([m, m + VECTORS] if m in embedded else [m])]


def train_each(models: list[str], train: Callable[[str], dict], scores: tuple, progress: bool) -> list[dict]:
    """One row per model: its test `scores`, parameters and training time."""
    rows = []
    for name in models:
        if progress:
            print(f"== {name}")
        r = train(name)
        rows.append(
            {
                "model": name,
                **{k: r["test"][k] for k in scores},
                "parameters": r["parameters"],
                "train_seconds": r["train_seconds"],
            }
        )
    return rows


def format_table(rows: list[dict]) -> str:
    if rows and "exact_match" in rows[0]:
        where = "attention_on_digit" in rows[0]  # captions: a digit word's attention on its digit
        lines = [
            f"{'model':<14} {'exact':>8} {'BLEU':>7} {'chrF':>7}"
            + (f" {'on digit':>9}" if where else "")
            + f" {'parameters':>11} {'train time':>11}"
        ]
        lines += [
            f"{r['model']:<14} {r['exact_match']:>8.2%} {r['bleu']:>7.2f} {r['chrf']:>7.2f}"
            + (f" {r['attention_on_digit']:>9.2%}" if where else "")
            + f" {r['parameters']:>11,} {r['train_seconds']:>10.0f}s"
            for r in rows
        ]
        return "\n".join(lines)
    lines = [f"{'model':<22} {'accuracy':>9} {'macro-F1':>9} {'parameters':>11} {'train time':>11}"]
    for r in rows:
        lines.append(
            f"{r['model']:<22} {r['accuracy']:>9.2%} {r['macro_f1']:>9.4f} {r['parameters']:>11,} "
            f"{r['train_seconds']:>10.0f}s"
        )
    return "\n".join(lines)


def _labeled(data: str, task: str) -> ModelComparison:
    return ModelComparison(
        task,
        lambda: LabeledDataConfig(data=data),
        LADDER_MODELS,
        ("accuracy", "macro_f1"),
        f"{data}: test scores, same data and budget",
        reads_vectors=True,
    )


def _translation(data: str) -> ModelComparison:
    # ParallelDataConfig is read when the comparison runs (a test may shrink it).
    return ModelComparison(
        "translate",
        lambda: ParallelDataConfig(data=data),
        "transformer,rnn-attention,rnn",
        ("exact_match", "bleu", "chrf"),
        f"{data}: test scores (greedy), same data and budget",
        TRANSLATION_BARS,
    )


COMPARISONS.update(
    {
        "sentiment": _labeled("sentiment", "classify"),
        "tagging": _labeled("tagging", "tag"),
        **{name: _translation(name) for name in GENERATED},
        "digits": ModelComparison(
            "image",
            lambda: ImageDataConfig(data="digits"),
            "vit,mlp",
            ("accuracy", "macro_f1"),
            "digits: test scores, same data split",
        ),
        "caption": ModelComparison(
            "caption",
            lambda: captions.CaptionDataConfig(),
            "transformer,rnn-attention",
            ("exact_match", "bleu", "chrf", "attention_on_digit"),
            "digits-strips captions: test scores (greedy), same data",
            (*TRANSLATION_BARS, ("attention_on_digit", "digit word's attention on its digit", 1.0)),
            label="digits-strips",
        ),
        "lm": RecipeComparison(),
    }
)
