"""Building blocks shared by every attnlab model family."""

from attnlab.nn.attention import MultiHeadAttention, attend, causal_mask
from attnlab.nn.block import Block
from attnlab.nn.cache import KVCache
from attnlab.nn.context import Context
from attnlab.nn.embedding import TokenEmbedding
from attnlab.nn.feedforward import (
    ACTIVATIONS,
    FEEDFORWARDS,
    GATES,
    FeedForward,
    GatedFeedForward,
    build_feedforward,
    default_width,
)
from attnlab.nn.moe import MixtureOfExperts, aux_loss, routing_stats
from attnlab.nn.norm import NORMS, LayerNorm, build_norm
from attnlab.nn.options import NORM_PLACES, BlockConfig, BlockOptions, add_block_option, block_option
from attnlab.nn.position import (
    POSITIONS,
    ALiBiPositions,
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
    "GATES",
    "NORMS",
    "NORM_PLACES",
    "POSITIONS",
    "Stack",
    "TokenEmbedding",
    "build_feedforward",
    "default_width",
    "aux_loss",
    "routing_stats",
    "GatedFeedForward",
    "MixtureOfExperts",
    "build_norm",
    "set_grad_checkpoint",
    "Block",
    "Context",
    "BlockConfig",
    "BlockOptions",
    "add_block_option",
    "block_option",
    "FeedForward",
    "ALiBiPositions",
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
