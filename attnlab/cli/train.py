"""`attnlab train TASK`: the flags of one task of TASKS, generated from the task's option dataclasses
(its TrainOptions, data config, its models' configs, TrainConfig), and those of `attnlab train
vectors`. cli/train_tasks.py makes the sub-commands; each is filled here the first time it is used."""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from typing import Any

from attnlab.cli.commands import speaks
from attnlab.cli.generate import add_options, add_section, given, read_options
from attnlab.cli.options import TrainVectorsOptions
from attnlab.cli.vectors import run_train_vectors
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run
from attnlab.runs.converters import CONVERTERS
from attnlab.tasks import TASKS, Task
from attnlab.tasks.base import TrainOptions
from attnlab.tasks.request import SECTIONS, requested
from attnlab.wordvec.config import VectorsConfig

# The flags' defaults where the settings class's own are not the command's: no LoRA unless a rank is given.
CONVERTER_DEFAULTS = {"lora": {"rank": 0}}


def fill_task(p: argparse.ArgumentParser, name: str) -> None:
    """`attnlab train NAME`'s parser (cli/train_tasks.py made it): the task's flags, and what runs it."""
    task = TASKS[name]
    p.description = task.description
    add_task_flags(p, task)
    p.set_defaults(command=lambda args: run_train(task, args))


def fill_vectors(p: argparse.ArgumentParser) -> None:
    """`attnlab train vectors`: word vectors, trained by their own trainer (wordvec/)."""
    p.description = (
        "Train word vectors on a text. --data english (the default) is the built-in corpus: the "
        "docstrings and comments of Python's standard library (about 545k words), "
        "no download."
    )
    add_options(p, TrainVectorsOptions)
    add_section(p, "vectors", VectorsConfig, "word vectors")
    p.set_defaults(
        command=lambda args: run_train_vectors(read_options(args, TrainVectorsOptions), given(args, "vectors"))
    )


def add_task_flags(p: argparse.ArgumentParser, task: Task) -> None:
    """The task's options, then its data, model and training settings, with the defaults it uses shown."""
    choice = task.models[task.default_model]
    several = len(task.models) > 1
    overrides = {
        "init": {"help": task.init_help},
        "model": {
            "choices": list(task.models),
            "default": task.default_model,
            "help": f"which model (default: {task.default_model})",
        },
    }
    if choice.presets:
        named = f"preset: {', '.join(choice.presets)} (default: {choice.default_preset})"
        overrides["preset"] = {"help": task.preset_help or named}
    skip = frozenset({"model"} if not several else ()) | frozenset({"preset"} if not choice.presets else ())
    add_options(p, TrainOptions, overrides, skip)
    if fields(task.options):
        add_section(p, "options", task.options, f"{task.name} options", defaults=asdict(task.options()))
    for kind in task.converters:  # --lora-rank, --quantize-base: what turns the --init model into the one trained
        add_section(p, kind, CONVERTERS[kind], kind, defaults=CONVERTER_DEFAULTS.get(kind), prefix=f"{kind}_")
    add_section(p, "data", task.data_config, "data", defaults=asdict(task.default_data()))
    classes = tuple(dict.fromkeys(m.config for m in task.models.values()))
    title = (
        "model (fields of the chosen --model; the class each belongs to in brackets)"
        if several
        else "model (override the preset)"
    )
    preset = asdict(choice.presets[choice.default_preset]) if choice.presets else {}
    add_section(p, "model", classes, title, task.set_by_data, defaults=preset)
    title = f"training (tuned per --model; defaults shown: the {task.default_model}'s)" if several else "training"
    add_section(p, "train", TrainConfig, title, defaults=task.train_defaults(task.default_model))


def run_train(task: Task, args: argparse.Namespace) -> int:
    """Any task: its one request (tasks/request.py says the order of the settings), then the engine."""
    opts = read_options(args, TrainOptions)
    flags: dict[str, dict[str, Any]] = {name: given(args, name) for name in SECTIONS}
    result = run(task, requested(task, opts, flags))
    if speaks():
        print(task.result_line(result, opts.out))
    return 0
