"""A LoRA run's adapters folded into its base: a full run that needs neither the base nor the adapters.

    merge_run("runs/sft", "runs/sft-merged")
      -> the base run's weights, always in float (a base the run quantized to int8 or NF4 too:
         folding an update into 4-bit weights would round most of it away), its adapters on top
      -> W + (alpha / r) B A in every adapted matrix (nn/lora.py merge_lora), the adapters gone
      -> a run like a full fine-tune's: config.json without its adapter section, model.safetensors
         with every weight, the tokenizer and chat template copied

The merged model computes what the adapted one did over the float base. Over a quantized base it
computes what the adapters trained toward, on the weights the quantized ones approximated.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.errors import AttnlabError
from attnlab.io import write_json
from attnlab.nn.lora import merge_lora
from attnlab.runs.adapted import CHAT_TEMPLATE, adapter_of, as_run, build_adapted
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, check_new_run, check_run_dir, fresh_dir, read_run_config
from attnlab.runs.marker import record
from attnlab.runs.weights import load_weights, save_weights


def lora_section(run: Path, config: dict[str, Any]) -> dict[str, Any]:
    adapter = adapter_of(config)
    if adapter is None:
        raise AttnlabError(f"{run} is not a LoRA run (its config.json has no adapter section): nothing to merge")
    return adapter


def float_adapted(run: str | Path) -> tuple[nn.Module, dict[str, str]]:
    """A LoRA run's model over its base in float, whatever base it trained over: the base run's
    weights unquantized, the run's adapters (and any head it trained) on top; and its weights'
    metadata."""
    run = check_run_dir(run)
    config = read_run_config(run)
    lora_section(run, config)
    net = build_adapted(config, float_base=True)
    return net, load_weights(net, run / WEIGHTS)


def merge_run(run: str | Path, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write LoRA run `run` with its adapters merged as a full run in `out`; returns a summary. An
    existing `out` is replaced only with force, and only if it is an attnlab run."""
    run, out = check_run_dir(run), Path(out)
    config = read_run_config(run)
    adapter = lora_section(run, config)
    base = as_run(adapter["base"])
    check_new_run(out, force, {run: "the run being merged", base: "its base run"})
    net, meta = float_adapted(run)
    merged = merge_lora(net)
    net.requires_grad_(True)  # a full run: every weight is its own (and trains, from --init)
    # its tokenizer (else the base's, the same), and its own chat template only: without one it used the built-in
    found = ((TOKENIZER, base), (TOKENIZER, run), (CHAT_TEMPLATE, run))  # later wins
    copies = {name: d / name for name, d in found if (d / name).is_file()}
    fresh_dir(out)  # only now: a failure above never costs an old run
    record(out, CONFIG, WEIGHTS, *copies)
    write_json(
        out / CONFIG,
        {**{k: v for k, v in config.items() if k != "adapter"}, "merged": {"run": str(run), "base": adapter["base"]}},
    )
    save_weights(net, out / WEIGHTS, {"step": meta.get("step", "0")})
    for name, src in copies.items():
        shutil.copyfile(src, out / name)
    return {
        "run": str(out),
        "merged": len(merged),
        "parameters": sum(p.numel() for p in net.parameters()),
        "quantized_base": adapter.get("quantize_base"),
    }
