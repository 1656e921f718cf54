"""Runs that start from another: a fine-tuned run names its base, and a LoRA run holds only its adapters.

    config.json "init":     the run (or HuggingFace folder) it was fine-tuned from
    config.json "adapter":  {"base": the base run, "also": names trained beside the adapters (a new
                             head)}; "converters" (runs/converters.py) say how the base is quantized
                             and adapted: the model is the base's weights, quantized, LoRA adapters
                             on top; model.safetensors holds what trains (the adapters, the head)
    chat_template.json:     the template its conversations were rendered with (data/chat.py)

A folder that is not a run (a HuggingFace checkpoint) is read through the readers registered in
READERS from above (interop converts it once into the cache), so `--init` takes either.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnlab.data.chat import ChatTemplate
from attnlab.errors import AttnlabError
from attnlab.io import read_json
from attnlab.lazy import fill_registries
from attnlab.models import build_model
from attnlab.nn.lora import LoRAConfig, add_lora, merge_lora
from attnlab.quant.quantize import quantize_model
from attnlab.runs.converters import converters_of, lora_of, quantized_base
from attnlab.runs.folder import WEIGHTS, check_run_dir, is_run, read_run_config
from attnlab.runs.weights import load_state, load_streamed, load_weights

ADAPTER = "adapter"
CHAT_TEMPLATE = "chat_template.json"
# Readers of folders that are not runs, each path -> a run folder holding the same model, or None when
# the folder is not its kind (interop registers HuggingFace's).
READERS: list[Callable[[Path], Path | None]] = []


def as_run(path: str | Path) -> Path:
    """The run folder a --init or base path names: a run as it is, another model folder through READERS."""
    p = Path(path)
    if p.is_dir() and not is_run(p):
        fill_registries()  # interop's readers fill READERS when imported
        for read in READERS:
            run = read(p)
            if run is not None:
                return run
    return check_run_dir(p)


def adapter_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's adapter section with its converters, as one dict: base, lora (LoRAConfig's
    fields), quantize_base and also (None for a run whose weights are the whole model)."""
    adapter = config.get(ADAPTER)
    if adapter is None:
        return None
    if not isinstance(adapter, dict) or not isinstance(adapter.get("base"), str):
        raise AttnlabError("config.json's adapter section is corrupt: it needs base and lora")
    converters = converters_of(config)
    lora = lora_of(converters)
    if lora is None:
        raise AttnlabError("config.json's adapter section is corrupt: it needs base and lora")
    return {
        **adapter,
        "lora": asdict(lora),
        "quantize_base": quantized_base(converters),
        "also": adapter.get("also", []),
    }


def merged_weights(base: Path, config: dict[str, Any]) -> dict[str, Tensor]:
    """The whole weights of the LoRA run `base` (its config.json `config`): the adapters merged into
    its float base, so that a run fine-tuned from it starts from what it computes."""
    quantized = adapter_of(config).get("quantize_base")
    if quantized:
        raise AttnlabError(
            f"{base} is a LoRA run on a {quantized} base: merge it first "
            f"(attnlab merge {base} --out DIR) and start from DIR"
        )
    net = build_adapted(config)
    load_weights(net, base / WEIGHTS)
    merge_lora(net)
    return net.state_dict()


def build_base(
    base: str | Path, family: str, model: dict[str, Any], quantize: str | None = None, new: Collection[str] = ()
) -> nn.Module:
    """The model a fine-tuning starts from: `family` built from `model` with the weights of the run
    folder `base` (as_run's: resolved by the caller, once), all but those named in `new` (a head the
    base has not got), its block matrices quantized (int8, nf4) when asked."""
    path = Path(base)
    config = read_run_config(path)
    net = build_model(family, model)
    if adapter_of(config) is None:  # a whole weights file: read a tensor at a time
        load_streamed(net, path / WEIGHTS, new)
    else:
        load_state(net, merged_weights(path, config), path / WEIGHTS, new=new)
    if quantize:
        quantize_model(net, quantize)
    return net


def with_adapters(net: nn.Module, lora: LoRAConfig, also: Collection[str] = ()) -> nn.Module:
    """LoRA adapters (B = 0) on `net`, and what trains beside them (`also`: a new head) trainable again."""
    add_lora(net, lora)
    params = dict(net.named_parameters())
    for name in also:
        params[name].requires_grad_(True)
    return net


def build_adapted(config: dict[str, Any], float_base: bool = False) -> nn.Module:
    """The model of a LoRA run, adapters at B = 0 (its weights file then fills them). Its base is the
    run it names, or (that run gone, e.g. a cleared cache) what --init named, read again; quantized as
    the run trained it, unless float_base (merging: an update folded into 4-bit weights would round
    away)."""
    adapter = adapter_of(config)
    base = adapter["base"] if Path(adapter["base"]).is_dir() else config.get("init") or adapter["base"]
    quantize = None if float_base else adapter.get("quantize_base")
    try:
        net = build_base(as_run(base), config["family"], config["model"], quantize, adapter.get("also", []))
    except AttnlabError as e:
        raise AttnlabError(f"this LoRA run's base {base} cannot be read: {e}") from None
    return with_adapters(net, lora_of(converters_of(config)), adapter["also"])


def run_template(run: str | Path) -> ChatTemplate:
    """The chat template a run was trained with (chat_template.json), or attnlab's built-in one."""
    path = Path(run) / CHAT_TEMPLATE
    if not path.is_file():
        return ChatTemplate()
    return ChatTemplate.from_dict(read_json(path), where=str(path))
