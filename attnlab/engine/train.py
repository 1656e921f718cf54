"""One skeleton for every task that trains: `run(task, request)`.

    request (out, model choice and overrides, TrainConfig, the task's data config, resume/force/init,
            its options): every setting resolved, once, by tasks/request.py
    -> task.complete: what the run needs resolved once (the --init model as a run folder)
    -> check the run directory, set up processes (torchrun) and the device
    -> new runs: task.setup (tokenizers, caches: slow work that may fail, so before --force
       replaces an old run), then a fresh directory with the files setup made (rank 0)
    -> task.prepare: batches, model builder, config.json (every process, new or resumed)
    -> session.start + loop.loop: the shared training loop, checkpoints, Ctrl-C
    -> task.finish: test scores, eval.json, pictures
The task decides what its data and model are; this module decides the order, once for all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from attnlab.data.batches import Batches
from attnlab.engine.config import TrainConfig
from attnlab.engine.loop import loop
from attnlab.engine.resume import check_more_to_train, check_same_init
from attnlab.engine.session import Session, start
from attnlab.engine.tracking import make_trackers
from attnlab.errors import AttnlabError
from attnlab.io import write_text
from attnlab.nn.counting import count_parameters
from attnlab.runs.folder import STATE, check_dir, discard_unstarted, fresh_dir, is_run, read_run_config
from attnlab.runs.marker import record
from attnlab.runtime import distributed
from attnlab.runtime.distributed import Dist
from attnlab.runtime.shared import check_shared


class Task(Protocol):
    """What the engine asks of a task (tasks/base.py implements it): its name, the model a saved run
    names, the slow set-up of a new run, the data and model of every run, and what to do once trained."""

    name: str

    def model_of(self, config: dict[str, Any]) -> str: ...

    def complete(self, req: TrainRequest) -> TrainRequest: ...

    def recorded_options(self, req: TrainRequest) -> dict[str, Any]: ...

    def setup(self, req: TrainRequest) -> dict[str, str]: ...

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared: ...

    def finish(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]: ...


@dataclass
class TrainRequest:
    """What to train, every setting resolved (tasks/request.py makes it, for the command line and
    Python alike): the same for every task; `model_config` are overrides of the chosen model's
    config fields ("preset" among them; a resumed run's own), `data` the task's own data config."""

    out: str | Path
    model: str  # one of the task's model names
    model_config: dict[str, Any]
    train: TrainConfig
    data: Any  # the task's data config
    resume: bool = False
    force: bool = False
    init: str | Path | None = None  # a run whose weights (and tokenizer) to start from
    progress: bool = True
    options: Any = None  # the task's own options (an instance of task.options)
    saved: dict[str, Any] | None = None  # resume: the run's config.json
    converters: tuple = ()  # what turns the --init model into the one trained, in order (quantize, LoRA)
    base: Path | None = None  # the --init model as a run folder, resolved once (task.complete)


@dataclass
class Prepared:
    """What a task hands the loop."""

    batches: Batches
    build: Callable[[], nn.Module]  # the model, from the seed (start loads a resumed run's weights)
    config: dict[str, Any]  # config.json: family, model, train, data, task
    state: Any = None  # what task.finish needs (splits, tokenizers, labels)


def resumed(task: Task, req: TrainRequest, saved: dict[str, Any]) -> TrainRequest:
    """`req` (its settings resolved: tasks/request.py) for the run in req.out, which goes on: its own
    model and --init, its config.json at hand."""
    check_same_init(req.init, saved)  # the original command with --resume appended may repeat it
    check_more_to_train(Path(req.out), req.train)  # before the run's config.json takes the new settings
    own = {"model": task.model_of(saved), "model_config": dict(saved["model"]), "init": saved.get("init") or None}
    return replace(req, **own, resume=True, force=False, saved=saved)


def restartable(out: Path) -> bool:
    """A run an attempt of this command has checkpointed (not one that never reached its first)."""
    return is_run(out) and (out / STATE).is_file()


def open_session(task: Task, req: TrainRequest) -> tuple[Session, Prepared, TrainRequest]:
    """Everything up to the first step of a resolved request (tasks/request.py): run directory,
    processes, data, model, optimizer."""
    req = task.complete(req)
    out, cfg = Path(req.out), req.train
    trackers = make_trackers([cfg.log] if cfg.log else [])  # a missing library said before anything is written
    world = distributed.world_size()
    if cfg.batch_size % (cfg.grad_accum * world):
        micro = cfg.batch_size // cfg.grad_accum if cfg.batch_size % cfg.grad_accum == 0 else 0
        fits = ", ".join(str(n) for n in range(1, micro + 1) if micro % n == 0)
        fix = f"run on {fits} processes or change" if fits else "change"
        raise AttnlabError(
            f"batch_size {cfg.batch_size} does not split into {cfg.grad_accum} micro-batches on "
            f"{world} processes: {fix} --batch-size or --grad-accum"
        )
    d, device = distributed.init(cfg.device)
    try:
        check_shared(d, out)  # every node sees the run folder, or all stop with one line (not a hang)
        restarted = distributed.restarted(d)  # a collective: every process asks
        if not req.resume and restarted and restartable(out):
            # torchrun --max-restarts started the group again with the same command: go on from the
            # checkpoint the failed attempt left (--force replaced the old run on the first attempt).
            req = resumed(task, req, read_run_config(out))
        check_dir(out, req.resume, req.force)
        distributed.barrier(d)  # every process has looked at `out` before the first one writes into it
        if not req.resume:
            with distributed.main_first(d):
                if d.main:
                    files = task.setup(req)
                    fresh_dir(out)
                    record(out, *files)
                    for name, text in files.items():
                        write_text(out / name, text)
        prepared = task.prepare(req, d)
        fresh = req.model_config.get("preset") or _preset_of(req.init)
        preset = (req.saved or {}).get("preset") if req.resume else fresh
        if preset is not None:  # what a --preset given again on --resume is compared with
            prepared.config["preset"] = preset
        if recorded := task.recorded_options(req):  # the task's own options, a resumed run's own
            prepared.config["options"] = recorded
        s = start(out, prepared.build, prepared.batches, cfg, prepared.config, d, device, req.resume, command=task.name)
        s.trackers = trackers
        if req.resume and d.main:
            spent = f" ({s.elapsed:.0f} s of the {cfg.time_budget} budget spent)" if cfg.time_budget else ""
            again = " (torchrun restarted the group)" if restarted else ""
            print(f"resuming {out} from step {s.step} of {cfg.max_steps}{spent}{again}", file=sys.stderr)
    except BaseException:
        if not req.resume and d.main:  # a start that failed before its first checkpoint leaves nothing
            discard_unstarted(out)
        distributed.shutdown(d)
        raise
    return s, prepared, req


def _preset_of(init: str | Path | None) -> str | None:
    """The preset an --init run started from (recorded, so that `attnlab runs` names it for sft, dpo, ...)."""
    if init is None or not is_run(Path(init)):  # a HuggingFace folder, or no --init
        return None
    try:
        return read_run_config(Path(init)).get("preset")
    except (AttnlabError, OSError):  # its own load says what is wrong with it
        return None


def run(task: Task, req: TrainRequest) -> dict[str, Any]:
    """Train `task` as `req` asks; returns the final losses, parameters, time and the task's scores."""
    s, prepared, req = open_session(task, req)
    try:
        t0 = time.perf_counter()
        result = loop(s, req.progress)
        result["train_seconds"] = time.perf_counter() - t0
        counted = count_parameters(s.raw)  # a quantized base's matrices at their logical count
        result["parameters"], result["trained_parameters"] = counted.logical, counted.trained
        result.update(task.finish(s, prepared, req))
        return result
    finally:
        distributed.shutdown(s.dist)


__all__ = ["Prepared", "Session", "TrainRequest", "open_session", "resumed", "run"]
