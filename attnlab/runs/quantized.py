"""Quantized runs: a language model's weights stored int8, int4 or bfloat16 for inference (quant/packed.py).

    attnlab quantize RUN --to int8 --out DIR    a run folder every command loads: model.safetensors holds
                                                each packed layer's codes and scales (int4: and zeros)
                                                beside the float weights of the rest
    attnlab sample RUN --quantize int8          the same, in memory, for one command (chat, eval, serve too)
    attnlab.load(RUN, quantize="int8")          the Python API

config.json then holds
    "quantized": {"kind": "int8", "group": 32, "from": "runs/demo",
                  "layers": {"blocks.0.attn.qkv_proj": "int8", ..., "head": "float32"}}
Packed: every linear layer of the blocks (attention, feed-forward, each expert's) and the output layer
(the LM head, a third of GPT-2 small's weights, read whole at every step). Kept float32: embeddings
and positions (a decode step reads one row of them), norms, a mixture's router (tiny, and its choice
of experts is what a rounding could flip), and any layer whose shape this machine measured faster in
float32 (quant/pack_choice.py), or that int4's groups do not divide.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM
from attnlab.nn.lora import has_lora
from attnlab.quant.pack_choice import choose
from attnlab.quant.packed import GROUP, KINDS, PackedLinear, packable
from attnlab.quant.quantize import block_linears

QUANTIZED = "quantized"  # config.json's section
FLOAT = "float32"
SKIP = ("router",)  # kept float32 by name: a mixture of experts' router


@dataclass
class Quantization:
    """What quantize_for_inference did: each layer's kind ("int8", ..., or "float32"), the reason for
    each layer kept float32, and the bytes of the layers it looked at, before and after."""

    kind: str
    group: int = GROUP
    layers: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    tied: list[str] = field(default_factory=list)  # packed copies of a weight kept float too (a tied head)

    def section(self, source: str) -> dict[str, Any]:
        """config.json's "quantized" section."""
        tied = {"tied": list(self.tied)} if self.tied else {}
        return {"kind": self.kind, "group": self.group, "from": source, "layers": dict(self.layers), **tied}


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise AttnlabError(f"quantize: choose one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def inference_linears(model: nn.Module) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(name, parent, attribute, layer) of every linear layer a decode step reads in full: the blocks'
    matrices and the output layer. Asks the model (CausalLM); other families are refused in one line."""
    if not isinstance(model, CausalLM):
        raise AttnlabError(
            f"quantize: a {type(model).__name__} is not a language model; quantized weights are "
            "for decoding (GPT runs, and Llama or Mixtral checkpoints converted to one)"
        )
    if has_lora(model):
        raise AttnlabError(
            "quantize: this model has LoRA adapters; merge them into its base first "
            "(attnlab merge RUN --out DIR) and quantize that"
        )
    found = block_linears(model, (nn.Linear, PackedLinear))
    head = model.output_layer()
    names = {id(m): n for n, m in model.named_modules()}
    for parent in model.modules():
        for attr, child in parent.named_children():
            if child is head:
                found.append((f"{names[id(parent)]}.{attr}".lstrip("."), parent, attr, child))
    return found


def quantize_for_inference(
    model: nn.Module, kind: str, every_layer: bool = False, compiled: bool = False
) -> Quantization:
    """Replace, in place, the model's decode-step linears (inference_linears) by PackedLinear layers of
    `kind`, except those kept float32: SKIP, a shape the kernel cannot take, and (unless `every_layer`)
    a shape measured faster in float32 here (`compiled`: by the products a compiled decode step runs,
    quant/pack_choice.py). The model is put in eval mode: packed layers do not train."""
    report = Quantization(check_kind(kind))
    device, tied = next(model.parameters()).device, tied_weights(model)
    for name, parent, attr, layer in inference_linears(model):
        if not isinstance(layer, nn.Linear):
            raise AttnlabError(f"quantize: {name} is already {layer.kind}; quantize the float run instead")
        before = sum(p.numel() * p.element_size() for p in layer.parameters())
        why = _kept_float(name, layer, kind, device, not every_layer, compiled)
        if why:
            report.layers[name], report.kept[name] = FLOAT, why
            after = before
        else:
            packed = PackedLinear.from_linear(layer, kind)
            packed.tied = id(layer.weight) in tied
            report.tied += [name] if packed.tied else []
            setattr(parent, attr, packed)
            report.layers[name], after = kind, packed.stored_bytes()
        report.bytes_before, report.bytes_after = report.bytes_before + before, report.bytes_after + after
    return _evaluating(model, report)


def tied_weights(model: nn.Module) -> set[int]:
    """ids of the parameters more than one module holds (a head tied to the embedding): a packed copy
    of one is not counted again as a parameter (nn/counting.py)."""
    held = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    return {i for i, n in held.items() if n > 1}


def _kept_float(
    name: str, layer: nn.Linear, kind: str, device: torch.device, measure: bool, compiled: bool
) -> str | None:
    """Why this layer stays float32, or None to pack it."""
    if any(name == s or name.endswith("." + s) for s in SKIP):
        return "a mixture's router: its choice of experts is kept exact"
    if not packable(layer, kind):
        return f"{layer.in_features} inputs are not whole blocks of {GROUP}, which the {kind} kernel needs"
    if measure:
        choice = choose(kind, (layer.out_features, layer.in_features), device, compiled)
        return None if choice.pack else choice.note
    return None


def _evaluating(model: nn.Module, report: Quantization) -> Quantization:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return report


def rebuild_packed(model: nn.Module, section: dict[str, Any]) -> None:
    """Put empty PackedLinear layers where config.json's "quantized" section says, so that the run's
    weights file loads into them (load_state checks every name and shape)."""
    layers, group = section.get("layers"), section.get("group", GROUP)
    if not isinstance(layers, dict) or not isinstance(group, int):
        raise AttnlabError("config.json's quantized section is corrupt: it needs layers and group")
    places = {name: (parent, attr, layer) for name, parent, attr, layer in inference_linears(model)}
    tied = tied_weights(model)
    for name, kind in layers.items():
        if kind == FLOAT:
            continue
        if name not in places or kind not in KINDS:
            raise AttnlabError(
                f"config.json's quantized section names {name!r} as {kind!r}: this model has no "
                "such layer or attnlab no such kind"
            )
        parent, attr, layer = places[name]
        packed = PackedLinear(layer.in_features, layer.out_features, kind, layer.bias is not None, group)
        packed.tied = id(layer.weight) in tied
        setattr(parent, attr, packed)
    _evaluating(model, Quantization(section.get("kind", "")))


def quantized_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's quantized section, or None for a float run."""
    section = config.get(QUANTIZED)
    if section is not None and not isinstance(section, dict):
        raise AttnlabError("config.json's quantized section is corrupt: expected a table")
    return section


def describe(report: Quantization) -> str:
    """One line: what was packed and what stayed float32. The megabytes are those of the layers looked
    at (their weights and biases in memory), not a file's: embeddings and norms are not among them."""
    packed = sum(k != FLOAT for k in report.layers.values())
    line = (
        f"{packed} of {len(report.layers)} layers as {report.kind} (those layers {report.bytes_before / 1e6:.1f} "
        f"MB -> {report.bytes_after / 1e6:.1f} MB)"
    )
    if report.kept:
        reasons = sorted(set(report.kept.values()))
        line += f"; {len(report.kept)} kept float32 ({'; '.join(reasons[:3])})"
    return line
