"""A trained run loaded back: model, tokenizer, settings and task, ready to use.

run = attnlab.load("runs/demo")
logits = run.model(idx)                      # (B, T, vocab)
print(run.generate("def ", max_new_tokens=80, temperature=0.8))
run.task.predict(run, "some text", {})       # whatever its task does with an input
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.decoding.sampling import generate_text
from attnlab.decoding.settings import compiling
from attnlab.errors import AttnlabError, path_argument
from attnlab.models import FAMILIES, build_model
from attnlab.runs.adapted import adapter_of, build_adapted
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, check_run_dir, read_run_config
from attnlab.runs.kind import RunKind, kind_of
from attnlab.runs.quantized import Quantization, check_kind, quantize_for_inference, quantized_of, rebuild_packed
from attnlab.runs.summary import run_html, run_text
from attnlab.runs.weights import load_weights
from attnlab.runtime.device import pick_device
from attnlab.runtime.threads import share

__all__ = ["FAMILIES", "Run", "build_model", "load"]


@dataclass
class Run:
    path: Path
    model: nn.Module
    tokenizer: Tokenizer | None  # None for image runs, which read pixels
    config: dict[str, Any]  # the run's config.json: family, model, train, data, task
    step: int
    quantization: Quantization | None = None  # what load(..., quantize=) packed, if it was asked

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def task(self) -> RunKind:
        """What kind of run this is: the object that predicts, evaluates and draws for it."""
        return kind_of(self.config)

    def generate(self, prompt: str = "", **kwargs) -> str:
        """Continue `prompt`; keyword arguments as in `attnlab.decoding.sampling.generate_text`. As the
        commands do, a language model's decode step is compiled unless compile=False is given (or
        ATTNLAB_COMPILE=0): the first call for a model's shape compiles it (about a minute on 2 cores)."""
        kwargs.setdefault("compile", compiling(True))
        return generate_text(self.model, self.tokenizer, prompt, **kwargs)

    def __repr__(self) -> str:  # the dataclass's would print the whole model
        return run_text(self)

    def _repr_html_(self) -> str:
        """A notebook shows what the run is and its loss curve (runs/summary.py)."""
        return run_html(self)


def load(
    path: str | Path,
    device: str = "auto",
    quantize: str | None = None,
    every_layer: bool = False,
    compiled: bool = False,
) -> Run:
    """Load a run directory written by training (weights read from safetensors, no pickle). quantize:
    "int8", "int4" or "bf16" stores the language model's block matrices and head that way for
    inference (runs/quantized.py), each kept float32 where float32 measured faster here unless
    `every_layer` (compiled: for decoding through compiled steps); a run written by `attnlab quantize`
    loads as it was stored."""
    p = check_run_dir(path_argument(path, "load: path"))
    share()  # sampling, chat, serve, eval: fewer threads beside other busy attnlab/torch processes
    config = read_run_config(p)
    task = kind_of(config)
    if task.tokenized and not (p / TOKENIZER).is_file():
        raise AttnlabError(f"{p} is not a complete run: {TOKENIZER} is missing")
    stored = quantized_of(config)
    if quantize is not None and stored is not None:
        raise AttnlabError(
            f"{p} is already quantized ({stored.get('kind')}); quantize its source run {stored.get('from', '')} instead"
        )
    try:
        model = build_adapted(config) if adapter_of(config) else build_model(config["family"], config["model"])
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"{p / CONFIG} is corrupt ({e})") from None
    if stored is not None:
        rebuild_packed(model, stored)
    meta = load_weights(model, p / WEIGHTS)
    report = None if quantize is None else quantize_for_inference(model, check_kind(quantize), every_layer, compiled)
    model.to(pick_device(device)).eval()
    tok = load_tokenizer(p) if task.tokenized else None
    return Run(p, model, tok, config, int(meta.get("step", 0)), report)
