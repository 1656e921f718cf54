"""Training seen from a notebook: the loss curve drawn in the cell and redrawn in place as it learns.

When `attnlab.train(...)` runs inside a Jupyter kernel, the loop opens a LiveLoss beside the
trackers (tracking.py): it receives the same rows as metrics.jsonl and keeps one picture in the
cell's output, updated through its display handle (an `update_display_data` message), never a new
picture per step. Outside a kernel (a terminal, a script, IPython's terminal shell) nothing is shown.
The progress bar is attnlab.progress's (loop.py): a widget where ipywidgets is installed, text otherwise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from attnlab.io import read_metrics
from attnlab.viz.curves import loss_png

# Redrawn at most every EVERY seconds, and less often if drawing costs more than SHARE of that time
# (the first drawing imports matplotlib): at most that share of the run.
EVERY, SHARE = 2.0, 0.05


def in_notebook() -> bool:
    """A Jupyter kernel runs this process: IPython's shell is the kernel's ZMQInteractiveShell.
    Neither is imported here: a kernel has loaded both already, and without one there is nothing to show."""
    ipython, zmq = sys.modules.get("IPython"), sys.modules.get("ipykernel.zmqshell")
    if ipython is None or zmq is None:
        return False
    return isinstance(ipython.get_ipython(), zmq.ZMQInteractiveShell)


class LiveLoss:
    """The run's loss curve in the cell (train every step, validation points), one display updated in place."""

    files: tuple[str, ...] = ()  # writes nothing into the run

    def open(self, run: Path, config: dict[str, Any], start: int) -> None:
        self.rows = read_metrics(run / "metrics.jsonl", max_rows=2000)  # a resumed run's curve so far
        train = config.get("train", {})
        self.max_steps = None if train.get("time_budget") else train.get("max_steps")  # a budget's is a far bound
        self.handle: Any = None  # the display, made with the first picture
        self.next_draw = 0.0
        self.step = start

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.rows.append({"step": step, **metrics})
        self.step = step
        if time.monotonic() >= self.next_draw:
            self.draw()

    def close(self) -> None:
        if self.rows:
            self.draw()  # the last steps, whatever the throttle said

    def draw(self) -> None:
        from IPython.display import Image, display  # IPython: present in the Jupyter kernel that asked for this

        t0 = time.monotonic()
        of = f" of {self.max_steps}" if self.max_steps else ""
        last = next((r["loss"] for r in reversed(self.rows) if "loss" in r), None)
        title = f"step {self.step}{of}" + ("" if last is None else f"   train loss {last:.4f}")
        picture = Image(data=loss_png(self.rows, title), format="png")
        if self.handle is None:
            self.handle = display(picture, display_id=True)
        else:
            self.handle.update(picture)
        now = time.monotonic()
        self.next_draw = now + max(EVERY, (now - t0) / SHARE)
