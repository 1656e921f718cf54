"""Resuming a run: what may be given again, what may change, and how far the run already is.

The original command with --resume appended must work: model and data settings given again are
compared with the run's own and refused only where they differ (the weights have their shape, the
tokens their split), naming the flag, the run's value and the new one. Training settings may
change, but a --max-steps (or --time-budget) the run has already reached would train nothing, so
it is refused before anything in the run folder is touched.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from attnlab.config import parse_value
from attnlab.engine.config import TrainConfig, budget_seconds
from attnlab.errors import AttnlabError
from attnlab.runs.folder import STATE


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def show(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def check_unchanged(
    what: str, cls: type, saved: dict[str, Any], given: dict[str, tuple[str, Any]], why: str = ""
) -> None:
    """Settings given again on --resume must equal the run's own (its config.json section `saved`);
    the first that differs is refused, by name. given: field -> (what set it, e.g. "--n-layer" or
    "--preset gpt-micro", its value as given)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    for name, (source, value) in given.items():
        if name not in saved and name not in defaults:
            raise AttnlabError(f"{source} does not apply to this run's {what}")
        ours = parse_value(cls, name, saved.get(name, defaults.get(name)))
        if parse_value(cls, name, value) != ours:
            set_by = f"{source} {show(value)}" if source == flag(name) else f"{source} (its {flag(name)} {show(value)})"
            because = f" ({why})" if why else ""
            raise AttnlabError(
                f"{set_by} differs from the run's {show(ours)}: {what} settings cannot change when "
                f"resuming{because}; give {flag(name)} {show(ours)} or leave it out"
            )


def as_given(fields: dict[str, Any], source: str | None = None) -> dict[str, tuple[str, Any]]:
    """{field: value} -> {field: (what set it, value)}: the flag itself, or `source` (a preset)."""
    return {k: (source or flag(k), v) for k, v in fields.items()}


def check_same_init(init: str | Path | None, saved: dict[str, Any]) -> None:
    """--init on --resume: accepted when it names the run this one started from, else refused."""
    if init is None:
        return
    first = saved.get("init")
    if first is None:
        raise AttnlabError(
            f"--init starts a new run and --resume continues one: give only one of them (this run "
            f"was not started from --init {init})"
        )
    if Path(init).resolve() != Path(first).resolve():
        raise AttnlabError(
            f"--init {init} differs from the run's --init {first}: a resumed run keeps the weights "
            f"it started from; drop --init or give --init {first}"
        )


def saved_progress(run: Path) -> tuple[int, float] | None:
    """The step and seconds of training of the run's checkpoint, from the file's header alone
    (None if it cannot be read: loading the state then says why)."""
    try:
        with safe_open(str(run / STATE), framework="pt") as f:
            meta = f.metadata() or {}
        return int(meta["step"]), float(meta.get("elapsed", 0.0))
    except (SafetensorError, OSError, ValueError, KeyError):
        return None


def check_more_to_train(run: Path, cfg: TrainConfig) -> int | None:
    """A resume that would train nothing is refused: the run is already at --max-steps (or beyond
    it), or has spent its --time-budget. Returns the step it resumes from (None: unreadable)."""
    progress = saved_progress(run)
    if progress is None:
        return None
    step, elapsed = progress
    if cfg.max_steps <= step:
        where = (
            f"has trained its {step} steps"
            if cfg.max_steps == step
            else f"is at step {step}, beyond --max-steps {cfg.max_steps}"
        )
        raise AttnlabError(f"{run} {where}: nothing to train; give a --max-steps above {step} to go on")
    if cfg.time_budget is not None and elapsed >= budget_seconds(cfg.time_budget):
        raise AttnlabError(
            f"{run} has spent its time budget of {cfg.time_budget} ({math.floor(elapsed)} s "
            f"of training, at step {step}): nothing to train; give a larger --time-budget"
        )
    return step


__all__ = ["as_given", "check_more_to_train", "check_same_init", "check_unchanged", "saved_progress"]
