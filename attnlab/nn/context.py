"""What one forward pass through a stack hands every block besides the residual stream x.

Legend: B batch, T time (this call's new positions), Tk keys (T, or every position so far with a
cache), S source (memory) length, C model width, H heads.

A model builds one Context per call; its Stack adds the positions' score bias once and hands the
same Context to every block with the block's index, which picks that block's caches. A block's
attention layers read what they need from it, so a block reads like the lecture:

    x = x + attn(norm(x), ctx)          # self-attention: ctx.mask, bias, positions, offset, caches
    x = x + cross(norm(x), ctx)         # cross-attention: ctx.memory, memory_mask, cross_caches
    x = x + ff(norm(x))

Frozen: a block may not change what the next block sees; the caches it holds fill themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:  # type hints only: attention.py imports this module
    from attnlab.nn.attention import QKTransform
    from attnlab.nn.cache import KVCache
    from attnlab.nn.position import Offset, Positions


@dataclass(frozen=True, eq=False)  # eq=False: comparing would compare tensors
class Context:
    """The mask, bias, positions, offset, caches and memory of one pass (all optional)."""

    mask: Tensor | None = None  # (B|1, 1, T|1, Tk) self-attention, True = may attend (e.g. key padding)
    bias: Tensor | None = None  # (1|B, H|1, T, Tk) float, added to every self-attention's scores
    positions: Positions | None = None  # the scheme whose qk_transform acts inside attention (rotary)
    offset: Offset = 0  # position of x[:, 0]: one int, or one per row (B,) with caches of differing lengths
    caches: Sequence[KVCache] | None = None  # one per block: self-attention's keys/values so far
    memory: Tensor | None = None  # (B, S, C) the encoder's output, for cross-attention
    memory_mask: Tensor | None = None  # (B|1, 1, 1|T, S) which source positions cross-attention may see
    cross_caches: Sequence[KVCache] | None = None  # one per block: the memory's keys/values, made once
    return_weights: bool = False  # also return each attention's probabilities (B, H, T, Tk)

    @property
    def qk_transform(self) -> QKTransform | None:
        """The positions' function (q, k, offset) -> (q, k) inside self-attention, or None."""
        return None if self.positions is None else self.positions.qk_transform

    def cache(self, layer: int) -> KVCache | None:
        """Block `layer`'s self-attention cache, or None when not decoding."""
        return None if self.caches is None else self.caches[layer]

    def cross_cache(self, layer: int) -> KVCache | None:
        """Block `layer`'s cross-attention cache, or None."""
        return None if self.cross_caches is None else self.cross_caches[layer]

    def with_score_bias(self, t: int) -> Context:
        """This context with the positions' score bias (ALiBi, relative positions) added to `bias`, for
        T new positions: what a Stack does once per call, so its blocks share one bias tensor."""
        if self.positions is None:
            return self
        # With caches the keys are every position so far; asked of the cache, which may know it
        # without reading the offset back from the device (decoding/slots.py, decoding/compiled.py).
        tk = t if self.caches is None else self.caches[0].keys_after(self.offset, t)
        extra = self.positions.score_bias(t, tk, self.offset)  # (1|B, H, T, Tk) or None
        if extra is None:
            return self
        return replace(self, bias=extra if self.bias is None else self.bias + extra)


NO_CONTEXT = Context()  # a plain pass: no mask, bias, positions, caches or memory
