"""The one decoding engine: a step loop that continues every sequence of one model, batched.

Legend: B rows in a batched step, V vocabulary, C the model's context.

Every caller decodes through it: `attnlab sample` and run.generate (sampling.stream), the explorer's
/api/generate and captions, and /v1 (serve/). `engine_for(model)` is the model's one Engine. A
request `submit`s a prompt's ids, how to draw (Draw), how many tokens and what else it asks
(rows.Ask), and receives Steps through a callback, then None when done (inbox.py: a thread of the
engine's own runs the loop once a submit() starts it, the server's; until then the readers of
generate(), the command line's, run its turns themselves whenever they wait for a step). Each turn:

1. admits waiting sequences while there are free slots (admission.py: alone, or prefilled together
   in chunks between the running rows' steps, prefill.py);
2. seats the rows decoded together (seats.py) and runs one forward pass over them, each fed its
   newest token at its own position: the batched logits, the weights read once for all rows;
3. draws each row's token with its own generator, and advances: hands it over, retires the rows that
   are done or whose reader went away (`cancel`); a row that outgrows the context jumps ahead as
   stream_rows does (its last C/2 tokens are run again alone, into a fresh state).
Decoded alone instead, in the same turn: a sequence alone in the engine (one request costs what it
costs without one), a row that asks for each step's attention, a row whose caller set hooks on the
model (nn/hooks.py: they run for it here), and every row of an encoder-decoder (adapters.py). A row
alone on its own state that asks for drafts (Ask.speculate) takes speculate.py's step instead: k drafted
tokens checked in one pass, the kept ones handed over in the same turn.

A seeded request gets the tokens it gets alone (stream_rows with one row): refills are run alone,
each row draws from its own generator, and a draw from the batch's logits (a step's, or a batched
prefill's) stands only when exact.py finds that the lone request's logits could not change it;
otherwise the row is replayed: its caches are rebuilt alone from its last refill (its prompt, run
whole), a token at a time as stream_rows feeds them, and the token is drawn from those logits. A row
replayed exact.REPLAYS times finishes alone. The tolerance those checks use is measured before rows are
first batched (`calibrate`: exact.SAFETY times the largest difference between batched and lone logits)
and raised if a replay ever shows a larger one. Should torch's multinomial on the device not be the
draw exact.py reproduces, or the batched step fail on the model, every row is decoded alone: slower,
as exact. How rarely a batched draw is replayed, measured: docs/log.md, "Serving".
"""

from __future__ import annotations

import collections
import threading
import weakref

import torch
from torch import Tensor, nn

from attnlab.decoding.adapters import decoder_for
from attnlab.decoding.admission import Admission
from attnlab.decoding.draw import Draw, jump_keep
from attnlab.decoding.exact import Exactness
from attnlab.decoding.inbox import Inbox, Requests
from attnlab.decoding.prefill import BUDGET, Prefill
from attnlab.decoding.rows import Ask, Row, Step, quietly, step_of
from attnlab.decoding.seats import Seats
from attnlab.decoding.speculate import speculated
from attnlab.nn.hooks import hooks

__all__ = ["Ask", "Draw", "Engine", "Step", "engine_for"]

COUNTERS = (
    "steps",
    "batched rows",
    "replays",
    "solo rows",
    "prefill passes",
    "prefill replays",
    "prefix replays",
    "twins",
    "verify passes",  # speculate.py's: passes over drafts, drafts made and kept, greedy draws in doubt
    "drafted",
    "accepted",
    "speculative replays",
)


class Engine(Requests, Admission, Exactness):
    """The decode loop of one model, shared by every request for it (see the module's docstring)."""

    def __init__(
        self,
        model: nn.Module,
        max_batch: int = 16,
        dtype: str = "auto",
        compiled: bool = False,
        prefill: int = BUDGET,
        prefix_cache_mb: float = 0,
    ):
        self.model, self.max_batch = model, max_batch
        self.decoder = decoder_for(model, dtype, compiled)
        self.device = self.decoder.device
        self.slots = self.decoder.slots(max_batch) if self.decoder.batched else None  # the one key/value table
        self.seats = Seats(self.slots)  # who sits where in it: the rows decoded together (seats.py)
        # Prompts prefilled together into free slots, `prefill` tokens a turn (prefill.py); 0: each alone.
        self.filling = Prefill(self.seats, prefill) if self.decoder.batched else None
        self.prefix = None  # earlier prompts' keys, reused (prefix_cache.py; cache_prefixes)
        self.cache_prefixes(prefix_cache_mb)
        self.rows: list[Row] = []  # every sequence being decoded
        self.inbox = Inbox()  # submitted, not started
        self.tolerance: float | None = None
        self.batched = self.decoder.batched  # False: every row is decoded alone (see _run)
        # Every counter there from the start: /metrics reads them from another thread, and a dict that
        # never changes size can be copied while the loop counts.
        self.stats = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._turns = threading.Lock()  # held for each turn: by the engine's thread, or a reader that steps
        self._prepared = False

    def report(self) -> dict[str, int]:
        """The engine's counters, with the prefix cache's (hits, misses, tokens reused, bytes ...)."""
        prefix = {} if self.prefix is None else {f"prefix {k}": v for k, v in self.prefix.report().items()}
        return {**self.stats, **prefix}

    # ---- the loop (its own thread) ------------------------------------------------------------------

    def _run(self) -> None:
        while not self.closed:
            self.inbox.collect(block=not self.rows and not self.inbox)  # idle: wait for a sequence
            with self._turns, torch.inference_mode():  # no autograd bookkeeping at all
                try:
                    self._one_turn()
                except Exception as e:  # outside any one row's work (admission, the prefix cache): all hear it
                    self._fail_all(e)

    def _fail_all(self, error: Exception) -> None:
        """Fail every sequence in the engine (running, being prefilled, waiting); the loop goes on, so
        that later requests are served and every reader hears why its own ended."""
        filling = [] if self.filling is None else list(self.filling.rows)
        for row in filling:
            self._orphan(row)  # its twins go back to the waiting line, failed below with it
        waiting = list(self.inbox.waiting)
        self.inbox.waiting.clear()
        for row in [*self.rows, *filling, *waiting]:
            self._fail(row, error)

    def _one_turn(self) -> None:
        """Admit, then step every row; batching is prepared when a second row could share the steps."""
        if not self._prepared and self._crowded():
            self._prepare()
        self._admit()
        if self.rows:
            self._turn()

    def _crowded(self) -> bool:
        """Whether two sequences that could be decoded together are in the engine (running or waiting)."""
        waiting = [*self.rows, *self.inbox.waiting]
        return self.batched and sum(not row.solo and not row.cancelled for row in waiting) > 1

    def _alone(self, row: Row, ids: list[int], offset: int) -> None:
        """The row's next logits (and, asked, where it looked) from `ids` fed at `offset` on its own state,
        with its caller's hooks."""
        with hooks(self.model, row.hooks):
            row.exact, row.seen = self.decoder.feed(row.state, ids, offset, row.ask.attention, bool(row.hooks))

    def _turn(self) -> None:
        """One step for every row: logits, draws, hand-over, retirements; then the readers' wake-ups."""
        wakes = {row.ask.wake for row in self.rows if row.ask.wake is not None}
        try:
            self._greet()
            self._step()
        except Exception as e:  # a bug: the rows of this turn hear it, the loop goes on
            for row in list(self.rows):
                self._fail(row, e)
        finally:
            for wake in wakes:
                quietly(wake)

    def _greet(self) -> None:
        """Hand over at once the tokens drawn from logits the rows already have (a prompt admitted this
        turn, a refill): a new request's first token need not wait for the running rows' step, which
        it then joins in the same turn."""
        greeted = set()
        for row in [row for row in self.rows if row.exact is not None]:
            try:
                self._advance(row, *self._draw_exact(row))
            except Exception as e:  # as in _step: NaN logits, a reader that cannot take the token
                self._fail(row, e)
            if row.ask.wake is not None:
                greeted.add(row.ask.wake)
        for wake in greeted:
            quietly(wake)

    def _step(self) -> None:
        """Seat the rows decoded together, their batched logits (the others' alone), draw, advance."""
        lone = len(self.rows) == 1 or not (self.batched and self._prepared)
        for row in self.rows:
            if row.exact is None and row.slot is None and (row.approx or not (row.solo or lone)):
                self.seats.enter(row)  # reused keys (a prefix's) are checked there, as every batched row's
                row.approx = False
        try:
            batched = self._batched_logits() if self.slotted else None
        except Exception as e:  # the batched pass failed: every row hears it
            for row in list(self.rows):
                self._fail(row, e)
            return
        for row in list(self.rows):  # a copy: a speculating row may finish (and leave) in its turn
            try:
                if row in self.rows and row.exact is None and row.slot is None and not speculated(self, row):
                    self._alone(row, row.window[-1:], len(row.window) - 1)  # alone: its own state
            except Exception as e:  # this row's pass failed: it hears it, the others go on
                self._fail(row, e)
        picks = self._draw_batched(batched) if batched is not None else {}
        for row in list(self.rows):
            try:
                token, logits = picks.get(id(row)) or self._draw_exact(row)
                self._advance(row, token, logits)
            except Exception as e:  # e.g. NaN logits, or a reader that cannot take the token
                self._fail(row, e)

    @property
    def slotted(self) -> list[Row]:
        """The rows decoded together, by slot."""
        return self.seats.rows

    def _batched_logits(self) -> Tensor:
        """(B, V) logits of the slotted rows' newest tokens, one forward pass."""
        logits = self.seats.logits(self.decoder)
        self.stats["steps"] += 1
        self.stats["batched rows"] += len(self.slotted)
        return logits

    def _advance(self, row: Row, token: int, logits: Tensor | None) -> None:
        """Hand the token over; retire the row when done (its length drawn, or its structured value
        closed), refill it when it outgrows the context."""
        if row.cancelled:
            self._retire(row)
            return
        if row.matcher is not None:  # before the reader hears of the token: one outside the mask fails the row
            row.matcher.advance(token)
        row.emit(step_of(token, logits, row.ask.logprobs, row.seen))
        row.window.append(token)
        row.left -= 1
        if row.left <= 0 or (row.matcher is not None and row.matcher.done):
            self._finish(row)
        elif self.decoder.outgrown(len(row.window)):  # jump ahead as stream_rows does: its last C/2 tokens, alone
            self.seats.leave(row)
            keep = jump_keep(self.decoder.context)
            row.window, row.base = row.window[-keep:], keep
            row.state = self.decoder.start(row.ask.source)
            self._alone(row, row.window, 0)


# Every model's engine, by its precision: what every caller decodes through (see the module's docstring).
_ENGINES: weakref.WeakKeyDictionary[nn.Module, dict[str, Engine]] = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


def engine_for(
    model: nn.Module,
    dtype: str = "auto",
    max_batch: int | None = None,
    compiled: bool = False,
    prefill: int | None = None,
    prefix_cache_mb: float | None = None,
) -> Engine:
    """The model's engine (made on first use). max_batch: the rows one pass decodes (default 16); an
    idle engine of another size is replaced. compiled: a lone row's steps compiled
    (compiled.py); an engine of its own. prefill: the prompt tokens it prefills together a turn
    (prefill.py; 0: each prompt alone), from its next turn on. prefix_cache_mb: the memory it keeps
    earlier prompts' keys in (prefix_cache.py; 0: none)."""
    with _ENGINES_LOCK:
        engines = _ENGINES.setdefault(model, {})
        key = f"{dtype}|compiled" if compiled else dtype
        engine = engines.get(key)
        stale = engine is None or engine.closed
        if not stale and max_batch is not None and max_batch != engine.max_batch and not engine.rows:
            engine.close()
            stale = True
        if stale:
            engine = engines[key] = Engine(model, max_batch or 16, dtype, compiled)
        if prefill is not None and engine.filling is not None:
            engine.filling.budget = prefill
        if prefix_cache_mb is not None:
            engine.cache_prefixes(prefix_cache_mb)
        return engine
