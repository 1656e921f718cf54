"""The stack of blocks every Transformer family runs: GPT, the encoder, ViT, and both halves of
the encoder-decoder.

Legend: B batch, T time, S source (memory) length, C model width, H heads, L layers.

    x (B, T, C) -> block 1 -> ... -> block L -> final norm (pre-norm stacks) -> (B, T, C)

The Stack owns what every family used to rebuild: the blocks, the final norm, one key/value
cache per block for decoding, the position scheme's hooks inside attention (`qk_transform` on
queries and keys, `score_bias` on the scores), activation checkpointing, and collecting each
layer's attention weights. A family is then a front end (embeddings, patches) + a Stack + a head.

The blocks are the Stack's own items (it is a ModuleList), so a model that keeps its stack as
`self.blocks` has the parameter names `blocks.0.attn...` that run directories and the HuggingFace
mappings use. The final norm is built here but registered by the family under its own name
(`norm`, `enc_norm`, `dec_norm`), for the same reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.nn.attention import KVCache
from attnlab.nn.block import Block, BlockConfig
from attnlab.nn.norm import build_norm
from attnlab.nn.position import Offset, Positions


class Stack(nn.ModuleList):
    """n_layer blocks of one BlockConfig, run in order."""

    def __init__(self, cfg: BlockConfig, n_layer: int):
        super().__init__(Block(cfg) for _ in range(n_layer))
        self.cfg = cfg
        # Activation checkpointing, a training setting (engine: TrainConfig.grad_checkpoint): keep
        # only each block's input and recompute the block in backward.
        self.grad_checkpoint = False

    def final_norm(self) -> nn.Module:
        """Pre-norm stacks end un-normalized and need a final norm; post-norm blocks end in one."""
        if self.cfg.norm == "pre":
            return build_norm(self.cfg)
        return nn.Identity()

    def new_caches(self, max_len: int | None = None, static: bool = False) -> list[KVCache]:
        """One empty key/value cache per block (static: cross-attention's, filled once per source)."""
        return [KVCache(max_len, static=static) for _ in self]

    def forward(
        self,
        x: Tensor,
        positions: Positions | None = None,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
        offset: Offset = 0,
        return_weights: bool = False,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """x (B, T, C) -> (B, T, C) before the final norm, and {"self": [L x (B, H, T, T')],
        "cross": [...]} when return_weights. positions: the scheme whose hooks act inside
        attention; mask (B|1, 1, T|1, T'); memory (B, S, C) for cross-attention with memory_mask;
        bias: added to every self-attention's scores, (1|B, H|1, T, T'), with the positions' own.
        offset: the position of x[:, 0], or one per row (B,) with caches whose rows differ in length."""
        t = x.shape[1]
        tk = t if caches is None else caches[0].keys_after(offset, t)  # with caches: every position so far
        qk_transform = None if positions is None else positions.qk_transform
        bias = _add(bias, None if positions is None else positions.score_bias(t, tk, offset))
        # A recomputed block would append its keys/values to a cache twice: caches mean decoding anyway.
        recompute = self.grad_checkpoint and self.training and torch.is_grad_enabled() and caches is None
        weights: dict[str, list[Tensor]] = {"self": [], "cross": []}
        for i, block in enumerate(self):
            kwargs = dict(
                mask=mask,
                memory=memory,
                memory_mask=memory_mask,
                cache=None if caches is None else caches[i],
                cross_cache=None if cross_caches is None else cross_caches[i],
                qk_transform=qk_transform,
                offset=offset,
                return_weights=return_weights,
                bias=bias,
            )
            if recompute:
                x, w = checkpoint(block, x, use_reentrant=False, **kwargs)
            else:
                x, w = block(x, **kwargs)
            for k, v in (w or {}).items():
                weights[k].append(v)
        return x, weights


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """The sum of two optional score biases (None: nothing to add)."""
    if a is None or b is None:
        return b if a is None else a
    return a + b


def stacks_of(model: nn.Module) -> list[Stack]:
    """Every Stack of blocks in `model` (one for GPT, the encoder and ViT; two for an encoder-decoder;
    none for the RNNs and baselines), asked of the modules themselves, never of their names."""
    return [m for m in model.modules() if isinstance(m, Stack)]


def set_grad_checkpoint(model: nn.Module, on: bool) -> None:
    """Turn activation checkpointing on or off in every Stack of `model`."""
    for stack in stacks_of(model):
        stack.grad_checkpoint = on
