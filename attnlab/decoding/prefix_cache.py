"""Keys and values of earlier prompts, kept in blocks and reused by any request that shares a prefix
of tokens with one of them: a system prompt seen before is not prefilled again (engine.py).

Legend: L layers, Hkv key/value heads, K tokens a block, Dh head size, n tokens reused.

A prompt's first tokens are cut into blocks of K; block i is named by a hash of its tokens and of the
name of block i-1, so one name stands for the whole prefix up to the block's end. A lookup walks the
blocks of a new prompt from the first while they are kept and returns their keys, (L, Hkv, n, Dh)
each, to write at positions 0..n-1 of the row's caches or slot; the rest of the prompt is fed after
them. At least one token is always left to feed, for the first token's logits. After its prompt is in,
a row's full blocks not kept yet are stored (`insert`), copied, on the model's device.

Memory is bounded by `max_bytes`: the least recently used blocks go first. A lookup touches a prefix's
blocks from the last to the first, so a shared beginning outlives the ends that hang from it (a block
whose parent went is never reached again, and leaves in its turn).

The keys reused were computed over another forward pass than the request's own, so they round
differently: a row that reuses them draws like a batched prefill's row, through exact.py's checks
(admission.py), and a seeded request still gets the tokens it gets alone.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch import Tensor

BLOCK = 16  # tokens a block: small enough to reuse most of a shared prefix, large enough to be few

Block = tuple[Tensor, Tensor]  # keys, values: (L, Hkv, K, Dh) each


class PrefixCache:
    """Blocks of earlier prompts' keys and values, least recently used evicted past `max_bytes`."""

    def __init__(self, max_bytes: int, block: int = BLOCK):
        self.max_bytes, self.block = max_bytes, block
        self.blocks: collections.OrderedDict[int, tuple[tuple[int, ...], int, Block]] = collections.OrderedDict()
        self.bytes = 0
        # Every counter there from the start, so that another thread may copy them (Engine.report).
        self.stats = collections.Counter(
            dict.fromkeys(("hits", "misses", "tokens reused", "blocks stored", "evicted"), 0)
        )
        self.off: str | None = None  # why it is not used (a model that reads the previous token)

    def names(self, ids: list[int], blocks: int) -> list[tuple[int, tuple[int, ...], int]]:
        """(name, tokens, parent's name) of the first `blocks` blocks of ids."""
        out, parent = [], 0
        for i in range(blocks):
            tokens = tuple(ids[i * self.block : (i + 1) * self.block])
            name = hash((parent, tokens))
            out.append((name, tokens, parent))
            parent = name
        return out

    def lookup(self, ids: list[int]) -> tuple[int, Block | None]:
        """How many of ids' first tokens are kept (a multiple of the block, below len(ids)) and their
        keys and values, (L, Hkv, n, Dh) each (None when none)."""
        if self.off is not None or self.max_bytes <= 0:
            return 0, None
        found = []
        for name, tokens, parent in self.names(ids, (len(ids) - 1) // self.block):
            kept = self.blocks.get(name)
            if kept is None or kept[0] != tokens or kept[1] != parent:  # absent (or a hash collision)
                break
            found.append((name, kept[2]))
        self.stats["hits" if found else "misses"] += 1
        if not found:
            return 0, None
        self._touch([name for name, _ in found])
        self.stats["tokens reused"] += len(found) * self.block
        k = torch.cat([block[0] for _, block in found], dim=2)  # (L, Hkv, n, Dh)
        v = torch.cat([block[1] for _, block in found], dim=2)
        return len(found) * self.block, (k, v)

    def insert(self, ids: list[int], keys_of: Callable[[int, int], Block]) -> None:
        """Keep ids' full blocks that are not kept yet; keys_of(start, end) gives the keys and values
        of positions start..end-1, (L, Hkv, end - start, Dh) each, tensors of their own (kept as
        they are)."""
        if self.off is not None or self.max_bytes <= 0:
            return
        names = self.names(ids, len(ids) // self.block)
        for i, (name, tokens, parent) in enumerate(names):
            if name in self.blocks:
                continue
            k, v = keys_of(i * self.block, (i + 1) * self.block)
            size = k.nbytes + v.nbytes
            if size > self.max_bytes:
                return
            self._evict(self.max_bytes - size)
            self.blocks[name] = (tokens, parent, (k, v))
            self.bytes += size
            self.stats["blocks stored"] += 1
        self._touch([name for name, _, _ in names])

    def _touch(self, names: list[int]) -> None:
        for name in reversed(names):  # the first block the most recent: evicted last
            if name in self.blocks:
                self.blocks.move_to_end(name)

    def _evict(self, room: int) -> None:
        while self.bytes > room and self.blocks:
            _, (_, _, (k, v)) = self.blocks.popitem(last=False)
            self.bytes -= k.nbytes + v.nbytes
            self.stats["evicted"] += 1

    def report(self) -> dict[str, int]:
        """hits, misses, tokens reused, blocks, bytes (what /metrics and the engine's stats show)."""
        return {
            **{k: self.stats[k] for k in ("hits", "misses", "tokens reused", "evicted")},
            "blocks": len(self.blocks),
            "bytes": self.bytes,
        }


# ---- where a row's keys are: its own caches (a row run alone) or a slot of the engine's table ----------


def keys_of(caches: list, row: int) -> Callable[[int, int], Block]:
    """keys_of for row `row` of one cache a layer: a row's own caches (row 0) or a slot of the engine's
    table (slots.Slots.caches, row = the slot); stacked, so copies."""
    return lambda a, b: (
        torch.stack([cache.k[row, :, a:b] for cache in caches]),
        torch.stack([cache.v[row, :, a:b] for cache in caches]),
    )


def write_state(state: list, kv: Block) -> None:
    """A prefix's keys and values (L, Hkv, n, Dh) into a row's fresh caches, at positions 0..n-1."""
    for layer, cache in enumerate(state):
        cache.update(kv[0][layer][None], kv[1][layer][None])
