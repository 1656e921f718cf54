"""Tasks: one file per kind of run, each a `Task` (tasks/base.py), all of them in TASKS
(tasks/registry.py), and `train`, which trains any of them.

Its names load on first use (attnlab/lazy.py), so that a torch-free module of this package (what
`attnlab compare` takes, tasks/compare_options.py) imports without the tasks' torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.lazy import lazy_names

if TYPE_CHECKING:
    from attnlab.tasks.base import Task
    from attnlab.tasks.registry import TASKS, register, task_of, train

REGISTRY = "attnlab.tasks.registry"
__getattr__, __dir__ = lazy_names(
    __name__,
    {"TASKS": REGISTRY, "Task": "attnlab.tasks.base", "register": REGISTRY, "task_of": REGISTRY, "train": REGISTRY},
)

__all__ = ["TASKS", "Task", "register", "task_of", "train"]
