"""LoRA adapters in PEFT's layout, both ways, for Llama-family runs (a GPT that exports as Llama).

    adapter_config.json         {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": [...], ...}
    adapter_model.safetensors   base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (r, C), ...

attnlab adapts q, k and v as row ranges of its stacked qkv_proj, each with its own A and B: exactly
PEFT's adapters on a Llama's separate q_proj, k_proj and v_proj. The other targets are renames (out:
o_proj; gate, up, down: the MLP's gate_proj, up_proj, down_proj). GPT-2's fused c_attn and Mixtral's
experts are not mapped yet: they are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from attnlab.errors import AttnlabError
from attnlab.interop.hf.llama import export_problems, is_mixtral
from attnlab.io import read_safetensors, write_json, write_safetensors
from attnlab.models.gpt import GPTConfig
from attnlab.nn.lora import LoRAConfig

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# attnlab's target -> (the module attnlab adapts inside a block, the Llama module PEFT adapts)
MODULES = {"q": ("attn.qkv_proj", "self_attn.q_proj"), "k": ("attn.qkv_proj", "self_attn.k_proj"),
           "v": ("attn.qkv_proj", "self_attn.v_proj"), "out": ("attn.out_proj", "self_attn.o_proj"),
           "gate": ("ff.gate", "mlp.gate_proj"), "up": ("ff.up", "mlp.up_proj"),
           "down": ("ff.down", "mlp.down_proj")}  # fmt: skip
PREFIX = "base_model.model.model.layers"


def _check(cfg: GPTConfig) -> None:
    if is_mixtral(cfg):
        raise AttnlabError("PEFT adapters of a mixture of experts are not mapped yet: adapt a dense model")
    problems = export_problems(cfg)
    if problems:
        raise AttnlabError(f"a PEFT adapter names a Llama's modules, and this GPT is no Llama: {'; '.join(problems)}")


def key_pairs(cfg: GPTConfig, lora: LoRAConfig) -> list[tuple[str, str]]:
    """(attnlab adapter key, PEFT key) of every A and B tensor."""
    out = []
    for i in range(cfg.n_layer):
        for target in lora.targets:
            ours, theirs = MODULES[target]
            for part in ("lora_A", "lora_B"):
                out.append((f"blocks.{i}.{ours}.{part}.{target}", f"{PREFIX}.{i}.{theirs}.{part}.weight"))
    return out


def adapter_config(lora: LoRAConfig, base: str = "") -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for a causal LM's LoRA."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "lora_dropout": lora.dropout, "target_modules": sorted(MODULES[t][1].split(".")[-1] for t in lora.targets),
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None,
            "base_model_name_or_path": base, "use_rslora": False, "use_dora": False}  # fmt: skip


def to_peft(adapter: dict[str, Tensor], cfg: GPTConfig, lora: LoRAConfig) -> dict[str, Tensor]:
    _check(cfg)
    return {theirs: adapter[ours].contiguous() for ours, theirs in key_pairs(cfg, lora)}


def write_peft(
    folder: str | Path, adapter: dict[str, Tensor], cfg: GPTConfig, lora: LoRAConfig, base: str = ""
) -> None:
    """PEFT's two files in `folder` (made if missing; a file already there is the caller's to refuse)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / WEIGHTS, to_peft(adapter, cfg, lora), {"format": "pt"})
    write_json(out / CONFIG, adapter_config(lora, base))


def lora_config_of(peft: dict[str, Any]) -> LoRAConfig:
    """The LoRAConfig of a PEFT adapter_config.json, or one line saying what attnlab cannot read."""
    if peft.get("peft_type") != "LORA":
        raise AttnlabError(f"{CONFIG}: peft_type {peft.get('peft_type')!r}; attnlab reads LORA adapters")
    for key in ("use_dora", "use_rslora", "fan_in_fan_out"):
        if peft.get(key):
            raise AttnlabError(f"{CONFIG}: {key} is set; attnlab reads plain LoRA")
    if peft.get("bias", "none") != "none":
        raise AttnlabError(f"{CONFIG}: bias {peft['bias']!r}; attnlab's adapters train no biases")
    names = {theirs.split(".")[-1]: target for target, (_, theirs) in MODULES.items()}
    modules = peft.get("target_modules") or []
    unknown = [m for m in modules if m not in names]
    if unknown or not modules:
        raise AttnlabError(f"{CONFIG}: target_modules {modules} (attnlab maps {', '.join(names)})")
    targets = tuple(names[m] for m in sorted(modules, key=list(names).index))
    return LoRAConfig(rank=int(peft["r"]), alpha=float(peft["lora_alpha"]), dropout=float(peft.get("lora_dropout", 0)),
                      targets=targets)  # fmt: skip


def read_peft(folder: str | Path, cfg: GPTConfig) -> tuple[LoRAConfig, dict[str, Tensor]]:
    """A PEFT adapter folder -> (its LoRAConfig, attnlab adapter tensors for load_lora_state)."""
    d = Path(folder)
    try:
        peft = json.loads((d / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AttnlabError(f"{d / CONFIG}: cannot read it ({e})") from None
    lora = lora_config_of(peft)
    _check(cfg)
    tensors, _ = read_safetensors(d / WEIGHTS)
    tensors = {k.replace(".default.weight", ".weight"): v for k, v in tensors.items()}  # older PEFT wrote names
    missing = [theirs for _, theirs in key_pairs(cfg, lora) if theirs not in tensors]
    if missing:
        raise AttnlabError(f"{d / WEIGHTS} lacks {missing[0]} ({len(missing)} tensors missing)")
    return lora, {ours: tensors[theirs].float() for ours, theirs in key_pairs(cfg, lora)}
