"""The two steps between pooled embeddings and the Transformer, as the lectures build attention up.

Legend: B batch, T tokens, E embedding width, H heads, L labels.

    self-attention  embeddings X -> Y = softmax(X X^T) X, no learned weights -> mean over tokens -> linear
    qkv-attention   embeddings X -> softmax(Q K^T / sqrt(Dh)) V with learned Q, K, V (one head, or
                    --n-head several) -> mean over tokens -> linear

The first is the lectures' "simple self-attention": each output is a mix of the inputs weighted by
their dot products with one another, so it can only reweight what the embeddings already say (the
scores are not scaled: x_i . x_i is usually the largest, and much of each row stays on the word
itself). The second lets the model learn what to look for (queries), what to be found by (keys) and
what to pass on (values). Then come residuals, feed-forward layers and stacked blocks: the encoder.
Padding neither gives nor receives attention, and is left out of the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from attnlab.config import option
from attnlab.data.batches import PAD_ID
from attnlab.models.baselines import Baseline, BaselineConfig, masked_mean
from attnlab.nn.attention import MultiHeadAttention, attend, padding_mask
from attnlab.nn.context import Context


@dataclass
class SelfAttentionConfig(BaselineConfig):
    d_embed: int = option(64, "embedding width")

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("d_embed")


class _Mixer(Baseline):
    """Embeddings mixed by a subclass's `mix`, then pooled (classify) or read per token (tag)."""

    def mix(self, ids: Tensor, mask: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        y, _ = self.mix(ids, mask)  # (B, T, E)
        if self.cfg.pooled:
            y = masked_mean(y, mask)  # (B, E)
        return self.head(self.drop(y))


class SimpleSelfAttention(_Mixer):
    """Y = softmax(X X^T) X over the word embeddings, then pooled (classify) or per token (tag)."""

    def __init__(self, cfg: SelfAttentionConfig):
        super().__init__()
        self._embedded_with_head(cfg, cfg.d_embed)

    def mix(self, ids: Tensor, mask: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """(Y (B, T, E), weights (B, 1, T, T) or None): one head whose queries, keys and values are X."""
        x = self.embed(ids)[:, None]  # (B, 1, T, E)
        y, weights = attend(x, x, x, padding_mask(mask), return_weights, scale=1.0)
        return y[:, 0], weights


@dataclass
class QKVAttentionConfig(BaselineConfig):
    d_embed: int = option(64, "embedding width")
    n_head: int = option(1, "attention heads (1: the lectures' single head with learned Q, K, V)")

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("d_embed", "n_head")
        if self.d_embed % self.n_head:
            raise ValueError(f"d_embed {self.d_embed} is not divisible by n_head {self.n_head}")


class QKVAttention(_Mixer):
    """softmax(Q K^T / sqrt(Dh)) V with learned projections over the embeddings, then pooled or per token."""

    def __init__(self, cfg: QKVAttentionConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_embed, padding_idx=PAD_ID)
        self.attn = MultiHeadAttention(cfg.d_embed, cfg.n_head)
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_embed, cfg.n_labels)

    def mix(self, ids: Tensor, mask: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """(outputs (B, T, E), weights (B, H, T, T) or None)."""
        return self.attn(self.embed(ids), Context(mask=padding_mask(mask), return_weights=return_weights))


LADDER = {
    "self-attention": (SelfAttentionConfig, SimpleSelfAttention),
    "qkv-attention": (QKVAttentionConfig, QKVAttention),
}
