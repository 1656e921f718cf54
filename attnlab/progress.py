"""The progress bar every long job shows: tqdm's notebook widget where Jupyter can draw one, its text
bar on a terminal, and plain lines everywhere else.

tqdm.auto picks the widget whenever it runs in a notebook kernel, and without ipywidgets installed it
then warns ("IProgress not found") in the learner's first cell before falling back to text. Asking
first whether ipywidgets is there keeps the fallback and drops the warning; installing ipywidgets
(`pip install ipywidgets`) brings the widget back.

A text bar redraws itself with carriage returns, ten times a second. Written to a file (`nohup ... >
log`, CI) that is thousands of updates on one "line" of the log: unreadable, and megabytes for a long
run. Where the stream is not a terminal (nor a notebook's output, which draws carriage returns as a
terminal does), the bar writes one plain line instead, ending in a newline, at most every EVERY seconds
or each tenth of the total, with the count, total, rate and time left, and one where it ends:

    training: 1200/6000 step (20%) | 1:40 elapsed, 12.0 step/s, 6:40 left | loss=2.113, tok/s=24,576
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm as _bar
else:
    from tqdm.std import tqdm as _bar

__all__ = ["EVERY", "LINE", "tqdm"]

EVERY = 30.0  # seconds between two progress lines where the stream is not a terminal
# The form of those lines (a reader of a log, or a test of a command's one-line error, sets them apart).
LINE = re.compile(r"^(?!attnlab: )(?:.*: )?[\d.,]+[kMGTPEZY]?(?:/[\d.,]+[kMGTPEZY]?)? .*\| (?:\d+:)?\d\d:\d\d elapsed")


def _terminal_like(stream) -> bool:
    """A terminal, or a notebook kernel's output stream (Jupyter draws a carriage return as one)."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class tqdm(_bar):  # noqa: N801 (tqdm's own name, which the callers import)
    """tqdm's bar (the widget in a notebook with ipywidgets, text on a terminal or in a notebook without
    them); one plain line at a time elsewhere (see the module's docstring)."""

    def __init__(self, *args, **kwargs):
        stream = kwargs.get("file") or sys.stderr
        self._lines = stream is not None and not _terminal_like(stream)
        self._line_at = time.monotonic()  # when the last line was written (or the bar began)
        self._tenth = 0  # the tenths of the total the last line had reached
        self._said = self._closing = False
        self._said_n = None  # the count the last line showed
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None, **kwargs):  # (tqdm's notebook widget takes more keywords)
        if not self._lines:
            return super().display(msg, pos, **kwargs)
        if msg is not None:  # a clear: a written line stays
            return False
        n, total, now = self.n, self.total, time.monotonic()
        tenth = int(10 * n / total) if total else 0
        due = now - self._line_at >= EVERY or tenth > self._tenth
        if not self._closing and (n == 0 or not due):  # nothing done yet, or said a moment ago
            return False
        if self._closing and n == self._said_n:  # the last line already says where it ended
            return True
        self._line_at, self._tenth, self._said, self._said_n = now, tenth, True, n
        self.fp.write(self.line() + "\n")
        getattr(self.fp, "flush", lambda: None)()
        return True

    def line(self) -> str:
        """The bar's state as one line: desc: count/total unit (share) | elapsed, rate, time left | postfix."""
        d = self.format_dict
        n, total, unit, elapsed = d["n"], d["total"], d["unit"], d["elapsed"]
        rate = d["rate"] if d["rate"] is not None else (n / elapsed if elapsed else None)

        def number(x: float) -> str:  # 68.1k B where the bar counts bytes (unit_scale), else 1200
            if d.get("unit_scale"):
                return self.format_sizeof(x, divisor=d.get("unit_divisor") or 1000)
            return f"{x:.0f}" if isinstance(x, float) else f"{x}"

        parts = [f"{number(n)}/{number(total)} {unit} ({100 * n / total:.0f}%)" if total else f"{number(n)} {unit}"]
        times = [f"{self.format_interval(elapsed)} elapsed"]
        if rate and unit != "s":  # a bar of seconds (a time budget): its rate says nothing
            speed = number(rate) if d.get("unit_scale") else f"{rate:,.1f}"
            times.append(f"{speed} {unit}/s" if rate >= 1 else f"{1 / rate:,.1f} s/{unit}")
        if rate and total and n < total:
            times.append(f"{self.format_interval((total - n) / rate)} left")
        parts.append(", ".join(times))
        if d.get("postfix"):
            parts.append(d["postfix"])
        desc = d.get("prefix") or ""
        return (f"{desc}: " if desc else "") + " | ".join(parts)

    def close(self):
        if not self._lines or self.disable:
            return super().close()
        # The last line, where the job ended: for a passing bar (leave=False) too, which a terminal
        # wipes but a log keeps as the record that the phase ran and how long it took.
        self._closing = True
        try:
            if self.n or self._said:
                self.display()
        finally:
            self._closing = False
            self.disable = True
            self._decr_instances(self)

    def clear(self, nolock=False):
        if not self._lines:
            super().clear(nolock)

    def moveto(self, n):
        if not self._lines:
            super().moveto(n)
