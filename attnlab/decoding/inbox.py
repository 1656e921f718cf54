"""The sequences submitted to the engine (engine.py) and not started yet: any thread puts one in,
the engine's thread takes them out in order, when it has room."""

from __future__ import annotations

import collections
import queue

from attnlab.decoding.rows import Row


class Inbox:
    """Submitted rows in order; None in the queue is close()'s word to stop."""

    def __init__(self):
        self.queue: queue.SimpleQueue[Row | None] = queue.SimpleQueue()
        self.waiting: collections.deque[Row] = collections.deque()

    def put(self, row: Row | None) -> None:
        self.queue.put(row)

    def collect(self, block: bool) -> None:
        """Move what was submitted into the waiting line; with block, wait for one first."""
        while (row := self._take(block)) is not None:
            self.waiting.append(row)
            block = False

    def _take(self, block: bool) -> Row | None:
        try:
            return self.queue.get(block=block)  # None: close()
        except queue.Empty:
            return None

    def next(self) -> Row:
        return self.waiting.popleft()

    def overdue(self, now: float) -> list[Row]:
        """The waiting rows past their deadline, out of the line."""
        late = [row for row in self.waiting if row.overdue(now)]
        for row in late:
            self.waiting.remove(row)
        return late

    def __len__(self) -> int:
        return len(self.waiting)
