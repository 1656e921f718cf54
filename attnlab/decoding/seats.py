"""The rows of the engine (engine.py) that sit in slots (slots.py): decoded together, one forward pass
a step.

Legend: B seated rows, V vocabulary.

The seated rows are always slots 0..B-1: a row that leaves gives its slot to the last one, whose keys
and values move with it. A row that is not seated keeps its caches itself (Row.state).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.decoding.rows import Row
from attnlab.decoding.slots import Slots


class Seats:
    """Which row sits in which slot, and the step that decodes them all."""

    def __init__(self, slots: Slots):
        self.slots = slots
        self.rows: list[Row] = []  # by slot

    def enter(self, row: Row) -> None:
        """The row's own caches move into the next free slot."""
        row.slot = len(self.rows)
        self.slots.put(row.slot, row.state)
        self.rows.append(row)
        row.state = None

    def reseat(self, row: Row) -> None:
        """The row's caches, rebuilt alone (a replay), replace those of its slot."""
        self.slots.put(row.slot, row.state)
        row.state = None

    def leave(self, row: Row) -> None:
        """The row gives up its slot (its caches stay behind: it is refilled or decoded alone after)."""
        if row.slot is None:
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
