"""How requests reach the engine (engine.py): submit() and generate() (any thread), and the line of
sequences submitted and not started yet (Inbox), which the engine takes in order when it has room.
A thread of the engine's own runs its loop once a submit() starts it (the server); until then the
readers of generate() (the command line, run.generate) run its turns themselves whenever they wait
for a step."""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import weakref
from collections.abc import Iterator

import torch

from attnlab.decoding.draw import Draw
from attnlab.decoding.rows import Ask, Emit, Row, Step
from attnlab.nn.hooks import thread_hooks


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


class Requests:
    """The requests' side of Engine (any thread), which inherits it: submit, generate, close."""

    def submit(
        self, ids: list[int], draw: Draw, max_tokens: int, emit: Emit, ask: Ask | None = None, start: bool = True
    ) -> Row:
        """Queue a sequence: `emit` is called from the engine's thread with each Step, then None (or an
        exception: TimeoutError after ask.seconds); `ask`: what else it wants (rows.Ask). The hooks the
        calling thread has set on the model run on the sequence's forward passes. start: run the
        engine's thread if it does not run yet (generate() steps the engine itself instead). Returns
        the row, to cancel."""
        if not ids:
            raise ValueError("generation needs at least one prompt token")
        window = ids[-self.decoder.context :] if self.decoder.batched else ids
        row = Row(window, draw, max_tokens, emit, self.device, ask)
        row.hooks = thread_hooks(self.model)
        row.solo = row.ask.attention or bool(row.hooks)
        if max_tokens <= 0:
            self._finish(row)
            return row
        self.inbox.put(row)
        with self._lock:
            if self._thread is None and start:
                self._thread = threading.Thread(target=self._run, daemon=True, name="attnlab-engine")
                self._thread.start()
                _RUNNING.add(self)
        return row

    def generate(
        self, ids: list[int], draw: Draw, max_tokens: int, logprobs: int | None = None, **ask
    ) -> Iterator[Step]:
        """submit() as an iterator of Steps, for code that may block (the command line, tests). While the
        engine has no thread of its own (no submit() started one), the reader runs the turns itself
        when it waits for a step: on a CPU a second thread computing costs each step a hand-over, and
        its own OpenMP team, whose workers then sleep between operations (a 6 x 384 GPT decoded at 2/3
        the speed in one). Readers in several threads, or several generators read in turn (sample
        --num-samples) share those turns as they share the thread's."""
        steps: queue.SimpleQueue = queue.SimpleQueue()
        row = self.submit(ids, draw, max_tokens, steps.put, Ask(logprobs, **ask), start=False)
        try:
            while (item := self._next(steps)) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            row.cancel()

    def _next(self, steps: queue.SimpleQueue) -> Step | Exception | None:
        """The reader's next item: already there, made by a turn it runs, or waited for from the thread."""
        while True:
            try:
                return steps.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                threaded = self._thread is not None
            if threaded:
                return steps.get()
            self._step_once()

    def _step_once(self) -> None:
        """One turn in the calling thread (another reader's turn first, if it holds them)."""
        with self._turns, torch.inference_mode():
            self.inbox.collect(block=False)
            self._one_turn()

    def close(self, wait: float = 0.0) -> None:
        """Stop the loop after its current turn (waiting up to `wait` seconds for it)."""
        self.closed = True
        self.inbox.put(None)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)


# Engines whose thread runs. At exit each is stopped and waited for: a thread still inside a torch
# operation when the interpreter tears down its threads takes the process down with it (abort).
_RUNNING: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for engine in list(_RUNNING):
        engine.close(wait=5.0)
