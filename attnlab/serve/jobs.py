"""A request's sequences in an engine, seen from the web server's event loop: the engine's steps
delivered to the loop, and turned into each choice's text.

Legend: a choice = one sequence generated for a request; a step = one token the engine drew for
it (batching.Step); an update = what every choice gained since the last one.

The engine's thread posts each step to a Mailbox and wakes the loop once at the end of its turn
(a wake-up is a write to the loop's socket: one per turn, not one per step). A Job collects its
choices' steps from its queue; a Choice turns its steps into text with decoding.TextPieces (a
character split over tokens comes whole, the text ends before a stop text, a possible start of
one is held back) and ends at the end-of-text token unless told to ignore it.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import weakref
from collections.abc import AsyncIterator

from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.pieces import TextPieces
from attnlab.decoding.rows import Ask, Row, Step
from attnlab.serve.guard import Limits, StreamLimit


class Choice:
    """One sequence of a request as the API shows it: its text up to a stop, its tokens and logprobs."""

    def __init__(self, index: int, pieces: TextPieces, eot: int | None, logprobs: bool, prefix: str = ""):
        self.index, self.pieces, self.eot, self.logprobs = index, pieces, eot, logprobs
        self.prefix = self.text = prefix  # echo: the prompt first
        self.steps: list[Step] = []
        self.offsets: list[int] = []  # where each token's text starts in self.text
        self.finish: str | None = None
        self.row: Row | None = None

    def take(self, step: Step) -> str:
        """The new text `step` makes (maybe ''); sets finish at a stop text or the end-of-text token."""
        self.steps.append(step)
        self.offsets.append(len(self.text))
        if step.token == self.eot:
            self.finish = "stop"
            return ""
        piece = self.pieces.add(step.token) or ""
        self.text += piece
        if self.pieces.stopped:
            self.finish = "stop"
        return piece

    def end(self) -> str:
        """The engine ended the row: max_tokens drawn ("length"), or its structured value closed
        ("stop"); the text held back (a possible start of a stop text) comes out."""
        closed = self.row is not None and self.row.matcher is not None and self.row.matcher.done
        self.finish = self.finish or ("stop" if closed else "length")
        piece = self.pieces.flush()
        self.text += piece
        return piece


class Job:
    """One request's sequences in an engine, their steps delivered to this event loop."""

    def __init__(self, engine: Engine, streams: StreamLimit, limits: Limits):
        self.engine, self.streams, self.limits = engine, streams, limits
        self.loop = asyncio.get_running_loop()
        self.mailbox = mailbox(self.loop)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []

    def start(
        self, choice: Choice, ids: list[int], draw: Draw, max_tokens: int, logprobs: int | None, matcher=None
    ) -> None:
        """Submit the choice's sequence; `matcher`: its structured output's constraint, or None."""

        def emit(item, i=choice.index):  # called in the engine's thread
            self.mailbox.post(self.queue, (i, item))

        ask = Ask(
            logprobs,
            self.limits.request_timeout,
            on_exit=lambda: self.streams.give(1),
            wake=self.mailbox.wake,
            matcher=matcher,
            speculate=self.limits.speculate,
        )
        choice.row = self.engine.submit(ids, draw, max_tokens, emit, ask)
        self.choices.append(choice)

    def cancel(self) -> None:
        for c in self.choices:
            if c.row is not None:
                c.row.cancel()

    async def updates(self, interval: float = 0.0) -> AsyncIterator[dict[int, tuple[str, list[Step]]]]:
        """{choice: (new text, new steps)} as steps arrive (all that are waiting at once, and no sooner
        than `interval` seconds after the last update), until every choice has finished; a failure is
        raised (TimeoutError past the time limit)."""
        pending = {c.index for c in self.choices}
        by_index = {c.index: c for c in self.choices}
        last = -math.inf
        while pending:
            batch = [await self.queue.get()]
            if (wait := last + interval - self.loop.time()) > 0:
                await asyncio.sleep(wait)
            last = self.loop.time()
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            out: dict[int, tuple[str, list[Step]]] = {}
            for i, item in batch:
                if i not in pending:
                    continue  # steps drawn after a stop, before the engine saw the cancel
                if isinstance(item, Exception):
                    raise item
                c = by_index[i]
                text, steps = out.get(i, ("", []))
                if item is None:
                    text += c.end()
                else:
                    text += c.take(item)
                    steps = [*steps, item]
                out[i] = (text, steps)
                if c.finish is not None:
                    pending.discard(i)
                    c.row.cancel()
            yield out


class Mailbox:
    """Steps from the engine's thread to one event loop's queues: posted as they come, delivered
    when the engine wakes the loop after its turn, so one wake-up (a write to the loop's socket)
    carries every step of the turn rather than one each."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: collections.deque = collections.deque()
        self.scheduled = False

    def post(self, queue: asyncio.Queue, item) -> None:  # any thread
        self.items.append((queue, item))

    def wake(self) -> None:  # any thread
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self.deliver)

    def deliver(self) -> None:  # the loop's thread
        self.scheduled = False  # first: a step posted from now on schedules another delivery
        while self.items:
            queue, item = self.items.popleft()
            queue.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def mailbox(loop: asyncio.AbstractEventLoop) -> Mailbox:
    with _MAILBOXES_LOCK:
        if loop not in _MAILBOXES:
            _MAILBOXES[loop] = Mailbox(loop)
        return _MAILBOXES[loop]
