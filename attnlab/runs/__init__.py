"""Runs: the folder a training writes (marker, config, weights, tokenizer, checkpoints), and a
trained run loaded back (`Run`, `load`) with its kind (`run.task`)."""

from attnlab.runs.kind import KINDS, RunKind, kind_of
from attnlab.runs.run import Run, load

__all__ = ["KINDS", "Run", "RunKind", "kind_of", "load"]
