"""FAMILIES: the family name stored in a run's config.json -> its (config class, model class), and
the model of a family built from its config. A new family is one file in models/ plus one line here."""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.config import from_dict
from attnlab.errors import AttnlabError
from attnlab.models.attention_ladder import LADDER
from attnlab.models.baselines import BASELINES
from attnlab.models.captioner import Captioner, CaptionerConfig
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mlp import ImageMLP, MLPConfig
from attnlab.models.reward import RewardConfig, RewardModel
from attnlab.models.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from attnlab.models.rnn_captioner import RNNCaptioner, RNNCaptionerConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import ViT, ViTConfig

FAMILIES: dict[str, tuple[type, type[nn.Module]]] = {
    "gpt": (GPTConfig, GPT),
    "reward": (RewardConfig, RewardModel),  # a GPT scoring a whole answer (the reward task)
    "encoder": (EncoderConfig, Encoder),
    **BASELINES,  # bow, pooled, conv1d, rnn
    **LADDER,  # self-attention (no learned weights), qkv-attention: the steps from pooled to the encoder
    "seq2seq": (Seq2SeqConfig, Seq2Seq),  # the encoder-decoder Transformer
    "rnn-seq2seq": (RNNSeq2SeqConfig, RNNSeq2Seq),  # with or without Bahdanau attention
    "vit": (ViTConfig, ViT),  # images as sequences of patches
    "mlp": (MLPConfig, ImageMLP),  # the image baseline on flattened pixels
    "captioner": (CaptionerConfig, Captioner),  # a ViT encoder and a Transformer decoder: images to words
    "rnn-captioner": (RNNCaptionerConfig, RNNCaptioner),  # Show, Attend and Tell: an RNN attending over patches
}


def family_classes(family: str) -> tuple[type, type[nn.Module]]:
    if family not in FAMILIES:
        raise AttnlabError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[family]


def build_model(family: str, model_cfg: dict[str, Any] | Any) -> nn.Module:
    """The model of `family` from its config (a dataclass, or a dict as in config.json)."""
    cfg_cls, model_cls = family_classes(family)
    if isinstance(model_cfg, dict):
        model_cfg = from_dict(cfg_cls, model_cfg, where="model config")
    return model_cls(model_cfg)
