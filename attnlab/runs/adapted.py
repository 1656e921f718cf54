"""Runs that start from another: a fine-tuned run names its base, and a LoRA run holds only its adapters.

    config.json "init":     the run (or HuggingFace folder) it was fine-tuned from
    config.json "adapter":  {"base": the base run, "lora": LoRAConfig's fields, "quantize_base": null,
                             "int8" or "nf4"}: the model is the base's weights (quantized as said),
                             LoRA adapters on top; model.safetensors holds the adapters alone
    chat_template.json:     the template its conversations were rendered with (data/chat.py)

A folder that is not a run (a HuggingFace checkpoint) is read through the readers registered in
READERS from above (interop converts it once into the cache), so `--init` takes either.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.data.chat import ChatTemplate
from attnlab.errors import AttnlabError
from attnlab.io import read_json
from attnlab.models import build_model
from attnlab.nn.lora import LoRAConfig, add_lora
from attnlab.nn.quantize import quantize_model
from attnlab.runs.folder import WEIGHTS, check_run_dir, is_run
from attnlab.runs.weights import load_weights

ADAPTER = "adapter"
CHAT_TEMPLATE = "chat_template.json"
# Readers of folders that are not runs, each path -> a run folder holding the same model, or None when
# the folder is not its kind (interop registers HuggingFace's).
READERS: list[Callable[[Path], Path | None]] = []


def as_run(path: str | Path) -> Path:
    """The run folder a --init or base path names: a run as it is, another model folder through READERS."""
    p = Path(path)
    if p.is_dir() and not is_run(p):
        for read in READERS:
            run = read(p)
            if run is not None:
                return run
    return check_run_dir(p)


def adapter_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's adapter section (None for a run whose weights are the whole model)."""
    adapter = config.get(ADAPTER)
    if adapter is None:
        return None
    if not isinstance(adapter, dict) or not isinstance(adapter.get("base"), str) or "lora" not in adapter:
        raise AttnlabError("config.json's adapter section is corrupt: it needs base and lora")
    return adapter


def build_base(base: str | Path, family: str, model: dict[str, Any], quantize: str | None = None) -> nn.Module:
    """The base model of a fine-tuning: `family` built from `model`, the weights of the run `base`,
    its block matrices quantized (int8, nf4) when asked."""
    net = build_model(family, model)
    load_weights(net, as_run(base) / WEIGHTS)
    if quantize:
        quantize_model(net, quantize)
    return net


def build_adapted(config: dict[str, Any]) -> nn.Module:
    """The model of a LoRA run, adapters at B = 0 (its weights file then fills them)."""
    adapter = adapter_of(config)
    try:
        net = build_base(adapter["base"], config["family"], config["model"], adapter.get("quantize_base"))
    except AttnlabError as e:
        raise AttnlabError(f"this LoRA run's base {adapter['base']} cannot be read: {e}") from None
    add_lora(net, LoRAConfig(**adapter["lora"]))
    return net


def run_template(run: str | Path) -> ChatTemplate:
    """The chat template a run was trained with (chat_template.json), or attnlab's built-in one."""
    path = Path(run) / CHAT_TEMPLATE
    if not path.is_file():
        return ChatTemplate()
    return ChatTemplate.from_dict(read_json(path), where=str(path))
