"""Show, Attend and Tell (Xu et al., 2015): an RNN writes the caption, attending over image regions.

Legend: B batch, C channels, H x W image, P patch side, N = (H/P)(W/P) patches, F feature width,
Hd hidden width, E word embedding width.

    image (B, C, H, W) -> patch features a_j = PatchEmbedding(image) + a learned vector per
        patch position (B, N, F): the paper's CNN feature map, one vector per region
    s_0 = tanh(W_init mean_j a_j)                        the paper's init from the mean annotation
    step i: e_ij = v^T tanh(W s_{i-1} + U a_j)          Bahdanau's additive attention, as in
            alpha_ij = softmax_j(e_ij), z_i = sum_j alpha_ij a_j     models/rnn.py
            s_i = RNN([emb(y_{i-1}); z_i], s_{i-1}), logits from [s_i; z_i; emb(y_{i-1})]

The decoder is the RNN encoder-decoder's (models/rnn.py: step, teacher forcing, alignment, and
the decoders of decoding/beam.py); only what `start` reads differs: patch features instead of a
recurrent encoder over source words. The features need their positions: attention by content
alone could not tell the left digit of a strip from the right one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.config import option
from attnlab.data.batches import PAD_ID
from attnlab.models.common import PatchGrid, check_images
from attnlab.models.rnn import CELLS, AdditiveAttention, RNNSeq2Seq, RNNSeq2SeqConfig, RNNState
from attnlab.models.vit import PatchEmbedding


@dataclass
class RNNCaptionerConfig(RNNSeq2SeqConfig, PatchGrid):
    src_vocab: int = option(4, "unused: the source is an image")
    # Sized for digits-strips on a CPU: with these it left the length-only plateau after 500 steps
    # (measured); the translation RNN's defaults (256 wide, dropout and smoothing 0.1) are for sentences.
    d_emb: int = option(64, "word embedding width")
    d_hidden: int = option(128, "hidden state width, and the width of each patch feature")
    d_attn: int = option(64, "width of the alignment MLP")
    dropout: float = option(0.0, "dropout on the features, the embeddings and before the output layer")
    label_smoothing: float = option(0.0, "label smoothing of the training loss")
    bidirectional: bool = option(False, "unused: the features are not a sequence read in two directions")
    image_size: int = option(8, "image height in pixels (set from the data when training)")
    image_width: int | None = option(None, "image width in pixels (default: square; set from the data)")
    channels: int = option(1, "colour channels (set from the data when training)")
    patch_size: int = option(4, "height of the regions attention reads (their width too, unless --patch-width)")
    patch_width: int | None = option(None, "width of the regions (default: patch_size, square)")
    stem: int = option(32, "channels of a 3x3 convolution before the regions (the paper reads CNN features); 0 = none")

    def __post_init__(self):
        super().__post_init__()
        if not self.attention:
            raise ValueError("Show, Attend and Tell attends: the captioner needs attention=True")
        self.check_patches()


class RNNCaptioner(RNNSeq2Seq):
    """See the module docstring; every decoder part has RNNSeq2Seq's name and shape."""

    cfg: RNNCaptionerConfig

    def __init__(self, cfg: RNNCaptionerConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        E, H, L, F = cfg.d_emb, cfg.d_hidden, cfg.n_layer, cfg.d_enc
        n = cfg.n_patches
        self.patches = PatchEmbedding(cfg.channels, cfg.patch, F, stem=cfg.stem)
        self.where = nn.Parameter(torch.randn(1, n, F) * 0.02)  # (1, N, F) one vector per patch position
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, E, padding_idx=PAD_ID)
        self.bridge = nn.Linear(F, H)  # W_init
        self.attn = AdditiveAttention(H, F, cfg.d_attn)
        self.decoder = CELLS[cfg.cell](E + cfg.d_ctx, H, L, batch_first=True, dropout=cfg.dropout if L > 1 else 0.0)
        self.pre_out = nn.Linear(H + cfg.d_ctx + E, E)
        self.out = nn.Linear(E, cfg.tgt_vocab)
        self.drop = nn.Dropout(cfg.dropout)

    @property
    def word_embedding(self) -> nn.Embedding:
        return self.tgt_embed

    def start(self, images: Tensor) -> RNNState:
        """images (B, C, H, W) -> the initial state and the features attention reads."""
        check_images(images, self.cfg.channels, self.cfg.size)
        feats = self.drop(self.patches(images) + self.where)  # (B, N, F)
        hidden = torch.tanh(self.bridge(feats.mean(1)))  # (B, Hd)
        hidden = hidden.unsqueeze(0).expand(self.cfg.n_layer, -1, -1).contiguous()  # (L, B, Hd)
        cell = torch.zeros_like(hidden) if self.cfg.cell == "lstm" else None
        mask = torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)  # every region is real
        return RNNState(hidden, cell, mask, feats, self.attn.key(feats), summary=None)
