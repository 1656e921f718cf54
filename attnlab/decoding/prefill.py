"""Prompts prefilled together, in chunks, between the engine's decode steps (engine.py): a burst of
new requests costs one forward pass per turn instead of one per prompt, and a long prompt no longer
stops the running rows for its whole length.

Legend: P prompts being prefilled, B of them fed this turn, T the longest chunk fed, V vocabulary,
C the model's context.

Each prompt holds a slot of the engine's one key/value table (seats.py) from its first chunk on, and
its keys are written there once. Each turn feeds at most `budget` prompt tokens: the prompts in the
order they came each take what is left of the budget (their whole remaining prompt when it fits), so
an older prompt finishes first. The chunks go through one forward pass over their slots (slots.py),
row b's chunk at its own position and padded on the right to T: the padding's keys land past the
row's length, where no query of the row looks and the row's next chunk writes over them. A prompt
whose last chunk went in leaves with its next-token logits (at its last real token), still in its
slot, where the engine seats it. Those logits and keys are the batch's, not the lone ones: its first
draw stands only where exact.py says the lone logits could not change it (admission.py).

Prefill on a CPU is compute-bound: batching prompts saves the per-pass cost and reads the weights
once, it cannot make 16 prompts cost one (docs/serving.md, "Prefill", has the measurements).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.decoding.draw import Draw
from attnlab.decoding.rows import Row
from attnlab.decoding.seats import Seats
from attnlab.decoding.settings import PREFILL_BUDGET as BUDGET
from attnlab.decoding.slots import Slots


class Prefill:
    """The prompts being prefilled, in the order they came, and the chunked forward pass that feeds them."""

    def __init__(self, seats: Seats, budget: int = BUDGET):
        self.seats, self.slots, self.budget = seats, seats.slots, budget
        self.rows: list[Row] = []  # oldest first
        self.fed: dict[int, int] = {}  # id(row): prompt tokens in its slot so far
        self.start = 0  # the id a bigram model reads before a row's first token (add)

    def add(self, row: Row, start: int) -> None:
        """A prompt takes a free slot; `start` is the id a bigram model reads before a first token."""
        self.seats.hold(row)
        self.start = start
        self.rows.append(row)
        self.fed[id(row)] = 0
        # Only a model that reads the previous token makes table.last (on its first pass, when every row
        # is new and reads `start` anyway): a row that carried one would make the engine's compiled
        # batched step trace again with it (compiled_rows.py).
        if self.slots.table.last is not None:
            self.slots.table.last[row.slot] = start

    def remove(self, row: Row) -> None:
        """The row leaves (done, cancelled or failed); a row not done gives its slot up."""
        self.rows.remove(row)
        del self.fed[id(row)]
        self.seats.release(row)

    def chunks(self) -> list[int]:
        """How many tokens each row takes this turn: the budget spent in slot order (a prefix of the
        rows), every padded position kept inside the context."""
        # A budget set to 0 (no more prefill) still lets the prompts already here finish.
        out, left, longest, highest = [], self.budget if self.budget > 0 else BUDGET, 0, 0
        for row in self.rows:
            fed = self.fed[id(row)]
            n = min(len(row.window) - fed, left)
            longest_next, highest_next = max(longest, n), max(highest, fed)
            if n <= 0 or highest_next + longest_next > self.slots.table.context:
                break
            out.append(n)
            left -= n
            longest, highest = longest_next, highest_next
        return out

    def step(self, decoder) -> list[tuple[Row, Tensor]]:
        """Feed this turn's chunks (one forward pass); returns the rows whose prompt is all in, each
        with its next-token logits (1, V), out of the prefill but still holding their slot (seats.join)."""
        counts = self.chunks()
        if not counts:
            return []
        rows, t = self.rows[: len(counts)], max(counts)
        ids = torch.zeros(len(rows), t, dtype=torch.long)  # (B, T), right-padded with token 0
        for b, (row, n) in enumerate(zip(rows, counts)):
            fed = self.fed[id(row)]
            ids[b, :n] = torch.tensor(row.window[fed : fed + n])
        table, at = self.slots.table, [row.slot for row in rows]
        offsets = table.begin_at(at, t)
        last = torch.tensor([n - 1 for n in counts])  # each row's last real token
        logits = decoder.feed_chunks(self.slots, ids.to(table.device), offsets, last.to(table.device))
        table.end(counts)
        if table.last is not None:  # the rows' newest real tokens, not the padding; rows not fed yet: start
            table.last[at, 0] = ids[torch.arange(len(rows)), last].to(table.device)
            for row in self.rows[len(rows) :]:
                if self.fed[id(row)] == 0:
                    table.last[row.slot] = self.start
        done = []
        for b, (row, n) in enumerate(zip(rows, counts)):
            self.fed[id(row)] += n
            if self.fed[id(row)] == len(row.window):
                done.append((row, logits[b : b + 1]))
        for row, _ in done:  # out of the prefill, its slot still held: the engine seats it
            self.rows.remove(row)
            del self.fed[id(row)]
        return done

    def __len__(self) -> int:
        return len(self.rows)


def prefill_gap(decoder, slots: Slots, lengths: tuple[int, ...] = (3, 17, 9, 30)) -> float:
    """The largest difference between prompts' logits prefilled together, in chunks, and alone, relative
    to 1 + the largest logit: a part of the engine's tolerance (slots: the engine's table, empty; left
    empty)."""
    g = torch.Generator().manual_seed(1)
    seats = Seats(slots)
    prefill = Prefill(seats, budget=16)
    for n in lengths[: slots.table.slots]:
        ids = torch.randint(decoder.vocab, (min(n, decoder.context),), generator=g).tolist()
        prefill.add(Row(ids, Draw(), 1, lambda step: None, decoder.device), decoder.vocab)
    worst = 0.0
    while len(prefill):
        for row, batched in prefill.step(decoder):
            seats.release(row)
            lone, _ = decoder.feed(decoder.start(None), row.window, 0)
            gap = float((batched.float() - lone.float()).abs().max()) / (1 + float(lone.float().abs().max()))
            worst = max(worst, gap)
    slots.table.lengths = [0] * slots.table.slots
    slots.table.last = None
    return worst
