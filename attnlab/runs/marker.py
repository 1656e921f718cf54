"""The run marker, attnlab.json: it says a folder is an attnlab run and lists every name attnlab
writes there, so that `--force` removes those and nothing else (a user's NOTES.md beside the
weights stays, and is named).

    {"attnlab": "run", "format": 1, "version": "0.1.0", "files": ["attnlab.json", "config.json", ...]}

A writer records a name before it writes the file (`record`), from the main thread: the name listed
and the file not yet there is harmless, a file there and not listed would be left behind. Runs made
before the list existed are read with LEGACY, the names attnlab wrote then.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from attnlab.io import write_json
from attnlab.version import __version__

MARKER = "attnlab.json"
# What attnlab wrote into a run before markers listed it (and what a kill mid-save leaves: .NAME.tmp-PID.SUFFIX).
LEGACY = (
    "attnlab.json",
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "train_state.safetensors",
    "metrics.jsonl",
    "loss.png",
    "eval.json",
    "eval_confusion.png",
    "snapshots",
)


def read_marker(d: Path) -> dict[str, Any] | None:
    """The marker of folder `d`, or None when it has none (or one that is not attnlab's)."""
    try:
        marker = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("attnlab") == "run" else None


def write_marker(d: Path) -> None:
    """A new run's marker, listing only itself: the first file of every run."""
    write_json(d / MARKER, {"attnlab": "run", "format": 1, "version": __version__, "files": [MARKER]})


def record(d: Path, *names: str) -> None:
    """Add names (files or folders directly inside `d`) to the run's list of what attnlab wrote."""
    marker = read_marker(d)
    if marker is None:
        return  # not a run of ours (a bare folder a library user writes into): nothing to keep a list for
    listed = list(marker.get("files", LEGACY))
    new = [n for n in names if n not in listed]
    if new:
        write_json(d / MARKER, {**marker, "files": listed + new})


def owned(d: Path) -> set[str]:
    """The names in `d` that attnlab wrote: those its marker lists, and leftovers of a killed save."""
    marker = read_marker(d)
    listed = set(marker.get("files", LEGACY)) if marker else set(LEGACY)
    return {p.name for p in d.iterdir() if p.name in listed or (p.name.startswith(".") and ".tmp-" in p.name)}


def remove_owned(d: Path) -> list[str]:
    """Remove what attnlab wrote in run folder `d` (the marker last, so a kill halfway leaves a folder
    --force still recognizes); returns the names it left, the user's, sorted."""
    mine = owned(d)
    for name in sorted(mine - {MARKER}):
        p = d / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    (d / MARKER).unlink(missing_ok=True)
    return sorted(p.name for p in d.iterdir())
