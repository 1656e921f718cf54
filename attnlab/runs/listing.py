"""The runs under a folder, one line each, and their loss curves drawn together (`attnlab runs`).

    >>> for r in list_runs("runs"): print(r.path, r.task, r.best_val)
    >>> compare_runs(["runs/a", "runs/b"], "curves.png")

Everything is read from the files a run keeps, never by loading its model: the settings from
config.json, the parameters and steps from the header of model.safetensors, the training time from
train_state.safetensors' header, the losses from metrics.jsonl. Listing a folder of large runs reads
a few kilobytes of each.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from attnlab.errors import AttnlabError
from attnlab.io import read_metrics
from attnlab.runs.folder import CONFIG, METRICS, STATE, WEIGHTS, check_run_dir, is_run, losses, read_run_config
from attnlab.runs.kind import LEGACY_KINDS
from attnlab.viz.curves import plot_runs

MAX_ROWS = 5000  # a long run's training rows thinned to about this many (every validation row is kept)


@dataclass
class RunSummary:
    """What `attnlab runs` prints of one run (None: the run does not say)."""

    path: Path
    task: str
    model: str  # family, layers x width, preset
    parameters: int | None  # in model.safetensors, packed matrices as O x I (a LoRA run stores its adapters alone)
    steps: int | None
    best_val: float | None  # the lowest validation loss logged
    seconds: float | None  # training time, every session of a resumed run together


def find_runs(root: str | Path) -> list[Path]:
    """Every run folder under `root` (root itself included), sorted by path; a run's own subfolders
    (snapshots) and hidden folders are not searched."""
    root = Path(root)
    if not root.is_dir():
        raise AttnlabError(f"{root}: no such folder; give the folder your runs are in (default ./runs)")
    found = []
    for here, dirs, _ in os.walk(root):
        d = Path(here)
        if is_run(d) and (d / CONFIG).is_file() and (d / WEIGHTS).is_file():
            found.append(d)
            dirs[:] = []  # a run's insides are not runs
        else:
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
    return sorted(found)


def header(path: Path, quantized: dict[str, Any] | None = None) -> tuple[dict[str, str], int]:
    """(metadata, number of parameters) of a safetensors file, from its header alone. With a quantized
    run's section (config.json), a packed layer counts the weights it stands for: int4 codes hold two
    a byte, scales and zeros are not parameters, and a tied head's packed copy is not counted twice."""
    with safe_open(str(path), framework="numpy") as f:  # "pt" would import torch to read a header
        count = sum(_logical(k, math.prod(f.get_slice(k).get_shape()), quantized or {}) for k in f.keys())
        return f.metadata() or {}, count


def _logical(key: str, values: int, quantized: dict[str, Any]) -> int:
    """The parameters tensor `key` (of `values` stored values) holds."""
    layer, _, name = key.rpartition(".")
    kind = (quantized.get("layers") or {}).get(layer)
    if kind in (None, "float32") or name == "bias":
        return values
    if name in ("scales", "zeros") or layer in (quantized.get("tied") or []):
        return 0
    return values * 2 if (kind, name) == ("int4", "codes") else values


def task_of(config: dict[str, Any]) -> str:
    """The task's name as config.json records it (word vectors and the like: their family), read
    without the tasks' registry (runs/kind.py's KINDS), which would import torch."""
    kind = config.get("task", {}).get("kind") or LEGACY_KINDS.get(config.get("family", "gpt"))
    return str(kind or config.get("model", {}).get("head") or config.get("family", "?"))


def model_of(config: dict[str, Any]) -> str:
    """ "gpt 4x128 (gpt-nano)": the family, layers x width where the config has them; the preset it started
    from, a quantized or LoRA run said in the brackets."""
    m = config.get("model", {})
    shape = f"{m['n_layer']}x{m['d_model']}" if "n_layer" in m and "d_model" in m else ""
    notes = [preset_of(config), str(config.get("quantized", {}).get("kind", ""))]
    notes += ["lora"] if config.get("adapter") else []
    said = ", ".join(x for x in notes if x)
    return " ".join(x for x in (str(config.get("family", "?")), shape, f"({said})" if said else "") if x)


def preset_of(config: dict[str, Any], depth: int = 4) -> str:
    """The preset a run started from: its own record, else (runs trained before --init runs recorded it)
    that of the run it was initialized from, if that folder is still there; "" when none says."""
    if config.get("preset") or depth == 0:
        return str(config.get("preset") or "")
    init = config.get("init")
    try:
        return preset_of(read_run_config(Path(init)), depth - 1) if isinstance(init, str) and is_run(Path(init)) else ""
    except (AttnlabError, OSError, ValueError):
        return ""


def summarize(path: str | Path) -> RunSummary:
    """One run's line, read from its files (a damaged file leaves its columns empty, not an error)."""
    p = check_run_dir(path)
    config = read_run_config(p)
    try:
        q = config.get("quantized")  # a damaged section counts what is stored
        meta, parameters = header(p / WEIGHTS, q if isinstance(q, dict) and isinstance(q.get("layers"), dict) else None)
        steps: int | None = int(meta.get("step", 0))
    except (SafetensorError, OSError, ValueError):
        parameters, steps = None, None
    try:
        seconds: float | None = float(header(p / STATE)[0]["elapsed"]) if (p / STATE).is_file() else None
    except (SafetensorError, OSError, ValueError, KeyError):
        seconds = None
    best = min((v for _, v in losses(p, MAX_ROWS)[1] if math.isfinite(v)), default=None)
    return RunSummary(p, task_of(config), model_of(config), parameters, steps, best, seconds)


def list_runs(root: str | Path = "runs") -> list[RunSummary]:
    """Every run under `root`, summarized, sorted by path."""
    return [summarize(p) for p in find_runs(root)]


def duration(seconds: float | None) -> str:
    """90 -> "1m30s", 4000 -> "1h06m"."""
    if seconds is None:
        return "-"
    s = round(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def table(runs: list[RunSummary]) -> str:
    """The runs as aligned columns under a header line."""
    head = ("run", "task", "model", "params", "steps", "best val", "time")
    rows = [head] + [
        (
            str(r.path),
            r.task,
            r.model,
            "-" if r.parameters is None else f"{r.parameters:,}",
            "-" if r.steps is None else f"{r.steps:,}",
            "-" if r.best_val is None else f"{r.best_val:.4f}",
            duration(r.seconds),
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    right = {3, 4, 5, 6}  # numbers line up on their last digit
    lines = [
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def compare_runs(paths: list[str | Path], out: str | Path) -> list[Path]:
    """Draw the training and validation losses of several runs on one picture (.png, .svg or .json);
    returns the runs drawn. A path that is not a run is refused, in one line, before anything is drawn."""
    runs = [check_run_dir(p) for p in paths]
    names = labels(runs)
    curves = {name: read_metrics(p / METRICS, MAX_ROWS) for name, p in zip(names, runs)}
    empty = [str(p) for p, rows in zip(runs, curves.values()) if not any("loss" in r or "val_loss" in r for r in rows)]
    if empty:
        raise AttnlabError(f"{', '.join(empty)}: no losses in {METRICS} to draw (was it trained here?)")
    plot_runs(curves, Path(out))
    return runs


def labels(runs: list[Path]) -> list[str]:
    """Each run's name in the legend: its folder's name, or its path where two names are the same."""
    names = [p.name for p in runs]
    return [p.name if names.count(p.name) == 1 else str(p) for p in runs]
