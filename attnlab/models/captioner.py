"""Image captioning with a Transformer: a ViT encoder over patches, a causal decoder over words.

Legend: B batch, C channels, H x W image, P patch side, N = (H/P)(W/P) patches, T caption tokens,
D model width, V caption vocabulary.

    image (B, C, H, W) -> patches (B, N, D) (ViT's PatchEmbedding) + 2-D positions -> encoder blocks
    -> memory (B, N, D): one vector per patch, what the decoder's cross-attention reads
    caption so far (B, T) -> the encoder-decoder's decoder (models/seq2seq.py): causal
    self-attention, cross-attention over the patches, feed-forward -> next word (B, T, V)

It is the translation Transformer with the source's token embedding replaced by the patch
embedding (Seq2Seq.source_embedding / source_positions / source), so decoding, caching, beam
search, label smoothing and the attention views are the encoder-decoder's own. Where each word
looked is the cross-attention (B, H, T, N) of each decoder layer, a map over the image.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from attnlab.config import names, option
from attnlab.models.common import PatchGrid, check_images, positions
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import PATCH_PATHS, PatchEmbedding
from attnlab.nn import ACTIVATIONS, NORM_PLACES, POSITIONS


@dataclass
class CaptionerConfig(Seq2SeqConfig, PatchGrid):
    # Pre-norm and GELU as in ViT; learned 1-D positions for the words (2-D sin/cos for the patches).
    norm: str = option("pre", "LayerNorm before each sublayer (pre) or after the residual (post)", NORM_PLACES)
    activation: str = option("gelu", "feed-forward activation", names(ACTIVATIONS))
    src_vocab: int = option(1, "unused: the source is an image")
    image_size: int = option(8, "image height in pixels (set from the data when training)")
    image_width: int | None = option(None, "image width in pixels (default: square; set from the data)")
    channels: int = option(1, "colour channels (set from the data when training)")
    patch_size: int = option(4, "height of the patches the encoder reads (their width too, unless --patch-width)")
    patch_width: int | None = option(None, "width of the patches (default: patch_size, square)")
    patch_embed: str = option("conv", "patch projection: strided convolution or cut-flatten-linear", PATCH_PATHS)
    stem: int = option(0, "channels of a 3x3 convolution before the patches (the ViT paper's hybrid; 0 = none)")

    def __post_init__(self):
        if self.share_embeddings:
            raise ValueError("a captioner's source is an image: it has no token embedding to share")
        super().__post_init__()
        self.check_patches()
        n = self.n_patches
        if not POSITIONS[self.positions].on_grid and n > self.context:  # a 1-D table over the patches
            raise ValueError(
                f"{self.positions} positions cover {self.context} tokens but the image has {n} "
                "patches: raise --context or use sinusoidal (2-D) positions"
            )
        self.check_grid_positions()


# The stem, weight decay, label smoothing and the 3 + 1 blocks each read digits better, measured on
# digits-strips: docs/log.md, "Captioning".
PRESETS: dict[str, CaptionerConfig] = {
    "captioner-tiny": CaptionerConfig(
        n_layer=3,
        n_dec_layer=1,
        n_head=4,
        d_model=64,
        d_ff=256,
        context=32,
        dropout=0.0,
        label_smoothing=0.1,
        stem=32,
    ),
    "captioner-small": CaptionerConfig(
        n_layer=4, n_dec_layer=2, n_head=4, d_model=128, d_ff=512, context=32, dropout=0.1, stem=32
    ),
}


class Captioner(Seq2Seq):
    """Seq2Seq whose source is an image: see the module docstring."""

    cfg: CaptionerConfig
    poolings = ()  # its source is an image: no text to embed

    def source_embedding(self, cfg: CaptionerConfig) -> nn.Module:
        return PatchEmbedding(cfg.channels, cfg.patch, cfg.d_model, cfg.patch_embed, cfg.stem)

    def source_positions(self, cfg: CaptionerConfig) -> nn.Module:
        return positions(cfg, grid=cfg.grid, lead=0)  # no [CLS]: every token is a patch

    def source(self, images: Tensor) -> tuple[Tensor, None]:
        """images (B, C, H, W) in [0, 1] -> patch vectors with positions (B, N, D); every patch is real."""
        check_images(images, self.cfg.channels, self.cfg.size)
        return self.drop(self.src_pos(self.src_tok(images))), None

    @property
    def word_embedding(self) -> nn.Embedding:
        """The caption side's word embedding (the source has none)."""
        return self.tgt_tok
