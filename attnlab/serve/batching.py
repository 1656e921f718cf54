"""Batching concurrent generations: one forward pass per step over every sequence being decoded.

Legend: B rows in a batched step, V vocabulary, C the model's context.

A Batcher serves one GPT. Requests `submit` a prompt's ids, how to draw (exact.Draw: temperature,
top-k, top-p, seed) and how many tokens, and receive Steps (token, and its log-probability with
the top alternatives when asked) through a callback, then None when done. A thread of the
batcher's own runs the decode loop; each turn of it:

1. admits waiting sequences while there are free slots (`max_batch`): each prompt is run alone,
   exactly as stream_rows runs it, giving the first token's logits and the caches that go into a
   slot (serve/slots.py);
2. runs one forward pass over every sequence in a slot, each fed its newest token at its own
   position: the one pass that makes batching pay, since the weights are read once for all rows;
3. draws each row's token with its own generator, hands it over, and retires the rows that are
   done or whose reader went away (`cancel`); a row that outgrows the context jumps ahead as
   stream_rows does (its last C/2 tokens are run again alone, into fresh caches).
A sequence alone in the batcher, and never slotted, is decoded alone: one request costs what it
costs without a batcher.

A seeded request gets the tokens it gets alone (stream_rows with one row, i.e. `attnlab sample`):
prompts and refills are run alone, each row draws from its own generator, and a draw from the
batch's logits stands only when exact.py finds that the lone request's logits could not change
it; otherwise the row is replayed: its caches are rebuilt alone from its last refill, one token at
a time as stream_rows feeds them, and the token is drawn from those logits. A row replayed
REPLAYS times finishes alone. The tolerance those checks use is measured when the thread starts
(`calibrate`: SAFETY times the largest difference between batched and lone logits) and raised if a
replay ever shows a larger one. Should torch's multinomial on the device not be the draw exact.py
reproduces, or the batched step fail on the model, every row is decoded alone: slower, as exact.

Measured (tests/test_serve_batching.py, benchmarks/serve_load.py): the batched logits differ from
the lone ones by about 1e-6 of their size (float32 on a CPU); of the benchmark's runs' batched
draws (greedy, temperature, top-k with top-p) 0 to 5 in 10,000 were replayed; the tokens were the
lone ones in every request checked.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.decoding.sampling import jump_keep, next_tokens
from attnlab.models.gpt import GPT
from attnlab.nn.attention import KVCache
from attnlab.runtime.device import autocast, pick_dtype
from attnlab.serve.exact import Draw, certain_draws, multinomial_is_a_race
from attnlab.serve.slots import Slots

REPLAYS = 2  # a row in doubt this often finishes alone
SAFETY = 32.0  # the tolerance is this many times the largest difference measured
FLOOR = 1e-6  # and never below this (relative to 1 + the largest logit)

__all__ = ["Batcher", "Draw", "Step"]


@dataclass
class Step:
    """A drawn token; with logprobs asked, its log-probability under the model (before temperature
    and filtering) and the `top` most likely tokens' [(id, log-probability)]."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


Emit = Callable[[Step | Exception | None], None]


class Row:
    """One sequence being decoded: its window of tokens (as stream_rows keeps it), how it draws, and
    where its keys/values are (a slot, or caches of its own)."""

    def __init__(self, ids: list[int], draw: Draw, max_tokens: int, logprobs: int | None, emit: Emit, device):
        self.deadline: float | None = None  # time.monotonic() past which the row fails (TimeoutError)
        self.on_exit: Callable[[], None] | None = None  # called once when the row leaves the batcher
        self.wake: Callable[[], None] | None = None  # called after each turn's emits (see submit)
        self.window = list(ids)
        self.base = len(ids)  # tokens run at once at the last (re)fill: a replay starts there
        self.draw, self.left, self.logprobs, self.emit = draw, max_tokens, logprobs, emit
        self.generator = torch.Generator(device=device).manual_seed(draw.seed)
        self.exact: Tensor | None = None  # (1, V) the next token's logits, computed as alone
        self.caches: list[KVCache] | None = None  # its own, while it is not in a slot
        self.slot: int | None = None
        self.replays = 0
        self.solo = False  # decoded alone to the end
        self.cancelled = False

    def cancel(self) -> None:
        """The reader is gone (or has what it needs): the batcher drops the row at its next step."""
        self.cancelled = True


class Batcher:
    """The decode loop of one GPT, shared by every request for it (see the module's docstring)."""

    def __init__(self, model: GPT, max_batch: int = 16, dtype: str = "auto"):
        self.model = model.eval()
        self.ctx = model.cfg.context
        self.device = next(model.parameters()).device
        self.precision = pick_dtype(dtype, self.device, model.cfg.d_model)
        self.max_batch = max_batch
        self.slots = Slots(len(model.blocks), max_batch, self.ctx, self.device)
        self.slotted: list[Row] = []  # by slot
        self.rows: list[Row] = []  # every sequence being decoded
        self.waiting: collections.deque[Row] = collections.deque()
        self.inbox: queue.SimpleQueue[Row | None] = queue.SimpleQueue()
        self.tolerance: float | None = None
        self.batched = True  # False: every row is decoded alone (see _run)
        self.stats = collections.Counter()  # steps, batched rows, replays, solo rows
        self.closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- the requests' side (any thread) ----------------------------------------------------------

    def submit(
        self,
        ids: list[int],
        draw: Draw,
        max_tokens: int,
        emit: Emit,
        logprobs: int | None = None,
        seconds: float | None = None,
        on_exit: Callable[[], None] | None = None,
        wake: Callable[[], None] | None = None,
    ) -> Row:
        """Queue a sequence: `emit` is called from the batcher's thread with each Step, then None (or
        an exception: TimeoutError after `seconds`). on_exit() runs once when it leaves, however it
        ends; wake() once after each turn in which it emitted (rows sharing a wake: once for all of
        them), so that a reader can collect a turn's steps in one go. Returns the row, to cancel."""
        if not ids:
            raise ValueError("generation needs at least one prompt token")
        row = Row(ids[-self.ctx :], draw, max_tokens, logprobs, emit, self.device)
        row.deadline = None if seconds is None else time.monotonic() + seconds
        row.on_exit, row.wake = on_exit, wake
        if max_tokens <= 0:
            self._retire(row)
            emit(None)
            if wake is not None:
                wake()
            return row
        self.inbox.put(row)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="attnlab-batcher")
                self._thread.start()
                _RUNNING.add(self)
        return row

    def generate(self, ids: list[int], draw: Draw, max_tokens: int, logprobs: int | None = None) -> Iterator[Step]:
        """submit() as an iterator of Steps, for code that may block (tests, scripts)."""
        steps: queue.Queue = queue.Queue()
        row = self.submit(ids, draw, max_tokens, steps.put, logprobs)
        try:
            while (item := steps.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            row.cancel()

    def close(self, wait: float = 0.0) -> None:
        """Stop the loop after its current turn (waiting up to `wait` seconds for it)."""
        self.closed = True
        self.inbox.put(None)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)

    # ---- the loop (its own thread) ------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():  # per thread; no autograd bookkeeping at all
            try:
                self.batched = multinomial_is_a_race(self.device)
                self.tolerance = self.calibrate()
            except Exception as e:  # a model the batched step cannot run: decode every row alone, exactly
                warnings.warn(f"attnlab serve: batching is off for this model ({type(e).__name__}: {e})", stacklevel=1)
                self.batched, self.tolerance = False, FLOOR
            while not self.closed:
                self._admit()
                if not self.rows:
                    continue
                try:
                    self._turn()
                except Exception as e:  # a bug: the rows of this turn hear it, the loop goes on
                    for row in list(self.rows):
                        self._fail(row, e)

    def _admit(self) -> None:
        """Take new sequences from the inbox (waiting for one when idle); start those that fit."""
        block = not self.rows and not self.waiting
        while True:
            try:
                row = self.inbox.get(block=block)
            except queue.Empty:
                break
            if row is None:  # close()
                return
            self.waiting.append(row)
            block = False
        self._expire()
        while self.waiting and len(self.rows) < self.max_batch:
            row = self.waiting.popleft()
            if row.cancelled:
                self._retire(row)
                continue
            try:
                row.caches = self.model.new_caches(self.ctx)
                row.exact = self._alone(row.caches, row.window, 0)  # the prompt, as stream_rows runs it
            except Exception as e:  # e.g. out of memory: this request fails, the others go on
                self._fail(row, e)
                continue
            self.rows.append(row)

    def _forward(self, ids: Tensor, caches: list[KVCache], offset: int | Tensor) -> Tensor:
        """(B, V) next-token logits, in the precision stream_rows picks (autocast around the model only)."""
        with autocast(self.device, self.precision):
            return self.model(ids, caches=caches, offset=offset)[:, -1]

    def _alone(self, caches: list[KVCache], ids: list[int], offset: int) -> Tensor:
        """(1, V) next-token logits of `ids` fed at `offset`, as stream_rows computes them for one row."""
        return self._forward(torch.tensor([ids], device=self.device), caches, offset)  # ids (1, T)

    def _fail(self, row: Row, error: Exception) -> None:
        """Drop the row and tell its reader (if it still listens): dropped first, so that a reader who
        hears of the end finds its stream freed."""
        self._retire(row)
        try:
            row.emit(error)
            if row.wake is not None:
                row.wake()
        except Exception:  # e.g. its event loop has closed: nobody to tell
            pass

    def _turn(self) -> None:
        """One step for every row: logits, draws, hand-over, retirements; then the readers' wake-ups."""
        wakes = {row.wake for row in self.rows if row.wake is not None}
        try:
            self._step()
        finally:
            for wake in wakes:
                try:
                    wake()
                except Exception:  # a reader whose loop has closed
                    pass

    def _step(self) -> None:
        lone = len(self.rows) == 1 or not self.batched
        for row in self.rows:
            if row.exact is None and row.slot is None and not (row.solo or lone):
                self._enter(row)
        batched: Tensor | None = None
        try:
            if self.slotted:
                batched = self._batched_logits()
            for row in self.rows:
                if row.exact is None and row.slot is None:  # alone: its own caches
                    row.exact = self._alone(row.caches, row.window[-1:], len(row.window) - 1)
        except Exception as e:  # the whole step failed: every row hears it
            for row in list(self.rows):
                self._fail(row, e)
            return
        picks = self._draw_batched(batched) if batched is not None else {}
        for row in list(self.rows):
            try:
                token, logits = picks.get(id(row)) or self._draw_exact(row)
                self._advance(row, token, logits)
            except Exception as e:  # e.g. NaN logits, or a reader that cannot take the token
                self._fail(row, e)

    def _batched_logits(self) -> Tensor:
        """(B, V) logits of the slotted rows' newest tokens, one forward pass."""
        ids = torch.tensor([[row.window[-1]] for row in self.slotted], device=self.device)  # (B, 1)
        offsets = self.slots.table.begin(len(self.slotted))  # (B,) each row's position
        logits = self._forward(ids, self.slots.caches, offsets)
        self.slots.table.end()
        self.stats["steps"] += 1
        self.stats["batched rows"] += len(self.slotted)
        return logits

    def _draw_batched(self, logits: Tensor) -> dict[int, tuple[int, Tensor]]:
        """{id(row): (token, its logits)} for the slotted rows whose draw is sure; the others get their
        exact logits (a replay), drawn in _draw_exact."""
        live = [row for row in self.slotted if not row.cancelled]
        index = {id(row): i for i, row in enumerate(self.slotted)}  # before a replay moves any slot
        z = logits[[index[id(row)] for row in live]]  # (b, V)
        picks = certain_draws(z, [row.draw for row in live], [row.generator for row in live], self.tolerance)
        out = {}
        for i, (row, token) in enumerate(zip(live, picks)):
            if token is not None:
                out[id(row)] = (token, z[i : i + 1])
            else:
                self._replay(row, z[i : i + 1])
        return out

    def _draw_exact(self, row: Row) -> tuple[int, Tensor]:
        """The row's token from logits computed as alone, with next_tokens itself."""
        logits, row.exact = row.exact, None
        if logits is None:  # cancelled before its draw: nothing to draw
            return -1, logits
        d = row.draw
        return int(next_tokens(logits, d.temperature, d.top_k, d.top_p, row.generator)[0]), logits

    def _replay(self, row: Row, batched: Tensor) -> None:
        """Rebuild the row's caches alone, as stream_rows fed them since its last refill: its prompt (or
        refill) at once, then one token at a time; its next logits are then exactly the lone ones."""
        caches = self.model.new_caches(self.ctx)
        logits = self._alone(caches, row.window[: row.base], 0)
        for j in range(row.base, len(row.window)):
            logits = self._alone(caches, row.window[j : j + 1], j)
        row.exact = logits
        seen = float((batched.float() - logits.float()).abs().max()) / (1 + float(logits.float().abs().max()))
        self.tolerance = max(self.tolerance, SAFETY * seen)  # a larger difference than calibrated: widen
        row.replays += 1
        self.stats["replays"] += 1
        if row.replays >= REPLAYS:  # in doubt too often: finish alone, from these exact caches
            self._leave(row)
            row.caches, row.solo = caches, True
            self.stats["solo rows"] += 1
        else:  # exact caches from here on
            self.slots.put(row.slot, caches)

    def _advance(self, row: Row, token: int, logits: Tensor | None) -> None:
        """Hand the token over; retire the row when done, refill it when it outgrows the context."""
        if row.cancelled:
            self._retire(row)
            return
        row.emit(step_of(token, logits, row.logprobs))
        row.window.append(token)
        row.left -= 1
        if row.left <= 0:
            self._retire(row)
            row.emit(None)
        elif len(row.window) > self.ctx:  # jump ahead as stream_rows does: its last C/2 tokens, alone
            self._leave(row)
            keep = jump_keep(self.ctx)
            row.window, row.base = row.window[-keep:], keep
            row.caches = self.model.new_caches(self.ctx)
            row.exact = self._alone(row.caches, row.window, 0)

    # ---- slots ------------------------------------------------------------------------------------------

    def _enter(self, row: Row) -> None:
        row.slot = len(self.slotted)
        self.slots.put(row.slot, row.caches)
        self.slotted.append(row)
        row.caches = None

    def _leave(self, row: Row) -> None:
        if row.slot is None:
            return
        last = self.slotted.pop()
        if last is not row:  # the last row fills the hole, so the rows stay slots 0..B-1
            self.slots.move(last.slot, row.slot)
            last.slot = row.slot
            self.slotted[row.slot] = last
        row.slot = None

    def _retire(self, row: Row) -> None:
        self._leave(row)
        if row in self.rows:
            self.rows.remove(row)
        row.caches = row.exact = None
        if row.on_exit is not None:
            exit_, row.on_exit = row.on_exit, None
            exit_()

    def _expire(self) -> None:
        """Fail the rows (running or waiting) past their deadline."""
        now = time.monotonic()
        for row in [*self.rows, *self.waiting]:
            if row.deadline is not None and now > row.deadline and not row.cancelled:
                if row in self.waiting:
                    self.waiting.remove(row)
                self._fail(row, TimeoutError("the generation ran past its time limit"))

    # ---- the tolerance --------------------------------------------------------------------------------

    def calibrate(self, rows: int = 4, steps: int = 6) -> float:
        """SAFETY x the largest difference between a batched step's logits and the same rows' lone
        ones (relative to 1 + the largest logit), over `steps` steps of `rows` random sequences."""
        rows, steps = min(rows, self.max_batch), min(steps, self.ctx - 2)
        if steps < 1:
            return FLOOR
        g = torch.Generator().manual_seed(0)
        vocab = self.model.cfg.vocab_size
        lengths = [1 + (7 * i) % max(1, self.ctx - steps - 1) for i in range(rows)]
        alone = []
        for slot, n in enumerate(lengths):
            caches = self.model.new_caches(self.ctx)
            self._alone(caches, torch.randint(vocab, (n,), generator=g).tolist(), 0)
            self.slots.put(slot, caches)
            alone.append(caches)
        worst = 0.0
        for _ in range(steps):
            ids = torch.randint(vocab, (rows, 1), generator=g)
            offsets = self.slots.table.begin(rows)
            batched = self._forward(ids.to(self.device), self.slots.caches, offsets).float()
            self.slots.table.end()
            for b, caches in enumerate(alone):
                lone = self._alone(caches, ids[b].tolist(), caches[0].length).float()
                worst = max(worst, float((batched[b] - lone[0]).abs().max()) / (1 + float(lone.abs().max())))
        self.slots.table.lengths = [0] * self.max_batch
        self.slots.table.last = None
        return max(SAFETY * worst, FLOOR)


def step_of(token: int, logits: Tensor, logprobs: int | None) -> Step:
    """The Step of a token drawn from (1, V) logits, with log-probabilities when asked."""
    if logprobs is None:
        return Step(token)
    lp = torch.log_softmax(logits[0].float(), dim=-1)  # (V,) the model's own distribution
    top = lp.topk(min(logprobs, lp.shape[-1])) if logprobs else None
    alternatives = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))
    return Step(token, float(lp[token]), alternatives)


# Batchers whose thread runs. At exit each is stopped and waited for: a thread still inside a torch
# operation when the interpreter tears down its threads takes the process down with it (abort).
_RUNNING: weakref.WeakSet[Batcher] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for batcher in list(_RUNNING):
        batcher.close(wait=5.0)
