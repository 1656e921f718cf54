"""Every task attnlab trains, by name: the one place that says what kind of run a config.json is.

    TASKS["classify"].predict(run, "a fine film", {})     # what the run does with an input
    task_of(run.config)                                    # which task wrote the run

A new task is a `Task` subclass in its own file (see tasks/base.py) plus one line in TASKS.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnlab.engine.config import TrainConfig
from attnlab.engine.train import TrainRequest, run
from attnlab.errors import AttnlabError
from attnlab.tasks.base import Task
from attnlab.tasks.caption import Captioning
from attnlab.tasks.image import ImageClassification
from attnlab.tasks.labeled import Labeled
from attnlab.tasks.lm import LanguageModel
from attnlab.tasks.mlm import MaskedLM
from attnlab.tasks.translate import Translation

TASKS: dict[str, Task] = {
    "lm": LanguageModel(),
    "classify": Labeled("classify", "a label per text", "a classifier"),
    "tag": Labeled("tag", "a label per token", "a tagger"),
    "mlm": MaskedLM(),
    "translate": Translation(),
    "image": ImageClassification(),
    "caption": Captioning(),
}


def register(task: Task) -> Task:
    """Add a task (e.g. from a plugin or a test): `attnlab train NAME`, load and predict know it."""
    TASKS[task.name] = task
    return task


def task_of(config: dict[str, Any]) -> Task:
    """The task of a run's config.json: the kind it records; runs written before tasks were
    recorded (GPT language models, masked LMs) by their model."""
    kind = config.get("task", {}).get("kind")
    if config.get("family") == "vectors":
        raise AttnlabError("this is a word-vectors run (attnlab train vectors): ask it with attnlab vectors RUN")
    if kind is None:
        kind = "lm" if config.get("family", "gpt") == "gpt" else config["model"].get("head", "mlm")
    if kind not in TASKS:
        raise AttnlabError(f"unknown task {kind!r} in config.json (known: {', '.join(TASKS)})")
    return TASKS[kind]


def train(
    out: str | Path,
    model: Any = None,
    train: TrainConfig | None = None,
    data: Any = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    init: str | Path | None = None,
    task: str = "lm",
    **options: Any,
) -> dict:
    """Train any task into the run directory `out`; returns final losses (and the task's test scores).

    The same dataclasses the command line is generated from: `model` a config of one of the task's
    models (GPTConfig for "lm", EncoderConfig or a baseline's for "classify", ...; the task's default
    when None), TrainConfig, and the task's data config. `init`: a run to start from; `resume`:
    continue `out` (settings not given are the run's own).
    """
    if task not in TASKS:
        raise AttnlabError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    t = TASKS[task]
    name, fields = None, {}
    if model is not None:
        fields = asdict(model)
        fits = [n for n, m in t.models.items() if m.config is type(model) and dict(m.fixed).items() <= fields.items()]
        name = fits[0] if fits else None
        if name is None:
            raise AttnlabError(f"a {type(model).__name__} is not a model of task {task} ({', '.join(t.models)})")
    req = TrainRequest(out, name, fields, train, data, resume=resume, force=force, init=init, progress=progress,
                       options=options)  # fmt: skip
    return run(t, req)


__all__ = ["TASKS", "Task", "register", "task_of", "train"]
