"""One skeleton for every task that trains: `run(task, request)`.

    request (out, model choice and overrides, TrainConfig, the task's data config, resume/force/init)
    -> resume: the run's own model and data settings, training settings as given or saved
    -> check the run directory, set up processes (torchrun) and the device
    -> new runs: task.setup (tokenizers, caches: slow work that may fail, so before --force
       replaces an old run), then a fresh directory with the files setup made (rank 0)
    -> task.prepare: batches, model builder, config.json (every process, new or resumed)
    -> loop.start + loop.loop: the shared training loop, checkpoints, Ctrl-C
    -> task.finish: test scores, eval.json, pictures
The task decides what its data and model are; this module decides the order, once for all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from attnlab.config import from_dict
from attnlab.data.batches import Batches
from attnlab.engine import distributed
from attnlab.engine import rundir as ck
from attnlab.engine.config import TrainConfig
from attnlab.engine.loop import Session, loop, start
from attnlab.errors import AttnlabError

if TYPE_CHECKING:
    from attnlab.tasks.base import Task


@dataclass
class TrainRequest:
    """What to train: the same for every task; `model_config` are overrides of the chosen model's
    config fields ("preset" among them), `data` the task's own data config."""

    out: str | Path
    model: str | None = None  # one of the task's model names; None: its default
    model_config: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig | None = None  # None: the settings tuned for the task and model
    data: Any = None  # None: the task's default data
    resume: bool = False
    force: bool = False
    init: str | Path | None = None  # a run whose weights (and tokenizer) to start from
    progress: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # task-specific (e.g. word vectors)
    saved: dict[str, Any] | None = None  # resume: the run's config.json


@dataclass
class Prepared:
    """What a task hands the loop."""

    batches: Batches
    build: Callable[[], nn.Module]  # the model, from the seed (start loads a resumed run's weights)
    config: dict[str, Any]  # config.json: family, model, train, data, task
    state: Any = None  # what task.finish needs (splits, tokenizers, labels)


def completed(task: Task, req: TrainRequest) -> TrainRequest:
    """The request with every default filled in; on resume, the run's own model and data."""
    if req.resume:
        if req.init is not None:
            raise AttnlabError("--init starts a new run and --resume continues one: give only one of them")
        saved = ck.read_run_config(ck.check_resumable(req.out))
        train = req.train or from_dict(TrainConfig, saved["train"], where="train config")
        data = req.data or from_dict(task.data_config, saved["data"], where="data config")
        return replace(req, model=task.model_of(saved), model_config=dict(saved["model"]), train=train, data=data,
                       init=saved.get("init") or None, saved=saved)  # fmt: skip
    model = req.model or task.default_model
    if model not in task.models:
        raise AttnlabError(f"unknown model {model!r}; choose from {', '.join(task.models)}")
    train = req.train or TrainConfig(**task.train_defaults(model))
    return replace(req, model=model, train=train, data=req.data or task.default_data())


def open_session(task: Task, req: TrainRequest) -> tuple[Session, Prepared, TrainRequest]:
    """Everything up to the first step: defaults, run directory, processes, data, model, optimizer."""
    req = completed(task, req)
    out, cfg = Path(req.out), req.train
    world = distributed.world_size()
    if cfg.batch_size % (cfg.grad_accum * world):
        raise AttnlabError(
            f"batch_size {cfg.batch_size} does not split into {cfg.grad_accum} micro-batches on {world} processes"
        )
    d, device = distributed.init(cfg.device)
    try:
        ck.check_dir(out, req.resume, req.force)
        if not req.resume:
            with distributed.main_first(d):
                if d.main:
                    files = task.setup(req)
                    ck.fresh_dir(out)
                    for name, text in files.items():
                        ck.write_text(out / name, text)
        prepared = task.prepare(req, d)
        s = start(out, prepared.build, prepared.batches, cfg, prepared.config, d, device, req.resume,
                  command=task.name)  # fmt: skip
    except BaseException:
        if not req.resume and d.main:  # a start that failed before its first checkpoint leaves nothing
            ck.discard_unstarted(out)
        distributed.shutdown(d)
        raise
    return s, prepared, req


def run(task: Task, req: TrainRequest) -> dict[str, Any]:
    """Train `task` as `req` asks; returns the final losses, parameters, time and the task's scores."""
    s, prepared, req = open_session(task, req)
    try:
        t0 = time.perf_counter()
        result = loop(s, req.progress)
        result["train_seconds"] = time.perf_counter() - t0
        result["parameters"] = sum(p.numel() for p in s.raw.parameters())
        result.update(task.finish(s, prepared, req))
        return result
    finally:
        distributed.shutdown(s.dist)


__all__ = ["Prepared", "Session", "TrainRequest", "completed", "open_session", "run"]
