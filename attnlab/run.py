"""A trained run loaded back: model, tokenizer and settings, ready to use.

run = attnlab.load("runs/demo")
logits = run.model(idx)                      # (B, T, vocab)
print(run.generate("def ", max_new_tokens=80, temperature=0.8))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.engine.rundir import CONFIG, WEIGHTS, check_run_dir, load_weights, read_run_config, reads_pixels
from attnlab.config import from_dict
from attnlab.engine.device import pick_device
from attnlab.errors import AttnlabError
from attnlab.models.baselines import BASELINES
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mlp import ImageMLP, MLPConfig
from attnlab.models.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import ViT, ViTConfig
from attnlab.data.tokenizers import Tokenizer, load_tokenizer

# family name -> (model config class, model class); later families register here.
FAMILIES: dict[str, tuple[type, type[nn.Module]]] = {
    "gpt": (GPTConfig, GPT),
    "encoder": (EncoderConfig, Encoder),
    **BASELINES,  # bow, pooled, conv1d, rnn
    "seq2seq": (Seq2SeqConfig, Seq2Seq),  # the encoder-decoder Transformer
    "rnn-seq2seq": (RNNSeq2SeqConfig, RNNSeq2Seq),  # with or without Bahdanau attention
    "vit": (ViTConfig, ViT),  # images as sequences of patches
    "mlp": (MLPConfig, ImageMLP),  # the image baseline on flattened pixels
}


def build_model(family: str, model_cfg: dict[str, Any]) -> nn.Module:
    if family not in FAMILIES:
        raise AttnlabError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")
    cfg_cls, model_cls = FAMILIES[family]
    return model_cls(from_dict(cfg_cls, model_cfg, where="model config"))


@dataclass
class Run:
    path: Path
    model: nn.Module
    tokenizer: Tokenizer | None  # None for image runs, which read pixels
    config: dict[str, Any]  # the run's config.json: family, model, train, data
    step: int

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompt: str = "", **kwargs) -> str:
        """Continue `prompt`; keyword arguments as in `attnlab.decoding.sampling.generate_text`."""
        from attnlab.decoding.sampling import generate_text

        return generate_text(self.model, self.tokenizer, prompt, **kwargs)


def load(path: str | Path, device: str = "auto") -> Run:
    """Load a run directory written by training (weights read from safetensors, no pickle)."""
    p = check_run_dir(path)
    config = read_run_config(p)
    try:
        model = build_model(config["family"], config["model"])
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"{p / CONFIG} is corrupt ({e})") from None
    meta = load_weights(model, p / WEIGHTS)
    model.to(pick_device(device)).eval()
    tok = None if reads_pixels(config) else load_tokenizer(p)
    return Run(p, model, tok, config, int(meta.get("step", 0)))
