"""The RNN encoder-decoder that the Transformer replaced: with Bahdanau attention, or plain.

Legend: B batch, S source length, T target length, E embedding width (d_emb), H hidden width
(d_hidden), D encoder directions (1 or 2), L layers, A alignment width (d_attn), C context width
(D * H with attention, H plain), V target vocabulary.

Encoder: embeddings -> GRU/LSTM (packed, so padding never enters it) -> states h_j (B, S, D * H).
Bridge: each layer's final state, both directions concatenated, -> linear -> tanh = the decoder's
initial state s_0 (an LSTM's initial cell is zero).

Decoder step i, from the previous token y_{i-1} and state s_{i-1} (Bahdanau, Cho, Bengio 2015):

    e_ij  = v^T tanh(W s_{i-1} + U h_j)        U h_j is computed once per source, in start()
    a_ij  = softmax_j(e_ij)                     over real source tokens only: padding gets 0
    c_i   = sum_j a_ij h_j
    s_i   = RNN([emb(y_{i-1}); c_i], s_{i-1})   s_{i-1} of the top layer is the query
    logits = V_o tanh(W_o [s_i; c_i; emb(y_{i-1})])   a "deep output" of width E

Plain (attention=False, Cho et al. 2014): c_i = tanh(W_b [h_S_fwd; h_1_bwd]) for every i, the
top layer of the bridge, which is also the top layer's s_0: that one vector is all the decoder
ever learns of the source, the bottleneck attention removes.

forward() runs the same step() over the target, so teacher forcing and decoding share one code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.config import option
from attnlab.data.batches import IGNORE, N_SPECIAL, PAD_ID
from attnlab.models.protocols import StepDecoding, WordEmbedded

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


@dataclass
class RNNSeq2SeqConfig:
    src_vocab: int = option(10000, "source vocabulary (set from the tokenizer when training; includes the specials)")
    tgt_vocab: int = option(10000, "target vocabulary (set from the tokenizer when training; includes the specials)")
    d_emb: int = option(128, "embedding width (source and target)")
    d_hidden: int = option(256, "hidden state width (per direction in the encoder)")
    n_layer: int = option(1, "stacked recurrent layers in the encoder and in the decoder")
    cell: str = option("gru", "recurrent cell", ("gru", "lstm"))
    bidirectional: bool = option(True, "bidirectional encoder")
    attention: bool = option(True, "Bahdanau attention; False = plain encoder-decoder (one summary vector)")
    d_attn: int = option(128, "width of the alignment MLP")
    dropout: float = option(0.1, "dropout on embeddings, between layers and before the output layer")
    label_smoothing: float = option(0.1, "label smoothing of the training loss")

    def __post_init__(self):
        for name in ("src_vocab", "tgt_vocab"):
            if getattr(self, name) <= N_SPECIAL:
                raise ValueError(f"{name} must exceed the {N_SPECIAL} special ids, got {getattr(self, name)}")
        for name in ("d_emb", "d_hidden", "n_layer", "d_attn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, got {self.cell!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def d_enc(self) -> int:
        """Width of an encoder state h_j: both directions concatenated."""
        return self.d_hidden * (2 if self.bidirectional else 1)

    @property
    def d_ctx(self) -> int:
        """Width of the context c_i the decoder reads at each step."""
        return self.d_enc if self.attention else self.d_hidden


def additive_attention(query: Tensor, keys: Tensor, values: Tensor, mask: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Bahdanau's alignment: query W s (B, A), keys U h (B, S, A), values h (B, S, C), mask (B, S)
    true at real source tokens, v (A,) -> context (B, C) and weights (B, S), exactly 0 where masked."""
    scores = torch.tanh(keys + query.unsqueeze(1)) @ v  # (B, S): e_j = v^T tanh(W s + U h_j)
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)  # (B, S)
    context = (weights.unsqueeze(1) @ values).squeeze(1)  # (B, 1, S) @ (B, S, C) -> (B, C)
    return context, weights


class AdditiveAttention(nn.Module):
    """The projections W, U, v around `additive_attention` (no biases, as in the paper)."""

    def __init__(self, d_query: int, d_key: int, d_attn: int):
        super().__init__()
        self.query = nn.Linear(d_query, d_attn, bias=False)  # W
        self.key = nn.Linear(d_key, d_attn, bias=False)  # U
        self.score = nn.Linear(d_attn, 1, bias=False)  # v

    def forward(self, s: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """s (B, H), keys = self.key(values) (B, S, A), precomputed once per source."""
        return additive_attention(self.query(s), keys, values, mask, self.score.weight[0])


@dataclass
class RNNState:
    """What the decoder carries between steps; the source-side tensors stay fixed."""

    hidden: Tensor  # (L, B, H) decoder state s
    cell: Tensor | None  # (L, B, H) LSTM cell, None for a GRU
    mask: Tensor  # (B, S) true at real source tokens
    memory: Tensor | None  # (B, S, D * H) encoder states h_j (attention only)
    keys: Tensor | None  # (B, S, A) U h_j (attention only)
    summary: Tensor | None  # (B, H) the fixed context of the plain variant

    def select(self, rows: Tensor) -> RNNState:
        """Keep / reorder batch rows (beam search): rows is a LongTensor of indices."""
        pick = lambda x, dim: None if x is None else x.index_select(dim, rows.to(x.device))
        return RNNState(
            pick(self.hidden, 1),
            pick(self.cell, 1),
            pick(self.mask, 0),
            pick(self.memory, 0),
            pick(self.keys, 0),
            pick(self.summary, 0),
        )


class RNNSeq2Seq(WordEmbedded, StepDecoding, nn.Module):
    """Encoder-decoder translation model; see the module docstring for the equations."""

    token_shift = N_SPECIAL  # model id = tokenizer id + token_shift (PAD, BOS, EOS below)

    @property
    def word_embedding(self) -> nn.Embedding:
        """The source side's token embedding."""
        return self.src_embed

    def __init__(self, cfg: RNNSeq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        E, H, L = cfg.d_emb, cfg.d_hidden, cfg.n_layer
        between = cfg.dropout if L > 1 else 0.0  # PyTorch drops between layers only
        rnn = CELLS[cfg.cell]
        self.src_embed = nn.Embedding(cfg.src_vocab, E, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, E, padding_idx=PAD_ID)
        self.encoder = rnn(E, H, L, batch_first=True, dropout=between, bidirectional=cfg.bidirectional)
        self.bridge = nn.Linear(cfg.d_enc, H)  # one per model, applied to each layer's final state
        self.attn = AdditiveAttention(H, cfg.d_enc, cfg.d_attn) if cfg.attention else None
        self.decoder = rnn(E + cfg.d_ctx, H, L, batch_first=True, dropout=between)
        self.pre_out = nn.Linear(H + cfg.d_ctx + E, E)  # W_o: narrow, so the V-wide layer reads E, not H + C + E
        self.out = nn.Linear(E, cfg.tgt_vocab)  # V_o
        self.drop = nn.Dropout(cfg.dropout)

    def start(self, src: Tensor) -> RNNState:
        """Encode src (B, S) once: the initial decoder state and the source side of attention."""
        B, S = src.shape
        # An all-padding source is read as one (padding) token: packing needs lengths >= 1.
        lengths = (src != PAD_ID).sum(1).clamp(min=1)  # (B,)
        mask = torch.arange(S, device=src.device) < lengths.unsqueeze(1)  # (B, S)
        x = self.drop(self.src_embed(src))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_n = self.encoder(packed)
        h_n = h_n[0] if isinstance(h_n, tuple) else h_n  # the LSTM's cells stay in the encoder
        # h_n (L * D, B, H), layer-major: the forward state is at the last real token, the backward at position 0.
        D = 2 if self.cfg.bidirectional else 1
        final = h_n.view(self.cfg.n_layer, D, B, -1).permute(0, 2, 1, 3).reshape(self.cfg.n_layer, B, -1)  # (L, B, D*H)
        hidden = torch.tanh(self.bridge(final))  # (L, B, H) s_0
        cell = torch.zeros_like(hidden) if self.cfg.cell == "lstm" else None
        if self.attn is None:
            return RNNState(hidden, cell, mask, None, None, summary=hidden[-1])
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # (B, S, D * H), zeros at padding
        return RNNState(hidden, cell, mask, memory, self.attn.key(memory), summary=None)

    def _step(self, tokens: Tensor, state: RNNState) -> tuple[Tensor, RNNState, Tensor | None]:
        """step() that also returns the attention weights (B, S), None for the plain variant."""
        emb = self.drop(self.tgt_embed(tokens))  # (B, E)
        if self.attn is None:
            context, weights = state.summary, None  # (B, H): the same vector at every step
        else:
            context, weights = self.attn(state.hidden[-1], state.keys, state.memory, state.mask)  # (B, D*H), (B, S)
        x = torch.cat([emb, context], -1).unsqueeze(1)  # (B, 1, E + C)
        prev = state.hidden if state.cell is None else (state.hidden, state.cell)
        out, new = self.decoder(x, prev)  # out (B, 1, H)
        hidden, cell = new if isinstance(new, tuple) else (new, None)
        pre = torch.tanh(self.pre_out(torch.cat([out[:, 0], context, emb], -1)))  # (B, E)
        logits = self.out(self.drop(pre))  # (B, V)
        return logits, RNNState(hidden, cell, state.mask, state.memory, state.keys, state.summary), weights

    def step(self, tokens: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """tokens (B,) the previous target token of each row -> logits (B, V) for the next one, new state."""
        logits, state, _ = self._step(tokens, state)
        return logits, state

    def step_weights(self, tokens: Tensor, state: RNNState) -> tuple[Tensor, RNNState, Tensor]:
        """step, and the alignment it used, (B, 1, 1, S): one layer, one head (ValueError without attention)."""
        if self.attn is None:
            raise ValueError("the plain encoder-decoder has no attention to show: use attention=True")
        logits, state, weights = self._step(tokens, state)
        return logits, state, weights[:, None, None]

    def forward(self, src: Tensor, tgt_in: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """src (B, S), tgt_in (B, T) = BOS + target (teacher forcing) -> logits (B, T, V);
        with labels (B, T) (IGNORE where no loss) also the label-smoothed cross-entropy."""
        state = self.start(src)
        steps = []
        for t in range(tgt_in.shape[1]):
            logits, state = self.step(tgt_in[:, t], state)
            steps.append(logits)
        logits = torch.stack(steps, 1)  # (B, T, V)
        if labels is None:
            return logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=IGNORE,
            label_smoothing=self.cfg.label_smoothing if self.training else 0.0,  # eval: the plain loss
        )
        return logits, loss

    @torch.no_grad()
    def attention(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """The one attention of teacher-forced decoding, as a Transformer's maps: {"cross": [(B, 1, T, S)]}."""
        return {"cross": [self.alignment(src, tgt_in)[:, 0]]}

    @torch.no_grad()
    def alignment(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Attention weights of teacher-forced decoding, (B, 1, 1, T, S): layer and head axes of size 1,
        so pictures read it like a Transformer's (B, L, H, T, S) cross-attention."""
        if self.attn is None:
            raise ValueError("the plain encoder-decoder has no attention to show: use attention=True")
        state, rows = self.start(src), []
        for t in range(tgt_in.shape[1]):
            _, state, weights = self._step(tgt_in[:, t], state)
            rows.append(weights)
        return torch.stack(rows, 1)[:, None, None]  # (B, T, S) -> (B, 1, 1, T, S)
