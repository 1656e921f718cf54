"""A key/value cache whose rows are sequences of different lengths: the engine's one table of slots.

Legend: S slots, B rows of a step, Hkv key/value heads, Dh head size, C the model's context, L the
keys a step attends over (the longest row's, new tokens included), T tokens a row a step.

Each slot holds one sequence's keys and values at positions 0.. of that sequence. A decode step feeds
one new token per row over the first B slots, row b at its own position (its length so far): the
model is called with offset = the rows' positions, (B,) (nn/position.py), every layer writes the new
keys at those positions, and attention reads the first L positions of every row with -inf added to
the scores of each row's positions past its own (the key bias, nn/attention.py: one additive mask,
made once per step, is what the fused attention kernel takes at no extra cost). A prompt being
prefilled holds a slot past the decoded rows and its chunks are written there, T tokens a row a step
over any slots (`begin_at`, prefill.py); a sequence run alone is copied into a slot (`put`); a
finished one leaves by moving the last row into its slot (`move`), so the rows of a decode step are
always slots 0..B-1 (seats.py says which row sits where).

Slots start zeroed: a masked key still takes part in the arithmetic (its weight is zero), so it
must be a finite number, never the garbage of uninitialized memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.nn.attention import KVCache


class SlotTable:
    """What the layers' slot caches share: each slot's length, and this step's positions and mask."""

    def __init__(self, slots: int, context: int, device: torch.device, room: int | None = None):
        self.slots, self.context, self.device = slots, context, device
        self.room = room or context  # positions each slot's buffers hold (compiled_rows.py: one more)
        self.lengths = [0] * slots  # positions filled in each slot: where its next token goes
        self.rows = 0  # B, the rows of the current step
        self.at: list[int] | None = None  # their slots, when not the first B (a prefill's)
        self.index: Tensor | None = None  # the same, (B,), on the device
        self.positions = torch.zeros(0, dtype=torch.long, device=device)  # (B,)
        self.keys = 0  # L
        self.bias: Tensor | None = None  # (B, 1, T, L): 0 for a row's own positions, -inf past them
        self.last: Tensor | None = None  # (S, 1): each slot's newest token, for bigram models

    def begin(self, rows: int) -> Tensor:
        """Start a decode step, one token a row, over the first `rows` slots; returns their positions
        (B,), the model's offset."""
        self.at, self.index = None, None
        return self._positions(self.lengths[:rows], 1)

    def begin_at(self, at: list[int], t: int) -> Tensor:
        """Start a step of `t` tokens a row over the slots `at` (prompts being prefilled, prefill.py)."""
        self.at, self.index = at, torch.tensor(at, device=self.device)
        return self._positions([self.lengths[slot] for slot in at], t)

    def _positions(self, lengths: list[int], t: int) -> Tensor:
        """The step's positions (B,) and key bias for rows of these lengths fed t tokens each."""
        if max(lengths) + t > self.context:
            raise ValueError(f"a slot is full: {max(lengths) + t} positions of {self.context}")
        self.rows, self.keys = len(lengths), max(lengths) + t
        self.positions = torch.tensor(lengths, device=self.device)
        # Query i of row b sits at positions[b] + i and sees the keys up to there, its own only.
        queries = self.positions[:, None] + torch.arange(t, device=self.device)  # (B, T)
        beyond = torch.arange(self.keys, device=self.device) > queries[:, :, None]  # (B, T, L)
        self.bias = torch.zeros(beyond.shape, device=self.device).masked_fill(beyond, float("-inf"))[:, None]
        return self.positions

    def end(self, counts: list[int] | None = None) -> None:
        """The step's tokens are in: every row is one longer (or counts[b] longer: a prefill's real
        tokens, its padding left past the row's length, to be written over)."""
        for b, slot in enumerate(range(self.rows) if self.at is None else self.at):
            self.lengths[slot] += 1 if counts is None else counts[b]
        self.at = self.index = None

    def slots_of_step(self) -> Tensor | slice:
        """Where the step's rows sit: the first B slots (a slice: a view, no copy), or the index."""
        return slice(0, self.rows) if self.index is None else self.index


class SlotCache(KVCache):
    """One layer's keys/values of every slot, (S, Hkv, C, Dh), written at each row's own position."""

    def __init__(self, table: SlotTable):
        self.table = table
        super().__init__(table.context)

    @property
    def last_token(self) -> Tensor | None:  # read by GPT.bigram_ids on the first layer: this step's rows
        last = self.table.last
        # A copy: GPT.bigram_ids reads it, then writes the new tokens in before it uses what it read.
        return None if last is None else last[self.table.slots_of_step()].clone()

    @last_token.setter
    def last_token(self, value: Tensor | None) -> None:
        if value is None:  # KVCache.__init__
            return
        if self.table.last is None:
            self.table.last = torch.zeros(self.table.slots, 1, dtype=torch.long, device=value.device)
        self.table.last[self.table.slots_of_step()] = value

    def _allocate(self, like: Tensor) -> None:
        if self.k is None:
            _, h, _, dh = like.shape
            self.k = like.new_zeros(self.table.slots, h, self.table.room, dh)
            self.v = like.new_zeros(self.table.slots, h, self.table.room, dh)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's (B, Hkv, T, Dh) keys/values at the rows' positions; return every row's first
        L positions, (B, Hkv, L, Dh), of which the key mask says which are the row's own."""
        table, (b, _, t, _) = self.table, k.shape
        self._allocate(k)
        if t == 1 and table.index is None:  # a decode step
            rows = torch.arange(b, device=k.device)
            self.k[rows, :, table.positions] = k[:, :, 0].to(self.k.dtype)  # (B, Hkv, Dh) at (row, position)
            self.v[rows, :, table.positions] = v[:, :, 0].to(self.v.dtype)
            return self.k[:b, :, : table.keys], self.v[:b, :, : table.keys]  # views
        # a prefill chunk: (B, T, Hkv, Dh) at (slot of row, positions[row] + i)
        rows = torch.arange(b, device=k.device) if table.index is None else table.index
        at = table.positions[:, None] + torch.arange(t, device=k.device)  # (B, T)
        self.k[rows[:, None], :, at] = k.transpose(1, 2).to(self.k.dtype)
        self.v[rows[:, None], :, at] = v.transpose(1, 2).to(self.v.dtype)
        return self.k[rows, :, : table.keys], self.v[rows, :, : table.keys]  # gathered: the slots may be any

    def key_bias(self) -> Tensor | None:
        return self.table.bias

    def keys_after(self, offset: int | Tensor, t: int) -> int:
        return self.table.keys  # known from the slots' lengths, not read back from `offset`

    def put(self, slot: int, cache: KVCache) -> None:
        """Copy a one-row cache's positions into `slot`."""
        n = cache.length
        self._allocate(cache.k)
        self.k[slot, :, :n] = cache.k[0, :, :n]
        self.v[slot, :, :n] = cache.v[0, :, :n]

    def move(self, src: int, dst: int) -> None:
        if self.k is not None:
            n = self.table.lengths[src]
            self.k[dst, :, :n] = self.k[src, :, :n]
            self.v[dst, :, :n] = self.v[src, :, :n]

    def swap(self, a: int, b: int) -> None:
        if self.k is not None:
            n, pair = max(self.table.lengths[a], self.table.lengths[b]), [a, b]
            self.k[pair, :, :n] = self.k[[b, a], :, :n]  # the right side is gathered (a copy) first
            self.v[pair, :, :n] = self.v[[b, a], :, :n]


def copied(caches: list[KVCache], fresh: list[KVCache]) -> list[KVCache]:
    """`fresh` (empty caches of the same decoder) holding a copy of `caches`' filled positions: a prompt's
    keys for its twins (engine.py), without copying the empty rest of their buffers."""
    for mine, theirs in zip(fresh, caches, strict=True):
        n = theirs.length
        mine.update(theirs.k[:, :, :n], theirs.v[:, :, :n])
        if theirs.last_token is not None:  # bigram models: the newest token fed
            mine.last_token = theirs.last_token.clone()
    return fresh


class Slots:
    """Every layer's slot cache over one table: what a batched step passes as the model's caches."""

    def __init__(self, n_layers: int, slots: int, context: int, device: torch.device, room: int | None = None):
        self.table = SlotTable(slots, context, device, room)
        self.caches = [SlotCache(self.table) for _ in range(n_layers)]

    def put(self, slot: int, caches: list[KVCache]) -> None:
        """A sequence computed alone (its caches, one row each) takes `slot`."""
        for mine, theirs in zip(self.caches, caches, strict=True):
            mine.put(slot, theirs)
        self.table.lengths[slot] = caches[0].length
        if caches[0].last_token is not None:  # bigram models: the newest token fed
            self._set_last(slot, caches[0].last_token[0])

    def move(self, src: int, dst: int) -> None:
        """The sequence in `src` is copied to `dst` (which a finished one left, or a twin takes)."""
        for cache in self.caches:
            cache.move(src, dst)
        self.table.lengths[dst] = self.table.lengths[src]
        if self.table.last is not None:
            self.table.last[dst] = self.table.last[src]

    def swap(self, a: int, b: int) -> None:
        """The sequences in slots `a` and `b` change places."""
        for cache in self.caches:
            cache.swap(a, b)
        lengths = self.table.lengths
        lengths[a], lengths[b] = lengths[b], lengths[a]
        if self.table.last is not None:
            self.table.last[[a, b]] = self.table.last[[b, a]]

    def write(self, slot: int, k: Tensor, v: Tensor) -> None:
        """Keys and values (L, Hkv, n, Dh) of a sequence's first n positions into `slot` (a reused prefix)."""
        for layer, cache in enumerate(self.caches):
            cache._allocate(k[layer][None])
            cache.k[slot, :, : k.shape[2]] = k[layer]
            cache.v[slot, :, : v.shape[2]] = v[layer]
        self.table.lengths[slot] = k.shape[2]

    def bytes(self) -> int:
        """The table's key/value bytes (0 until a first row is written)."""
        return sum(c.k.nbytes + c.v.nbytes for c in self.caches if c.k is not None)

    def _set_last(self, slot: int, token: Tensor) -> None:
        if self.table.last is None:
            self.table.last = torch.zeros(self.table.slots, 1, dtype=torch.long, device=token.device)
        self.table.last[slot] = token
