"""Experiment trackers: where a run's metrics go besides metrics.jsonl (`--log tensorboard`).

metrics.jsonl is always written (io.py, loop.py); a tracker receives the same rows as they are
logged. A tracker is one class with three methods and one entry in TRACKERS:

    __init__()                 checks the tracker's library is there, before the run folder is made
    open(run, config, start)   before the first step (rank 0 only): the run folder, its config.json,
                               the step training starts from (a resume: later events are dropped)
    log(step, metrics)         each row of metrics.jsonl: {"loss": ..., "lr": ...} or {"val_loss": ...}
    close()                    after the last step, or on an error or Ctrl-C

`files` names what it writes inside the run folder, so that the run's marker lists it and --force
removes it. None is on by default. Adding wandb or mlflow is one class here (or in its own file)
and one line in TRACKERS.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar, Protocol

from attnlab.errors import AttnlabError


class Tracker(Protocol):
    files: ClassVar[tuple[str, ...]]  # names inside the run folder this tracker writes

    def open(self, run: Path, config: dict[str, Any], start: int) -> None: ...

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def tag(key: str) -> str:
    """metrics.jsonl's key -> the tracker's name, grouped as TensorBoard shows them:
    val_loss -> val/loss, loss -> train/loss, lr -> train/lr."""
    return "val/" + key.removeprefix("val_") if key.startswith("val_") else "train/" + key


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalar values of a row (a tracker draws numbers; routing lists and the like stay in the file)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoard:
    """TensorBoard event files in RUN/tensorboard/: `tensorboard --logdir RUN` (or the folder of
    several runs) draws them."""

    files = ("tensorboard",)

    def __init__(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra: 5 s to import, --log alone
        except ImportError:
            raise AttnlabError("--log tensorboard needs TensorBoard: pip install 'attnlab[tensorboard]'") from None
        self.make_writer = SummaryWriter

    def open(self, run: Path, config: dict[str, Any], start: int) -> None:
        # purge_step: a resume from step N hides events logged after N, as metrics.jsonl drops those rows.
        self.writer = self.make_writer(str(run / "tensorboard"), purge_step=start + 1 if start else None)
        if start == 0:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in numbers(metrics).items():
            if math.isfinite(value):
                self.writer.add_scalar(tag(key), value, step)

    def close(self) -> None:
        self.writer.close()  # flushes: the events reach the file now, not at the next 2-minute flush


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoard}


def make_trackers(names: list[str]) -> list[Tracker]:
    """The trackers named, not yet open: made before the run folder is, so a missing library stops
    the run before anything is written."""
    return [TRACKERS[name]() for name in names]


def open_trackers(trackers: list[Tracker], run: Path, config: dict[str, Any], start: int) -> None:
    """Open each (if one fails, those opened are closed)."""
    opened: list[Tracker] = []
    try:
        for tracker in trackers:
            tracker.open(run, config, start)
            opened.append(tracker)
    except BaseException:
        close_trackers(opened)
        raise


def close_trackers(trackers: list[Tracker]) -> None:
    for tracker in trackers:
        tracker.close()
