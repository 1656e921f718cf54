"""`attnlab train`: one sub-command per task, and `vectors`, each filled the first time it is used
(cli/train.py), so that `attnlab train --help` lists the tasks without importing them (torch).

The built-in tasks' names and help lines are read from cli/choices.py's TASK_HELPS (held equal to
TASKS by tests/test_startup.py); a task registered from outside (tasks.register, before the parser
is built) has its sub-command too.
"""

from __future__ import annotations

import argparse
import importlib

from attnlab.cli.choices import TASK_HELPS
from attnlab.runs.kind import KINDS

TRAIN = "attnlab.cli.train"  # fills a sub-command's parser: imported when one is used
VECTORS_HELP = "word vectors: Word2Vec (skip-gram, CBOW), FastText or GloVe"


def add_tasks(train: argparse.ArgumentParser, parser_class: type) -> None:
    """`attnlab train TASK` for every task, and `attnlab train vectors`, in the `train` parser
    cli/main.py made (filled the first time it is used)."""
    tasks = train.add_subparsers(dest="task", metavar="TASK", parser_class=parser_class)
    tasks.required = True
    # KINDS holds the registered tasks (empty until tasks/registry.py is imported): a plugin's, after ours
    registered = {name: kind.help for name, kind in KINDS.items() if name not in TASK_HELPS}  # type: ignore[attr-defined]
    for name, help_ in {**TASK_HELPS, **registered}.items():
        p = tasks.add_parser(name, help=help_)
        p.fill = lambda p=p, name=name: importlib.import_module(TRAIN).fill_task(p, name)
        p.keeps_help = True  # the task's flags need torch to be made: its help is kept once made
    p = tasks.add_parser("vectors", help=VECTORS_HELP)
    p.fill = lambda p=p: importlib.import_module(TRAIN).fill_vectors(p)
    p.keeps_help = True
