"""Building blocks shared by every attnlab model family."""

from attnlab.nn.attention import KVCache, MultiHeadAttention, attend, causal_mask
from attnlab.nn.block import Block, BlockConfig
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.norm import LayerNorm
from attnlab.nn.position import (
    GridPositions,
    LearnedPositions,
    NoPositions,
    Positions,
    SinusoidalPositions,
    build_positions,
    sinusoidal_2d_table,
    sinusoidal_table,
)

__all__ = [
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
