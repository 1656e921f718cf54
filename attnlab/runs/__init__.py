"""Runs: the folder a training writes (marker, config, weights, tokenizer, checkpoints), and a
trained run loaded back (`Run`, `load`) with its kind (`run.task`).

`Run` and `load` load on first use (attnlab/lazy.py): `attnlab runs` reads run folders' JSON and
safetensors headers without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.lazy import lazy_names
from attnlab.runs.kind import KINDS, RunKind, kind_of

if TYPE_CHECKING:
    from attnlab.runs.run import Run, load

__getattr__, __dir__ = lazy_names(__name__, {"Run": "attnlab.runs.run", "load": "attnlab.runs.run"})

__all__ = ["KINDS", "Run", "RunKind", "kind_of", "load"]
