"""Every task attnlab trains, by name: the one place that says what kind of run a config.json is.

    TASKS["classify"].predict(run, "a fine film", {})     # what the run does with an input
    task_of(run.config)                                    # which task wrote the run

A new task is a `Task` subclass in its own file (see tasks/base.py) plus one line in TASKS.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run
from attnlab.errors import ArgumentTypeError, ArgumentValueError, AttnlabError, kind, path_argument
from attnlab.runs.kind import KINDS, kind_of
from attnlab.tasks.base import Task
from attnlab.tasks.caption import Captioning
from attnlab.tasks.classify import Classify
from attnlab.tasks.dpo import DirectPreference
from attnlab.tasks.grpo import GroupRelative
from attnlab.tasks.image import ImageClassification
from attnlab.tasks.lm import LanguageModel
from attnlab.tasks.mlm import MaskedLM
from attnlab.tasks.ppo import ProximalPolicy
from attnlab.tasks.request import python_names, python_request
from attnlab.tasks.reward import RewardModelling
from attnlab.tasks.sft import SupervisedFineTuning
from attnlab.tasks.tag import Tag
from attnlab.tasks.translate import Translation

# Every task, by name: the same registry `attnlab.load` reads a run's kind from (runs/kind.py).
TASKS: dict[str, Task] = KINDS  # type: ignore[assignment]
for _task in (
    LanguageModel(),
    Classify(),
    Tag(),
    MaskedLM(),
    Translation(),
    ImageClassification(),
    Captioning(),
    SupervisedFineTuning(),
    DirectPreference(),
    RewardModelling(),
    GroupRelative(),
    ProximalPolicy(),
):
    TASKS[_task.name] = _task


def register(task: Task) -> Task:
    """Add a task (e.g. from a plugin or a test): `attnlab train NAME`, load and predict know it."""
    TASKS[task.name] = task
    return task


def task_of(config: dict[str, Any]) -> Task:
    """The task that wrote a run's config.json (runs.kind_of: the kind it records, or for runs
    written before kinds were recorded, its family's)."""
    return kind_of(config)  # type: ignore[return-value]


def train(
    out: str | Path,
    model: Any = None,
    train: TrainConfig | dict[str, Any] | None = None,
    data: Any = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    init: str | Path | None = None,
    task: str = "lm",
    **options: Any,
) -> dict:
    """Train any task into the run directory `out`; returns final losses (and the task's test scores).

    The same dataclasses the command line is generated from, and the same request: `attnlab train
    TASK` with the arguments as flags (tasks/request.py). `model` a config of one of the task's
    models (GPTConfig for "lm", EncoderConfig or a baseline's for "classify", ...; the task's default
    preset when None), TrainConfig, and the task's data config: a config object given is its whole
    section; `train` and `data` may also be a dict of some fields, over the task's tuned settings
    (train={"max_steps": 800} is --max-steps 800). `options`: the task's own (group=4, beta=0.1) and
    its converters' (lora_rank=8, quantize_base="nf4"). `init`: a run to start from; `resume`:
    continue `out` (settings not given are the run's own).
    """
    if not isinstance(task, str) or task not in TASKS:
        raise ArgumentValueError(f"train: unknown task {task!r}; choose from {', '.join(TASKS)}")
    t = TASKS[task]
    _check_arguments(t, out, model, train, data, init)
    _check_options(t, options)
    name, fields = None, {}
    if model is not None:
        fields = asdict(model)
        fits = [n for n, m in t.models.items() if m.config is type(model) and dict(m.fixed).items() <= fields.items()]
        name = fits[0] if fits else None
        if name is None:
            raise AttnlabError(f"a {type(model).__name__} is not a model of task {task} ({', '.join(t.models)})")
    req = python_request(
        t, out, name, fields, train, data, resume=resume, force=force, init=init, progress=progress, options=options
    )
    return run(t, req)


def _check_arguments(t: Task, out: Any, model: Any, train: Any, data: Any, init: Any) -> None:
    """train()'s arguments of the kinds it takes, each named: a library caller's train(123, ...)
    or train("runs/x", "gpt-nano") fails here, not deep in the engine."""
    path_argument(out, "train: out")
    if init is not None:
        path_argument(init, "train: init")
    if model is not None and not (is_dataclass(model) and not isinstance(model, type)):
        classes = ", ".join(dict.fromkeys(m.config.__name__ for m in t.models.values()))
        raise ArgumentTypeError(
            f"train: model must be a model config of task {t.name} ({classes}), e.g. "
            f"GPTConfig.from_preset('gpt-nano'); got {kind(model)}"
        )
    if train is not None and not isinstance(train, (TrainConfig, dict)):
        raise ArgumentTypeError(f"train: train must be a TrainConfig (or a dict of its fields), got {kind(train)}")
    if data is not None and not isinstance(data, (t.data_config, dict)):
        raise ArgumentTypeError(
            f"train: data must be a {t.data_config.__name__} (or a dict of its fields) for task {t.name}, "
            f"got {kind(data)}"
        )


def _check_options(t: Task, options: dict[str, Any]) -> None:
    """train()'s keyword options must be the task's own (its options' fields, and its converters' as
    their flags name them: lora_rank, quantize_base): an unknown one was silently ignored, and
    train("runs/x", lr=0.1) trained 2000 steps at the default rate."""
    own = sorted({f.name for f in fields(t.options)} | set(python_names(t)))
    settings = {f.name for f in fields(TrainConfig)}
    for name in options:
        if name not in own:
            near = difflib.get_close_matches(name, own, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            if name in settings:
                hint = f"; {name} is a training setting: pass train=TrainConfig({name}=...)"
            raise ArgumentTypeError(
                f"train: unknown option {name!r} for task {t.name} (its own: {', '.join(own) or 'none'}){hint}"
            )
