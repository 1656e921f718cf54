"""The engine's one key/value table (decoding/seats.py, slots.py): rows seated in slots 0..B-1 and
prompts holding slots past them while they are prefilled; whoever moves, each row's keys go with it."""

from __future__ import annotations

import torch

from attnlab.decoding.draw import Draw
from attnlab.decoding.rows import Row
from attnlab.decoding.seats import Seats
from attnlab.decoding.slots import Slots
from attnlab.nn.cache import KVCache


def row(name: int) -> Row:
    return Row([name], Draw(), 1, lambda step: None, torch.device("cpu"))


def state(value: float, n: int) -> list[KVCache]:
    """One layer's caches of one row: n positions, every number `value` (keys) or -value (values)."""
    cache = KVCache(8)
    cache.update(torch.full((1, 2, n, 3), value), torch.full((1, 2, n, 3), -value))
    return [cache]


def prefilled(seats: Seats, r: Row, value: float, n: int) -> None:
    """r holds a slot and its prompt's n keys are written there, as a prefill chunk writes them."""
    seats.hold(r)
    cache = seats.slots.caches[0]
    cache.k[r.slot, :, :n], cache.v[r.slot, :, :n] = value, -value
    seats.slots.table.lengths[r.slot] = n


def holds(seats: Seats, r: Row, value: float, n: int) -> bool:
    """r's slot holds its n keys and values (and nothing of another row's)."""
    cache, slot = seats.slots.caches[0], r.slot
    return (
        seats.slots.table.lengths[slot] == n
        and bool((cache.k[slot, :, :n] == value).all())
        and bool((cache.v[slot, :, :n] == -value).all())
    )


def test_held_prompts_make_room_for_seated_rows_and_join_where_their_keys_are():
    seats = Seats(Slots(1, 4, 8, torch.device("cpu")))
    a, b, p, q, twin = (row(i) for i in range(5))
    a.state = state(1.0, 3)
    seats.enter(a)  # slot 0
    prefilled(seats, p, 2.0, 2)  # the lowest free slot: 1
    prefilled(seats, q, 3.0, 4)  # 2
    assert (a.slot, p.slot, q.slot) == (0, 1, 2)
    b.state = state(4.0, 1)
    seats.enter(b)  # slot 1 is the next seat: p moves out of it, its keys with it
    assert (b.slot, p.slot) == (1, 3) and holds(seats, p, 2.0, 2) and holds(seats, b, 4.0, 1)
    seats.join(q)  # held at slot 2, the next seat: nothing moves
    assert q.slot == 2 and seats.rows == [a, b, q] and holds(seats, q, 3.0, 4)
    seats.leave(a)  # the last seated row (q) fills the hole
    assert (q.slot, b.slot) == (0, 1) and holds(seats, q, 3.0, 4) and a.slot is None
    seats.join(p)  # from slot 3 to the next seat, 2
    assert p.slot == 2 and seats.rows == [q, b, p] and holds(seats, p, 2.0, 2)
    seats.copy(twin, p)  # a twin of p: a copy of its keys in the next seat
    assert twin.slot == 3 and holds(seats, twin, 2.0, 2) and holds(seats, p, 2.0, 2)
    assert not seats.held


def test_a_prompt_finishing_before_an_older_one_changes_places_with_it():
    seats = Seats(Slots(1, 3, 8, torch.device("cpu")))
    a, p, q = row(0), row(1), row(2)
    a.state = state(1.0, 3)
    seats.enter(a)
    prefilled(seats, p, 2.0, 5)  # slot 1
    prefilled(seats, q, 3.0, 2)  # slot 2, done first
    seats.join(q)
    assert (q.slot, p.slot) == (1, 2) and seats.held == {2: p}
    assert holds(seats, q, 3.0, 2) and holds(seats, p, 2.0, 5) and holds(seats, a, 1.0, 3)
    seats.leave(p)  # a held prompt leaving (cancelled) gives its slot up
    assert p.slot is None and not seats.held and seats.rows == [a, q]
