"""The stack of blocks every Transformer family runs: GPT, the encoder, ViT, and both halves of
the encoder-decoder.

Legend: B batch, T time, S source (memory) length, C model width, H heads, L layers.

    x (B, T, C) -> block 1 -> ... -> block L -> final norm (pre-norm stacks) -> (B, T, C)

The Stack owns what every family used to rebuild: the blocks, the final norm, one key/value
cache per block for decoding, the position scheme's hooks inside attention (`qk_transform` on
queries and keys, `score_bias` on the scores), activation checkpointing, and collecting each
layer's attention weights. A family is then a front end (embeddings, patches) + a Stack + a head.
What one call needs besides x (mask, bias, positions, offset, caches, memory) comes as one Context
(nn/context.py) that the family builds and every block is handed with its index.

The blocks are the Stack's own items (it is a ModuleList), so a model that keeps its stack as
`self.blocks` has the parameter names `blocks.0.attn...` that run directories and the HuggingFace
mappings use. The final norm is built here but registered by the family under its own name
(`norm`, `enc_norm`, `dec_norm`), for the same reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.nn.block import Block, BlockConfig
from attnlab.nn.cache import KVCache
from attnlab.nn.context import NO_CONTEXT, Context
from attnlab.nn.norm import build_norm


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

    def forward(self, x: Tensor, ctx: Context = NO_CONTEXT) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """x (B, T, C) -> (B, T, C) before the final norm, and {"self": [L x (B, H, T, Tk)], "cross":
        [L x (B, H, T, S)]} when ctx.return_weights. ctx: the pass's mask, bias, positions, offset,
        caches and memory (nn/context.py), handed to every block with the block's index."""
        ctx = ctx.with_score_bias(x.shape[1])  # the positions' bias, made once for every block
        # A recomputed block would append its keys/values to a cache twice: caches mean decoding anyway.
        recompute = self.grad_checkpoint and self.training and torch.is_grad_enabled() and ctx.caches is None
        weights: dict[str, list[Tensor]] = {"self": [], "cross": []}
        for i, block in enumerate(self):
            if recompute:
                x, w = checkpoint(block, x, ctx, i, use_reentrant=False)
            else:
                x, w = block(x, ctx, i)
            for k, v in (w or {}).items():
                weights[k].append(v)
        return x, weights


def stacks_of(model: nn.Module) -> list[Stack]:
    """Every Stack of blocks in `model` (one for GPT, the encoder and ViT; two for an encoder-decoder;
    none for the RNNs and baselines), asked of the modules themselves, never of their names."""
    return [m for m in model.modules() if isinstance(m, Stack)]


def set_grad_checkpoint(model: nn.Module, on: bool) -> None:
    """Turn activation checkpointing on or off in every Stack of `model`."""
    for stack in stacks_of(model):
        stack.grad_checkpoint = on
