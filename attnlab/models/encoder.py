"""Encoder: a bidirectional Transformer (BERT-style) with a masked-LM, classification or tagging head.

Legend: B batch, T time, C model width, V vocabulary, L labels, H heads.

    tokens (B, T) -> embeddings + positions -> N blocks, every position sees every real one
    -> head:  mlm       (B, T, V)  the original token at each masked position
              classify  (B, L)     from [CLS] (position 0) or the mean over real tokens
              tag       (B, T, L)  a label per token

Padding (id 0) neither gives nor receives attention: the mask keeps pad keys out of every
query's softmax, and pad queries attend to nothing (their output is zero), so adding padding
never changes the outputs at real positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import names, option
from attnlab.data.batches import IGNORE, PAD_ID  # padding id; the label of positions with no loss
from attnlab.models.common import Checkpointing, Presets, TransformerConfig, init_weights, pool, text_body
from attnlab.models.protocols import OneSequence, Positioned, TextEmbedding, WordEmbedded
from attnlab.nn import Context, LayerNorm, build_norm
from attnlab.nn.attention import padding_mask
from attnlab.nn.feedforward import ACTIVATIONS
from attnlab.nn.position import Positions


class EncoderHead:
    """What an encoder predicts from its final states. A head puts its layers on the model under the
    names checkpoints use (`out`, `transform`, `pooler`), so a run folder reads the same whatever the head."""

    over_vocabulary = False  # predicts tokens (a masked LM), its output tied to the word embedding
    pooled = False  # one label per sequence, from the pooled vector (BERT's pooler may sit before it)

    def build(self, model: Encoder, cfg: EncoderConfig) -> None:
        model.out = nn.Linear(cfg.d_model, cfg.n_labels)

    def tie(self, model: Encoder) -> None:
        """After initialization: weights shared with the body."""

    def logits(self, model: Encoder, x: Tensor, ids: Tensor) -> Tensor:
        return model.out(x)  # (B, T, L)

    def output(self, model: Encoder, x: Tensor, ids: Tensor, labels: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """The logits of final states x (B, T, C), and with labels the mean cross-entropy."""
        logits = self.logits(model, x, ids)
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE)


class TokenHead(EncoderHead):
    """tag: a label per token, (B, T, L)."""


class SequenceHead(EncoderHead):
    """classify: a label per sequence, (B, L), from [CLS] or the mean of the real tokens."""

    pooled = True

    def build(self, model: Encoder, cfg: EncoderConfig) -> None:
        # BERT's pooler (dense + tanh on [CLS]) sits between the encoder and the classifier.
        model.pooler = nn.Linear(cfg.d_model, cfg.d_model) if cfg.pooler else None
        model.out = nn.Linear(cfg.d_model, cfg.n_labels)

    def logits(self, model: Encoder, x: Tensor, ids: Tensor) -> Tensor:
        pooled = pool(x, model.cfg.pooling, ids != PAD_ID)  # (B, C)
        if model.pooler is not None:
            pooled = torch.tanh(model.pooler(pooled))
        return model.out(pooled)  # (B, L)


class MaskedLMHead(EncoderHead):
    """mlm: the original token at each masked position, (B, T, V). BERT's head: a transform (dense,
    activation, norm), then the tied word embedding and a bias."""

    over_vocabulary = True

    def build(self, model: Encoder, cfg: EncoderConfig) -> None:
        model.transform = nn.Linear(cfg.d_model, cfg.d_model)
        model.transform_norm = LayerNorm(cfg.d_model, cfg.ln_eps, cfg.bias)
        model.out = nn.Linear(cfg.d_model, cfg.vocab_size)

    def tie(self, model: Encoder) -> None:
        model.out.weight = model.tok.weight  # (V, C): the same matrix reads and predicts tokens

    def logits(self, model: Encoder, x: Tensor, ids: Tensor) -> Tensor:
        return model.out(model.transform_norm(ACTIVATIONS[model.cfg.activation](model.transform(x))))  # (B, T, V)

    def output(self, model: Encoder, x: Tensor, ids: Tensor, labels: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        if labels is None:
            return self.logits(model, x, ids)
        # Only the chosen ~15% of positions carry loss: the (C x V) head runs on those alone.
        chosen = labels != IGNORE  # (B, T)
        logits = self.logits(model, x[chosen], ids)  # (N, V)
        if not chosen.any():  # nothing chosen (a tiny batch): no loss, but a graph to backpropagate
            return logits, x.sum() * 0.0
        return logits, F.cross_entropy(logits.float(), labels[chosen])


# Encoder heads by config name (and by the task that trains each: mlm, classify, tag).
HEADS: dict[str, EncoderHead] = {"mlm": MaskedLMHead(), "classify": SequenceHead(), "tag": TokenHead()}


@dataclass
class EncoderConfig(TransformerConfig, Presets):
    vocab_size: int = option(30522, "vocabulary size (set from the tokenizer when training)")
    head: str = option("classify", "what the model predicts", names(HEADS))
    n_labels: int = option(2, "number of classes (classify, tag)")
    pooling: str = option("cls", "sequence summary for classify: the [CLS] position or the mean", ("cls", "mean"))
    type_vocab_size: int = option(0, "token types (segments) as in BERT; every token is type 0; 0 = none")
    pooler: bool = option(False, "BERT's pooler: dense + tanh on the pooled vector before the classify head")

    def __post_init__(self):
        super().__post_init__()
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {tuple(HEADS)}, got {self.head!r}")
        if self.n_labels < 1:
            raise ValueError(f"n_labels must be at least 1, got {self.n_labels}")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be 0 or more, got {self.type_vocab_size}")
        if self.pooler and not HEADS[self.head].pooled:
            raise ValueError(f"pooler applies to head classify only, not {self.head!r}")


def _bert(n_layer: int, d_model: int, n_head: int) -> EncoderConfig:
    # BERT: post-norm, GELU, 512 positions, WordPiece vocabulary of 30,522.
    return EncoderConfig(n_layer=n_layer, n_head=n_head, d_model=d_model, context=512, norm="post", head="mlm")


PRESETS: dict[str, EncoderConfig] = {
    "encoder-tiny": EncoderConfig(n_layer=2, n_head=4, d_model=64, context=128, vocab_size=4096),
    "encoder-small": EncoderConfig(n_layer=4, n_head=4, d_model=128, context=256, vocab_size=8192),
    "bert-base": _bert(12, 768, 12),
    "bert-large": _bert(24, 1024, 16),
}
PAPER_PARAMS = {"bert-base": 110e6, "bert-large": 340e6}


class Encoder(Checkpointing, OneSequence, WordEmbedded, Positioned, TextEmbedding, nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        text_body(self, cfg, cfg.vocab_size, causal=False)  # tok, pos, drop, blocks, norm
        # BERT's segment embeddings; attnlab has one segment, so only row 0 is ever added.
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        # Post-norm stacks (BERT) normalize the embeddings; pre-norm ones normalize at the end.
        self.embed_norm = build_norm(cfg) if cfg.norm == "post" else nn.Identity()
        self.task_head = HEADS[cfg.head]  # a plain object: its layers are the model's own (out, ...)
        self.task_head.build(self, cfg)
        init_weights(self, cfg.n_layer, zero_out=cfg.zero_init)
        self.task_head.tie(self)

    @property
    def word_embedding(self) -> nn.Embedding:
        return self.tok

    def input_positions(self) -> tuple[Positions, str]:
        return self.pos, ""

    @property
    def poolings(self) -> tuple[str, ...]:
        # A classifier trained on [CLS] made that position its text's summary; any other encoder's is the
        # mean of the real tokens (a masked LM never asked one position to summarise the rest).
        return ("cls", "mean") if self.task_head.pooled and self.cfg.pooling == "cls" else ("mean",)

    def embedding_ids(self, ids: list[int], tok) -> list[int]:
        """[CLS] first where the head pools from it or the tokenizer frames every input (a converted
        BERT's, [CLS] ... [SEP]): the ids as the run's task frames a text."""
        first = [tok.cls_id] if self.task_head.pooled or tok.wraps else []
        return first + list(ids) + [tok.sep_id] * tok.wraps

    def embedding_states(self, ids: Tensor) -> Tensor:
        return self.hidden(ids)[0]  # padding is masked out of every real position's attention

    def hidden(self, ids: Tensor, return_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Final hidden states (B, T, C) of ids (B, T), and each layer's attention (B, H, T, T) if asked."""
        if ids.shape[1] > self.cfg.context:
            raise ValueError(f"sequence of {ids.shape[1]} tokens exceeds the context of {self.cfg.context}")
        mask = padding_mask(ids != PAD_ID)  # (B, 1, T, T) or None
        x = self.tok(ids)  # (B, T, C)
        if self.token_type is not None:
            x = x + self.token_type.weight[0]  # segment 0 for every token
        x = self.drop(self.embed_norm(self.pos(x)))  # (B, T, C)
        x, weights = self.blocks(x, Context(mask=mask, positions=self.pos, return_weights=return_weights))
        return self.norm(x), weights["self"]

    def forward(self, ids: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """ids (B, T) -> logits (mlm: (B, T, V), classify: (B, L), tag: (B, T, L)); with labels
        (classify: (B,), else (B, T), IGNORE where no loss) also the mean cross-entropy."""
        x, _ = self.hidden(ids)
        return self.task_head.output(self, x, ids, labels)

    @torch.no_grad()
    def attention(self, ids: Tensor) -> list[Tensor]:
        """The attention probabilities of every layer: a list of (B, H, T, T) tensors."""
        return self.hidden(ids, return_weights=True)[1]
