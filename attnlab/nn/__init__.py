"""Building blocks shared by every attnlab model family."""

from attnlab.nn.attention import KVCache, MultiHeadAttention, attend, causal_mask
from attnlab.nn.block import NORM_PLACES, Block, BlockConfig
from attnlab.nn.feedforward import ACTIVATIONS, FEEDFORWARDS, FeedForward, build_feedforward
from attnlab.nn.norm import NORMS, LayerNorm, build_norm
from attnlab.nn.position import (
    POSITIONS,
    GridPositions,
    LearnedPositions,
    NoPositions,
    Positions,
    SinusoidalPositions,
    build_positions,
    sinusoidal_2d_table,
    sinusoidal_table,
)
from attnlab.nn.stack import Stack, set_grad_checkpoint

__all__ = [
    "ACTIVATIONS",
    "FEEDFORWARDS",
    "NORMS",
    "NORM_PLACES",
    "POSITIONS",
    "Stack",
    "build_feedforward",
    "build_norm",
    "set_grad_checkpoint",
    "Block",
    "BlockConfig",
    "FeedForward",
    "GridPositions",
    "KVCache",
    "LayerNorm",
    "LearnedPositions",
    "MultiHeadAttention",
    "NoPositions",
    "Positions",
    "SinusoidalPositions",
    "attend",
    "build_positions",
    "causal_mask",
    "sinusoidal_2d_table",
    "sinusoidal_table",
]
