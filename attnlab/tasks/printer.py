"""How a task's results read on the command line: a training's last line, a prediction, an evaluation.

The third part of a task (tasks/base.py): the library returns dicts, the command line prints them
with these, so a notebook or the web explorer gets the numbers and `attnlab` the sentences.
"""

from __future__ import annotations

from typing import Any


class Printer:
    """The lines most tasks print; a task overrides what its results hold."""

    def test_line(self, test: dict[str, Any]) -> str:
        """The test scores in one line."""
        return ""

    def next_step(self, out: str) -> str:
        """What to try with the trained run, with the punctuation that leads to it."""
        return "."

    def result_line(self, result: dict[str, Any], out: str) -> str:
        """What `attnlab train` prints when done."""
        if "test" in result:
            n, trained = result["parameters"], result.get("trained_parameters", result["parameters"])
            size = f"{trained:,} of {n:,} parameters trained" if trained < n else f"{n:,} parameters"
            return f"{self.test_line(result['test'])} ({size}, {result['train_seconds']:.0f} s){self.next_step(out)}"
        val = "n/a" if result["val_loss"] is None else f"{result['val_loss']:.4f}"
        return f"done: step {result['step']}, validation loss {val}{self.next_step(out)}"

    def show_prediction(self, result: dict[str, Any]) -> str:
        raise NotImplementedError

    def show_evaluation(self, result: dict[str, Any]) -> str:
        raise NotImplementedError
