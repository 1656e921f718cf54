"""The key/value cache: what attention keeps of the positions it has seen, so that decoding one more
token projects only that token's keys and values.

Legend: B batch, Hkv key/value heads, T new positions, Dh head size.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer.

    Self-attention appends the new positions' keys/values at each decoding step, so the
    prefix is never projected again. Cross-attention (`static=True`) stores the encoder's
    keys/values once per source and reuses them.
    """

    def __init__(self, max_len: int | None = None, static: bool = False):
        self.max_len = max_len
        self.static = static
        self.k: Tensor | None = None  # (B, H, max_len, Dh) when preallocated
        self.v: Tensor | None = None
        self.length = 0
        # The newest token fed (B, 1), for models whose input looks one token back (bigrams).
        self.last_token: Tensor | None = None

    def key_bias(self) -> Tensor | None:
        """What to add to the scores of the keys update() returned, (B, 1, 1, Tk): -inf where a row may
        not look. None here, where every row has them all; a cache whose rows differ in length
        (decoding/slots.py) hides each row's positions past its own."""
        return None

    @property
    def filled(self) -> bool:
        return self.length > 0

    def keys_after(self, offset: int | Tensor, t: int) -> int:
        """How many keys attention sees once t new positions at `offset` are in: every position so far
        (per-row offsets: as far as the furthest row). A cache that knows it without reading `offset`
        back from the device says so (decoding/slots.py, decoding/compiled.py)."""
        return (offset if isinstance(offset, int) else int(offset.max())) + t

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, T, Dh) keys/values; return all cached ones, (B, H, length, Dh)."""
        t = k.shape[2]
        if self.static:  # the whole source at once, kept as it is
            self.k, self.v, self.length = k, v, t
            return k, v
        if self.max_len is None:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
            self.length += t
            return self.k, self.v
        if self.k is None:  # zeroed: a position not yet written may still be read, masked (decoding/compiled.py)
            b, h, _, dh = k.shape
            self.k = k.new_zeros(b, h, self.max_len, dh)
            self.v = v.new_zeros(b, h, self.max_len, v.shape[-1])
        end = self.length + t
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def select(self, rows: Tensor) -> None:
        """Keep batch rows `rows` (in that order): beam search reorders hypotheses this way."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, rows), self.v.index_select(0, rows)
        if self.last_token is not None:
            self.last_token = self.last_token.index_select(0, rows)
