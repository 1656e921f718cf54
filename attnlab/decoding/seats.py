"""Who sits in which slot of the engine's one key/value table (slots.py, engine.py): the rows decoded
together, one forward pass a step, and the prompts being prefilled (prefill.py).

Legend: B seated rows, V vocabulary.

The seated rows are always slots 0..B-1: a row that leaves gives its slot to the last one, whose keys
and values move with it. A prompt being prefilled holds a slot past them (the lowest free one) and
its chunks are written there; when its last chunk is in, it joins the seated rows at slot B where it
is (a prompt held at B, the common case when prompts finish in the order they came, moves nothing;
another changes places with the one at B). A row that is neither keeps its caches itself (Row.state).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.decoding.rows import Row
from attnlab.decoding.slots import Slots


class Seats:
    """Which row sits in which slot, and the step that decodes the seated ones."""

    def __init__(self, slots: Slots):
        self.slots = slots
        self.rows: list[Row] = []  # seated, by slot
        self.held: dict[int, Row] = {}  # slot: the prompt being prefilled there

    def hold(self, row: Row) -> None:
        """A prompt to prefill takes the lowest free slot past the seated rows, empty."""
        row.slot = self._free()
        self.held[row.slot] = row
        self.slots.table.lengths[row.slot] = 0

    def release(self, row: Row) -> None:
        """A prompt being prefilled gives its slot up (cancelled, failed, or to be run alone)."""
        if self.held.get(row.slot) is row:
            del self.held[row.slot]
            row.slot = None

    def enter(self, row: Row) -> None:
        """The row's own caches move into the next free slot."""
        row.slot = self._vacate(len(self.rows))
        self.slots.put(row.slot, row.state)
        self.rows.append(row)
        row.state = None

    def join(self, row: Row) -> None:
        """A prompt prefilled in its held slot is seated: its keys stay, or change places with slot B's."""
        here, seat = row.slot, len(self.rows)
        del self.held[here]
        if here != seat:
            if (other := self.held.pop(seat, None)) is not None:
                self.slots.swap(here, seat)
                other.slot, self.held[here] = here, other
            else:
                self.slots.move(here, seat)
        row.slot = seat
        self.rows.append(row)

    def copy(self, twin: Row, row: Row) -> None:
        """The twin is seated with a copy of the seated row's keys (the same prompt)."""
        twin.slot = self._vacate(len(self.rows))
        self.slots.move(row.slot, twin.slot)
        self.rows.append(twin)

    def reseat(self, row: Row) -> None:
        """The row's caches, rebuilt alone (a replay), replace those of its slot."""
        self.slots.put(row.slot, row.state)
        row.state = None

    def leave(self, row: Row) -> None:
        """The row gives up its slot (its caches stay behind: it is refilled or decoded alone after)."""
        if row.slot is None or self.held.get(row.slot) is row:
            self.release(row)
            return
        last = self.rows.pop()
        if last is not row:  # the last row fills the hole, so the rows stay slots 0..B-1
            self.slots.move(last.slot, row.slot)
            last.slot = row.slot
            self.rows[row.slot] = last
        row.slot = None

    def logits(self, decoder) -> Tensor:
        """(B, V) logits of every seated row's newest token, each at its own position: one forward pass."""
        device = self.slots.table.device
        ids = torch.tensor([[row.window[-1]] for row in self.rows], device=device)  # (B, 1)
        offsets = self.slots.table.begin(len(self.rows))  # (B,) each row's position
        logits = decoder.feed_slots(self.slots, ids, offsets)
        self.slots.table.end()
        return logits

    def _free(self, past: int = 0) -> int:
        """The lowest slot no row sits in or holds, from `past` on (past the seated rows)."""
        slot = max(past, len(self.rows))
        while slot in self.held:
            slot += 1
        if slot >= self.slots.table.slots:
            raise RuntimeError("every slot is taken")  # the engine admits no more rows than slots
        return slot

    def _vacate(self, slot: int) -> int:
        """Make `slot` free: a prompt held there moves to another free slot, its keys with it."""
        if (other := self.held.pop(slot, None)) is not None:
            other.slot = self._free(slot + 1)
            self.slots.move(slot, other.slot)
            self.held[other.slot] = other
        return slot
