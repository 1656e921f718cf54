"""Scaled dot-product attention, multi-head attention and the key/value cache.

Legend: B batch, H heads, Tq query length, Tk key length, Dh head size, C model width.

Masks are boolean and broadcast to (B, H, Tq, Tk). True means "this query may look at this
key", the convention of `torch.nn.functional.scaled_dot_product_attention`. A bias is a float
tensor added to the scores before the softmax (ALiBi's distance penalties, relative-position
biases), broadcast the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.cache import KVCache as KVCache  # where callers have long imported it from
from attnlab.nn.context import NO_CONTEXT, Context
from attnlab.nn.hooks import Tap
from attnlab.nn.norm import RMSNorm

# A function (q, k, offset) -> (q, k) applied inside attention by position schemes such as
# rotary embeddings; absolute schemes leave it as None (see nn/position.py). offset: an int, or
# one per row (B,).
QKTransform = Callable[[Tensor, Tensor, int | Tensor], tuple[Tensor, Tensor]]


# At most this many queries a row, inside a compiled step (not training), take _few_queries' sums (a
# verify pass).
FEW_QUERIES = 32


def causal_mask(tq: int, tk: int, device: torch.device | str | None = None) -> Tensor:
    """(Tq, Tk) boolean mask where query i may see key j iff j <= i.

    Aligned bottom-right: with a cache the Tq queries are the *last* Tq positions of the Tk
    keys, so query i sits at absolute position Tk - Tq + i.
    """
    q_pos = torch.arange(tq, device=device)[:, None] + (tk - tq)  # (Tq, 1)
    k_pos = torch.arange(tk, device=device)[None, :]  # (1, Tk)
    return k_pos <= q_pos


def padding_mask(real: Tensor, queries: bool = True) -> Tensor | None:
    """Attention mask from real (non-padding) positions (B, T): None when nothing is padded.

    queries=True: (B, 1, T, T), padding neither gives nor receives attention (self-attention);
    queries=False: (B, 1, 1, T), only the keys are masked (cross-attention over a padded source).
    """
    if bool(real.all()):
        return None
    keys = real[:, None, None, :]  # (B, 1, 1, T)
    return keys & real[:, None, :, None] if queries else keys


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    return_weights: bool = False,
    *,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + bias) V over the last two dimensions.

    q: (..., Tq, Dh), k: (..., Tk, Dh), v: (..., Tk, Dv); mask (boolean) and bias (float) broadcast
    to (..., Tq, Tk). `causal=True` adds the causal mask (bottom-right aligned, see `causal_mask`).

    Two paths compute the same thing:
    - return_weights=True: the formula written out; returns (out, weights), weights being the
      (..., Tq, Tk) attention probabilities, for visualization and teaching.
    - return_weights=False: the fused `scaled_dot_product_attention` kernel (flash / memory
      efficient where available); returns (out, None).

    A query row whose keys are all masked gets zero weights and a zero output, never NaN.
    """
    tq, tk = q.shape[-2], k.shape[-2]
    if causal and tq == 1:
        causal = False  # a single newest query may see every key
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    if not return_weights and mask is None and bias is None:
        # The fast path the models take: no mask tensor at all, causal handled in the kernel.
        if not causal or tq == tk:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
            return out, None

    if tq == 1 and not return_weights and dropout_p == 0 and torch.compiler.is_compiling():
        return _one_query(q, k, v, mask, bias, scale), None
    mask, live = _visible(mask, causal, tq, tk, q.device)
    few = tq <= FEW_QUERIES and not (return_weights or dropout_p or torch.is_grad_enabled())  # no training
    if few and torch.compiler.is_compiling():
        out = _few_queries(q, k, v, mask, bias, scale)  # a verify pass (decoding/compiled_verify.py)
        return (out if live is None else out * live), None
    if not return_weights:
        # The kernel takes one attn_mask: boolean, or a float one added to the scores. A bias and a
        # mask together become one float mask, -inf where the boolean mask says no.
        attn_mask = mask if bias is None else _masked_bias(bias.to(q.dtype), mask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
        return (out if live is None else out * live), None
    return _written_out(q, k, v, mask, live, bias, scale, dropout_p)


def stored(t: Tensor) -> Tensor:
    """t, contiguous, as a view torch.compile must store before the sums that read it: otherwise inductor
    may compute t inside each sum's loop, once per key or per output row (a layer norm or a GELU
    recomputed for each of a head's 50,257 rows: a third of GPT-2 small's int8 step; docs/log.md,
    "The compiled decode step"). Eager: the same values."""
    t = t.contiguous()
    return t.as_strided(t.shape, t.stride())


def _one_query(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float) -> Tensor:
    """One query per row (a decode step) as sums that torch.compile fuses into two loops over the keys:
    q (..., 1, Dh), k and v (..., Tk, Dh) -> (..., 1, Dh). The fused kernel's extern call, with its
    mask broadcast and copied, cost more than the sums (docs/log.md, "The compiled decode step")."""
    scores = (stored(q) * k).sum(-1, keepdim=True).transpose(-1, -2) * scale  # (..., 1, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = stored(torch.softmax(scores.float(), dim=-1).to(v.dtype))  # (..., 1, Tk)
    return (weights.transpose(-1, -2) * v).sum(-2, keepdim=True)  # (..., 1, Dh)


def _few_queries(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float) -> Tensor:
    """A few queries per row (a verify pass's T) as _one_query's sums, one more loop over the queries:
    q (..., T, Dh), k and v (..., Tk, Dh) -> (..., T, Dh). The fused kernel's extern call, with its mask,
    made a small model's compiled pass a quarter dearer (docs/serving.md, "Speculative decoding")."""
    scores = (stored(q)[..., :, None, :] * k[..., None, :, :]).sum(-1) * scale  # (..., T, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = stored(torch.softmax(scores.float(), dim=-1).to(v.dtype))  # (..., T, Tk)
    return (weights[..., :, :, None] * v[..., None, :, :]).sum(-2)  # (..., T, Dh)


def _visible(mask: Tensor | None, causal: bool, tq: int, tk: int, device) -> tuple[Tensor | None, Tensor | None]:
    """The boolean mask with the causal one added, and which query rows see any key at all (..., Tq, 1).

    Rows with no visible key would be softmax over all -inf = NaN. They are let see every key (so
    the arithmetic stays finite, also in backward) and zeroed afterwards by `live`."""
    if causal:
        cm = causal_mask(tq, tk, device)
        mask = cm if mask is None else mask & cm
    if mask is None:
        return None, None
    live = mask.any(dim=-1, keepdim=True)  # (..., Tq, 1)
    return mask | ~live, live


def _written_out(q, k, v, mask, live, bias, scale: float, dropout_p: float) -> tuple[Tensor, Tensor]:
    """The formula as the lectures write it, keeping the (..., Tq, Tk) probabilities to look at."""
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if live is not None:
        weights = weights * live
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped.to(v.dtype) @ v, weights


def _masked_bias(bias: Tensor, mask: Tensor | None) -> Tensor:
    """The additive bias with -inf where `mask` (boolean, True = may attend) forbids a key; the
    result has the broadcast shape of both."""
    if mask is None:
        return bias
    return torch.where(mask, bias, torch.tensor(float("-inf"), dtype=bias.dtype, device=bias.device))


class MultiHeadAttention(nn.Module):
    """Multi-head attention, as self-attention (memory=None) or cross-attention.

    Each head h has its own W_Q^h, W_K^h, W_V^h (C -> Dh). All of them are stored stacked in one
    (3 * H * Dh, C) matrix `qkv_proj`: rows [0, H*Dh) are the heads' W_Q, then W_K, then W_V.
    Self-attention computes queries, keys and values of every head with one matrix product;
    cross-attention takes the W_Q rows for the queries and the W_K, W_V rows for the memory.
    The heads' outputs are concatenated and projected back to C by W_O (`out_proj`).
    Dh = C / H unless `d_head` is given.

    Grouped-query attention (Ainslie et al. 2023): with n_kv_heads < H, the heads share G = H /
    n_kv_heads key/value heads, head h reading key/value head h // G; the stacked matrix is then
    ((H + 2 * n_kv_heads) * Dh, C), and a KVCache keeps only the n_kv_heads (the memory decoding
    saves). n_kv_heads = 1 is multi-query attention (Shazeer 2019), n_kv_heads = H plain MHA.

    qk_norm=True RMS-normalizes each head's query and key (over Dh, with a learned gain) before
    positions are applied (Dehghani et al. 2023, "Scaling ViT to 22B"): the scores can then not
    grow without bound as the weights do, which lets training take higher learning rates.

    causal=True lets each query see only the keys up to its own position (a decoder's self-attention);
    cross=True takes the keys and values from the pass's memory (a decoder block's cross-attention).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        qk_norm: bool = False,
        n_kv_heads: int | None = None,
        causal: bool = False,
        cross: bool = False,
    ):
        super().__init__()
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}; set d_head")
            d_head = d_model // n_heads
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.d_head, self.dropout = n_heads, n_kv_heads, d_head, dropout
        self.inner, self.kv_inner = n_heads * d_head, n_kv_heads * d_head
        self.qkv_proj = nn.Linear(d_model, self.inner + 2 * self.kv_inner, bias=bias)
        self.out_proj = nn.Linear(self.inner, d_model, bias=bias)
        self.out_proj.init_role = "residual_out"  # writes into the residual stream: scaled at init
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(d_head), RMSNorm(d_head)
        self.qk_norm, self.causal, self.cross = qk_norm, causal, cross
        self.hook_pattern, self.hook_head_out = Tap(heads=n_heads), Tap(heads=n_heads)  # see nn/hooks.py

    def _project(self, x: Tensor, rows: slice) -> Tensor:
        """x @ W[rows]^T + b[rows]: the chosen part of the stacked Q/K/V projection."""
        bias = None if self.qkv_proj.bias is None else self.qkv_proj.bias[rows]
        return F.linear(x, self.qkv_proj.weight[rows], bias)

    def _heads(self, x: Tensor, *counts: int) -> tuple[Tensor, ...]:
        """(B, T, sum(counts) * Dh) -> one (B, n, T, Dh) tensor (views) per head count n."""
        b, t, _ = x.shape
        return x.view(b, t, -1, self.d_head).transpose(1, 2).split(counts, dim=1)

    def _shared(self, kv: Tensor) -> Tensor:
        """(B, n_kv_heads, Tk, Dh) -> (B, H, Tk, Dh): each key/value head repeated for its G query heads."""
        g = self.n_heads // self.n_kv_heads
        return kv if g == 1 else kv.repeat_interleave(g, dim=1)

    def forward(
        self, x: Tensor, ctx: Context = NO_CONTEXT, cache: KVCache | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C) queries -> out (B, T, C), and the weights (B, H, T, Tk) when ctx.return_weights.

        Self-attention reads ctx's mask, bias, positions and offset; cross-attention (cross=True) its
        memory (B, S, C) and memory_mask (nn/context.py). cache: this layer's keys/values so far, or
        for cross-attention the memory's, made on the first call (a static cache).
        """
        q, k, v = self._cross_qkv(x, ctx.memory, cache) if self.cross else self._self_qkv(x, ctx)
        mask, bias = (ctx.memory_mask, None) if self.cross else (ctx.mask, ctx.bias)
        if cache is not None and not (cache.static and cache.filled):
            k, v = cache.update(k, v)  # (B, Hkv, Tk, Dh): the cache holds the key/value heads only
            if (rows := cache.key_bias()) is not None:  # rows of different lengths: each sees its own keys
                bias = rows if bias is None else bias + rows
        k, v = self._shared(k), self._shared(v)  # (B, H, Tk, Dh)
        return self._attend(q, k, v, mask, bias, ctx.return_weights)

    def _self_qkv(self, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x with one product, positions applied: (B, H|Hkv, T, Dh) each."""
        q, k, v = self._heads(self.qkv_proj(x), self.n_heads, self.n_kv_heads, self.n_kv_heads)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if (turn := ctx.qk_transform) is not None:  # positions applied inside attention (e.g. rotary)
            q, k = turn(q, k, ctx.offset)
        return q, k, v

    def _cross_qkv(self, x: Tensor, memory: Tensor | None, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries of x (B, H, T, Dh); keys and values of the memory (B, Hkv, S, Dh), or the cache's."""
        (q,) = self._heads(self._project(x, slice(0, self.inner)), self.n_heads)
        q = self.q_norm(q) if self.qk_norm else q
        if cache is not None and cache.static and cache.filled:
            return q, cache.k, cache.v  # the source's keys/values, computed once
        if memory is None:
            raise ValueError("cross-attention needs the encoder's output: pass Context(memory=...)")
        k, v = self._heads(self._project(memory, slice(self.inner, None)), self.n_kv_heads, self.n_kv_heads)
        return q, (self.k_norm(k) if self.qk_norm else k), v

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, return_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Every head's attention, the hooks on its pattern and outputs, the heads concatenated and W_O:
        q (B, H, T, Dh), k and v (B, H, Tk, Dh) -> (B, T, C), and the weights (B, H, T, Tk) if asked for."""
        b, _, t, _ = q.shape
        p = self.dropout if self.training else 0.0
        pattern = self.hook_pattern.active  # a hook reads or replaces the probabilities: the math path
        out, weights = attend(q, k, v, mask, return_weights or pattern, bias=bias, causal=self.causal, dropout_p=p)
        if pattern and (replaced := self.hook_pattern(weights)) is not weights:
            out, weights = replaced.to(v.dtype) @ v, replaced  # (B, H, T, Dh) from the replaced pattern
        out = self.hook_head_out(out)  # (B, H, T, Dh): each head's output
        out = out.transpose(1, 2).reshape(b, t, self.inner)  # (B, T, H*Dh): heads concatenated
        return self.out_proj(out), (weights if return_weights else None)
