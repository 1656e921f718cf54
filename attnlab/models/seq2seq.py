"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Legend: B batch, S source length, T target length, C model width, V target vocabulary,
L layers, H heads.

    source (B, S) -> embeddings * sqrt(C) + positions -> N encoder blocks -> memory (B, S, C)
    target (B, T) -> embeddings * sqrt(C) + positions -> N decoder blocks, each:
        causal self-attention over the target so far,
        cross-attention: queries from the decoder, keys and values from the memory,
        feed-forward
    -> linear to V (tied to the target embedding, as in the paper)

Both stacks are the `nn/stack.py` Stack every attnlab family uses. Padding (id 0) in the
source never gives attention, in the encoder or to the decoder's cross-attention.

Decoding (attnlab/decoding/) calls `start` once per source (the memory, and the cross-attention
keys/values computed on the first step and kept) and `step` once per new target token, with
each decoder block's self-attention keys/values cached, so no prefix is processed twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import names, option
from attnlab.data.batches import IGNORE, N_SPECIAL, PAD_ID
from attnlab.models.common import Checkpointing, Presets, TransformerConfig, init_weights, positions
from attnlab.models.protocols import Positioned, ReadOut, StepDecoding, TextEmbedding, WordEmbedded
from attnlab.nn import ACTIVATIONS, NORM_PLACES, POSITIONS, Context, Stack, TokenEmbedding
from attnlab.nn.attention import padding_mask
from attnlab.nn.position import Positions


@dataclass
class Seq2SeqConfig(TransformerConfig, Presets):
    # The paper's choices as defaults: post-norm, ReLU, sinusoidal positions, dropout 0.1.
    norm: str = option(
        "post", "LayerNorm after each residual (post, the paper) or before each sublayer (pre)", NORM_PLACES
    )
    activation: str = option("relu", "feed-forward activation", names(ACTIVATIONS))
    positions: str = option("sinusoidal", "position information", names(POSITIONS))
    dropout: float = option(0.1, "dropout probability on attention, residuals and embeddings")
    n_dec_layer: int | None = option(None, "decoder blocks (default: n_layer)")
    src_vocab: int = option(37000, "source vocabulary (set from the tokenizer when training)")
    tgt_vocab: int = option(37000, "target vocabulary (set from the tokenizer when training)")
    share_embeddings: bool = option(False, "one embedding matrix for source and target (a shared vocabulary)")
    tie_output: bool = option(True, "the output projection is the target embedding matrix")
    label_smoothing: float = option(0.1, "label smoothing of the training loss (the paper: 0.1)")

    def __post_init__(self):
        super().__post_init__()
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_embeddings needs one vocabulary, got {self.src_vocab} and {self.tgt_vocab}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.n_dec_layer is not None and self.n_dec_layer < 1:
            raise ValueError(f"n_dec_layer must be at least 1, got {self.n_dec_layer}")

    @property
    def dec_layers(self) -> int:
        return self.n_dec_layer or self.n_layer


def _paper(d_model: int, n_head: int, d_ff: int, dropout: float) -> Seq2SeqConfig:
    # Table 3 of the paper: N=6, a shared 37,000-token BPE vocabulary, tied embeddings.
    return Seq2SeqConfig(
        n_layer=6, n_head=n_head, d_model=d_model, d_ff=d_ff, dropout=dropout, context=512, share_embeddings=True
    )


PRESETS: dict[str, Seq2SeqConfig] = {
    "transformer-tiny": Seq2SeqConfig(n_layer=2, n_head=4, d_model=64, d_ff=256, context=128, dropout=0.1),
    "transformer-small": Seq2SeqConfig(n_layer=3, n_head=4, d_model=128, d_ff=512, context=128, dropout=0.1),
    "transformer-base": _paper(512, 8, 2048, 0.1),
    "transformer-big": _paper(1024, 16, 4096, 0.3),
}
PAPER_PARAMS = {"transformer-base": 65e6, "transformer-big": 213e6}


class Seq2SeqState:
    """What decoding carries from step to step: the memory and every decoder block's caches."""

    def __init__(self, memory: Tensor, memory_mask: Tensor | None, decoder: Stack):
        self.memory, self.memory_mask = memory, memory_mask  # (B, S, C), (B, 1, 1, S) or None
        self.caches = decoder.new_caches()  # self-attention, grows by one per step
        self.cross = decoder.new_caches(static=True)  # the memory's keys/values, once
        self.offset = 0  # target tokens fed so far

    def select(self, rows: Tensor) -> Seq2SeqState:
        self.memory = self.memory.index_select(0, rows)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, rows)
        for cache in self.caches + self.cross:
            cache.select(rows)
        return self


class Seq2Seq(Checkpointing, WordEmbedded, Positioned, ReadOut, StepDecoding, TextEmbedding, nn.Module):
    # A source's summary is the mean of the encoder's states (the memory the decoder reads), which see it whole.
    poolings = ("mean",)

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.d_model
        self.src_tok = self.source_embedding(cfg)  # (an image captioner's: its patch embedding)
        self.tgt_tok = self.src_tok if cfg.share_embeddings else TokenEmbedding(cfg.tgt_vocab, c)
        self.src_pos = self.source_positions(cfg)
        self.tgt_pos = positions(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = Stack(cfg.block_config(causal=False), cfg.n_layer)
        self.decoder = Stack(cfg.block_config(causal=True, cross_attention=True), cfg.dec_layers)
        self.enc_norm, self.dec_norm = self.encoder.final_norm(), self.decoder.final_norm()
        self.out = nn.Linear(c, cfg.tgt_vocab, bias=False)
        init_weights(self, cfg.n_layer + cfg.dec_layers, zero_out=cfg.zero_init)
        if cfg.tie_output:
            self.out.weight = self.tgt_tok.weight  # (V, C)

    def source_embedding(self, cfg: Seq2SeqConfig) -> nn.Module:
        """What turns the source into vectors: token embeddings here; a subclass may read other inputs."""
        return TokenEmbedding(cfg.src_vocab, cfg.d_model)

    def source_positions(self, cfg: Seq2SeqConfig) -> nn.Module:
        return positions(cfg)

    def source(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        """src (B, S) -> the encoder's input (B, S, C) and which positions are real (B, S), None if all are."""
        if src.shape[1] > self.cfg.context:
            raise ValueError(f"source of {src.shape[1]} tokens exceeds the context of {self.cfg.context}")
        return self._embed(self.src_tok, self.src_pos, src), src != PAD_ID

    @property
    def blocks(self) -> nn.ModuleList:
        """Every block, for FSDP sharding and gradient checkpointing."""
        return nn.ModuleList([*self.encoder, *self.decoder])

    # Token ids sit above PAD, BOS and EOS: model id = tokenizer id + token_shift.
    token_shift = N_SPECIAL

    @property
    def word_embedding(self) -> nn.Embedding:
        """The source side's token embedding."""
        return self.src_tok

    def input_positions(self) -> tuple[Positions, str]:
        return self.src_pos, "encoder "

    def readout(self) -> tuple[str, nn.Module, Callable[[Tensor], Tensor]]:
        """The decoder's stream (the logit lens needs the source too: trace(model, src, tgt_in))."""
        return "decoder", self.dec_norm, self.out

    def embedding_ids(self, ids: list[int], tok) -> list[int]:
        return [i + self.token_shift for i in ids]  # above PAD, BOS and EOS, as translation reads a source

    def embedding_states(self, ids: Tensor) -> Tensor:
        return self.encode(ids)[0]  # the memory (B, S, C); padding is masked out of the encoder

    def _embed(self, tok: nn.Embedding, pos: nn.Module, ids: Tensor, offset: int = 0) -> Tensor:
        # Section 3.4: the embeddings are multiplied by sqrt(d_model) before positions are added.
        return self.drop(pos(tok(ids) * math.sqrt(self.cfg.d_model), offset))  # (B, T, C)

    def encode(self, src: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor | None, list[Tensor]]:
        """src (B, S) -> memory (B, S, C), the cross-attention mask (B, 1, 1, S) or None, and the
        encoder's self-attention weights per layer when asked for."""
        x, real = self.source(src)  # (B, S, C), (B, S) or None
        mask = None if real is None else padding_mask(real)
        x, weights = self.encoder(x, Context(mask=mask, positions=self.src_pos, return_weights=return_weights))
        return self.enc_norm(x), None if real is None else padding_mask(real, queries=False), weights["self"]

    def decode(
        self, tgt_in: Tensor, memory: Tensor, memory_mask: Tensor | None, return_weights: bool = False
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Teacher forcing: tgt_in (B, T) -> hidden states (B, T, C), and per-layer self/cross weights if asked."""
        if tgt_in.shape[1] > self.cfg.context:
            raise ValueError(f"target of {tgt_in.shape[1]} tokens exceeds the context of {self.cfg.context}")
        x = self._embed(self.tgt_tok, self.tgt_pos, tgt_in)
        ctx = Context(positions=self.tgt_pos, memory=memory, memory_mask=memory_mask, return_weights=return_weights)
        x, weights = self.decoder(x, ctx)
        return self.dec_norm(x), weights

    def forward(self, src: Tensor, tgt_in: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V); with labels (B, T), also the smoothed cross-entropy."""
        memory, memory_mask, _ = self.encode(src)
        x, _ = self.decode(tgt_in, memory, memory_mask)
        logits = self.out(x)  # (B, T, V)
        if labels is None:
            return logits
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            labels.flatten(),
            ignore_index=IGNORE,
            label_smoothing=self.cfg.label_smoothing if self.training else 0.0,
        )
        return logits, loss

    def start(self, src: Tensor) -> Seq2SeqState:
        """Encode the sources once; the state `step` continues from."""
        memory, memory_mask, _ = self.encode(src)
        return Seq2SeqState(memory, memory_mask, self.decoder)

    def step(self, tokens: Tensor, state: Seq2SeqState) -> tuple[Tensor, Seq2SeqState]:
        """tokens (B,): each row's latest target token -> logits (B, V) for the next one."""
        logits, state, _ = self._step(tokens, state, False)
        return logits, state

    def step_weights(self, tokens: Tensor, state: Seq2SeqState) -> tuple[Tensor, Seq2SeqState, Tensor]:
        """step, and each decoder layer's cross-attention of the new token, (B, L, H, S)."""
        logits, state, weights = self._step(tokens, state, True)
        return logits, state, torch.stack([w[:, :, -1] for w in weights["cross"]], dim=1)

    def _step(self, tokens: Tensor, state: Seq2SeqState, return_weights: bool):
        x = self._embed(self.tgt_tok, self.tgt_pos, tokens[:, None], state.offset)  # (B, 1, C)
        first = state.offset == 0  # the memory's keys/values are projected on the first step only
        ctx = Context(
            positions=self.tgt_pos,
            offset=state.offset,
            caches=state.caches,
            memory=state.memory if first else None,
            memory_mask=state.memory_mask,
            cross_caches=state.cross,
            return_weights=return_weights,
        )
        x, weights = self.decoder(x, ctx)
        state.offset += 1
        return self.out(self.dec_norm(x))[:, 0], state, weights

    @torch.no_grad()
    def attention(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Every attention map of teacher-forced decoding: "encoder" (B, H, S, S), "decoder"
        (B, H, T, T) and "cross" (B, H, T, S), one tensor per layer."""
        memory, memory_mask, enc = self.encode(src, return_weights=True)
        _, dec = self.decode(tgt_in, memory, memory_mask, return_weights=True)
        return {"encoder": enc, "decoder": dec["self"], "cross": dec["cross"]}

    def alignment(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Cross-attention of every layer and head, (B, L, H, T, S): where each target token looked."""
        return torch.stack(self.attention(src, tgt_in)["cross"], dim=1)
