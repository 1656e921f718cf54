"""LoRA adapters in PEFT's layout, both ways, for GPT runs that export as GPT-2 or as a Llama.

    adapter_config.json         {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": [...], ...}
    adapter_model.safetensors   base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (r, C), ...

Legend: C model width, r rank, n the parts (of q, k, v) one fused matrix carries, O output rows.

attnlab adapts q, k and v as row ranges of its stacked qkv_proj, each with its own A and B. A Llama
has separate q_proj, k_proj and v_proj, each one of those parts; the other targets are renames (out:
o_proj; gate, up, down: the MLP's). GPT-2 fuses q, k and v into one c_attn, and its matrices are
Conv1D, stored (in, out): PEFT flags them fan_in_fan_out, yet their adapters' A (r, in) and B
(out, r) are laid out as a Linear's, so no tensor is transposed. For c_attn, both ways exact:
    attnlab -> PEFT   A is the parts' A stacked (n r, C); B holds each part's B in its rows and its
                      own r columns, zeros elsewhere (3C, n r): rank n r with lora_alpha n alpha
                      (rank_pattern, alpha_pattern), so the scale alpha / r stays the same
    PEFT -> attnlab   q, k and v each take c_attn's A and their rows of its B
PEFT lets each matrix have its own rank and alpha; attnlab has one of each, so reading pads every
adapter to the largest rank with zeros and folds each matrix's own scale into its B (exact too).
Mixtral's experts, other modules, DoRA and the like are refused in one line.

An adapter folder comes from somebody else: adapter_config.json is read and checked by peft_config.py;
every tensor's name and shape is checked against its rank and the base's matrices from the file's
header, before any is read; adapter_model.bin, a pickle, is refused unopened, as a HuggingFace
folder's pytorch_model.bin is (interop/hf/io.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import AttnlabError
from attnlab.interop.hf import expected_shapes, gpt2, llama
from attnlab.interop.hf.io import PICKLES, folder_file, pickle_refusal, shapes_of
from attnlab.interop.peft_config import CONFIG, alpha_of, rank_of, read_peft_config
from attnlab.io import read_safetensors, write_json, write_safetensors
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.lora import TARGETS, LoRAConfig

WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model"  # PeftModel's names: its LoraModel, then the HuggingFace model


@dataclass(frozen=True)
class Layout:
    """Where a HuggingFace model keeps its blocks, and which of their modules are attnlab's targets."""

    name: str
    layers: str  # the blocks, under the HuggingFace model
    modules: dict[str, tuple[str, str]]  # target -> (attnlab module in a block, HuggingFace module in a layer)
    conv1d: bool  # its matrices are Conv1D (PEFT saves fan_in_fan_out true)

    def carried(self, module: str) -> tuple[str, ...]:
        """The targets a HuggingFace module holds: q, k and v for a fused c_attn, else one."""
        return tuple(t for t, (_, theirs) in self.modules.items() if theirs == module)

    def key(self, i: int, module: str) -> str:
        return f"{self.layers}.{i}.{module}"


# Each LoRA target's module in our blocks, the same in every family (q, k and v share the fused projection).
OURS = {
    **dict.fromkeys("qkv", "attn.qkv_proj"),
    "out": "attn.out_proj",
    "gate": "ff.gate",
    "up": "ff.up",
    "down": "ff.down",
}


def _paired(theirs: dict[str, str]) -> dict[str, tuple[str, str]]:
    """target -> (our module, theirs), for the targets a family's HuggingFace layer names."""
    return {target: (OURS[target], module) for target, module in theirs.items()}


LLAMA_MODULES = {t: f"self_attn.{t}_proj" for t in "qkv"} | {"out": "self_attn.o_proj"}
LLAMA_MODULES |= {t: f"mlp.{t}_proj" for t in ("gate", "up", "down")}
LLAMA = Layout("Llama", "model.layers", _paired(LLAMA_MODULES), conv1d=False)
GPT2_MODULES = {**dict.fromkeys("qkv", "attn.c_attn"), "out": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"}
GPT2 = Layout("GPT-2", "transformer.h", _paired(GPT2_MODULES), conv1d=True)
# The HuggingFace model a GPT exports as (interop/convert.py's order): its adapter names that model's modules.
LAYOUTS = ((gpt2, GPT2), (llama, LLAMA))


def layout_of(cfg: GPTConfig) -> Layout:
    """The layout of the HuggingFace model this GPT exports as, or one line saying why there is none."""
    if llama.is_mixtral(cfg):
        raise AttnlabError("PEFT adapters of a mixture of experts are not mapped yet: adapt a dense model")
    needs = {}
    for module, layout in LAYOUTS:
        needs[layout.name] = module.export_problems(cfg)
        if not needs[layout.name]:
            return layout
    said = " -- nor a ".join(f"{name}: {'; '.join(why)}" for name, why in needs.items())
    raise AttnlabError(f"a PEFT adapter names a HuggingFace model's modules, and this GPT is no {said}")


def qkv_rows(cfg: GPTConfig) -> dict[str, tuple[int, int]]:
    """The rows of the stacked q | k | v matrix that each of q, k and v holds."""
    q, kv = cfg.n_head * cfg.head_width, (cfg.n_kv_head or cfg.n_head) * cfg.head_width
    return {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}


def modules_of(layout: Layout, targets: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """HuggingFace module -> the given targets it carries, in attnlab's order."""
    out: dict[str, tuple[str, ...]] = {}
    for t in (t for t in TARGETS if t in targets):
        if t not in layout.modules:
            raise AttnlabError(f"LoRA target {t!r} has no module in {layout.name}'s layout")
        out[layout.modules[t][1]] = (*out.get(layout.modules[t][1], ()), t)
    return out


def _short(layout: Layout, module: str) -> str:
    """The shortest end of a module's name that names it alone (c_attn; attn.c_proj beside mlp.c_proj)."""
    parts = module.split(".")
    for n in range(1, len(parts) + 1):
        name = ".".join(parts[-n:])
        if sum(m == name or m.endswith("." + name) for m in {m for _, m in layout.modules.values()}) == 1:
            return name
    return module


def adapter_config(lora: LoRAConfig, base: str = "", layout: Layout = LLAMA) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for a causal LM's LoRA. A fused module carrying n parts
    has rank n r and lora_alpha n alpha, in rank_pattern and alpha_pattern: the same scale."""
    modules = modules_of(layout, lora.targets)
    fused = {_short(layout, m): len(ts) for m, ts in modules.items() if len(layout.carried(m)) > 1}
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "rank_pattern": {m: n * lora.rank for m, n in fused.items() if n > 1},
        "alpha_pattern": {m: n * lora.alpha for m, n in fused.items() if n > 1},
        "lora_dropout": lora.dropout,
        "target_modules": sorted(_short(layout, m) for m in modules),
        "bias": "none",
        "fan_in_fan_out": layout.conv1d,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": base,
        "use_rslora": False,
        "use_dora": False,
    }


def _fuse(a: list[Tensor], b: list[Tensor], rows: list[tuple[int, int]], height: int) -> tuple[Tensor, Tensor]:
    """The parts' adapters as one of rank n r on the whole fused matrix: A (n r, C), B (height, n r)."""
    r = a[0].shape[0]
    fused = b[0].new_zeros(height, len(b) * r)  # (3C, n r): each part its rows and its own columns
    for j, (part, (lo, hi)) in enumerate(zip(b, rows, strict=True)):
        fused[lo:hi, j * r : (j + 1) * r] = part
    return torch.cat(a), fused


def adapter_keys(layout: Layout, cfg: GPTConfig, lora: LoRAConfig) -> set[str]:
    """The names of an attnlab adapter's A and B tensors (nn/lora.py lora_state_dict)."""
    return {
        f"blocks.{i}.{layout.modules[t][0]}.lora_{ab}.{t}"
        for i in range(cfg.n_layer)
        for t in lora.targets
        for ab in "AB"
    }


def to_peft(adapter: dict[str, Tensor], cfg: GPTConfig, lora: LoRAConfig) -> dict[str, Tensor]:
    """attnlab's adapter tensors -> PEFT's, named as PeftModel.save_pretrained names them."""
    layout, rows = layout_of(cfg), qkv_rows(cfg)
    expected = adapter_keys(layout, cfg, lora)
    if missing := sorted(expected - set(adapter)):
        raise AttnlabError(f"the adapter lacks {missing[0]} ({len(missing)} of its {len(expected)} tensors missing)")
    if extra := sorted(set(adapter) - expected):
        raise AttnlabError(f"the adapter holds {extra[0]} beside LoRA's A and B: a PEFT adapter has no place for it")
    out = {}
    for i in range(cfg.n_layer):
        for module, targets in modules_of(layout, lora.targets).items():
            ours = f"blocks.{i}.{layout.modules[targets[0]][0]}"
            a = [adapter[f"{ours}.lora_A.{t}"] for t in targets]
            b = [adapter[f"{ours}.lora_B.{t}"] for t in targets]
            if len(layout.carried(module)) > 1:  # c_attn: q, k and v in one matrix
                a, b = _fuse(a, b, [rows[t] for t in targets], rows["v"][1])
            else:
                a, b = a[0], b[0]
            key = f"{PREFIX}.{layout.key(i, module)}"
            out[f"{key}.lora_A.weight"], out[f"{key}.lora_B.weight"] = a.contiguous(), b.contiguous()
    return out


def write_peft(
    folder: str | Path, adapter: dict[str, Tensor], cfg: GPTConfig, lora: LoRAConfig, base: str = ""
) -> None:
    """PEFT's two files in `folder` (made if missing; a file already there is the caller's to refuse)."""
    out = Path(folder)
    tensors = to_peft(adapter, cfg, lora)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / WEIGHTS, tensors, {"format": "pt"})
    write_json(out / CONFIG, adapter_config(lora, base, layout_of(cfg)))


def _adapted(tensors: dict[str, Any], cfg: GPTConfig, layout: Layout) -> list[str]:
    """The HuggingFace modules the file adapts, each in every layer with its A and B; anything else
    in it is one line."""
    known = {m for _, m in layout.modules.values()}
    name = re.compile(rf"{re.escape(PREFIX)}\.{re.escape(layout.layers)}\.(\d+)\.(.+)\.lora_[AB]\.weight")
    found = {}
    for key in tensors:
        m = name.fullmatch(key)
        if m is None or m[2] not in known:
            raise AttnlabError(
                f"{WEIGHTS} holds {key}: attnlab maps LoRA on {layout.name}'s {', '.join(sorted(known))} in every layer"
            )
        found.setdefault(m[2], set()).add(key)
    for module in found:
        for i in range(cfg.n_layer):
            for part in ("lora_A", "lora_B"):
                if f"{PREFIX}.{layout.key(i, module)}.{part}.weight" not in tensors:
                    raise AttnlabError(f"{WEIGHTS} lacks {layout.key(i, module)}.{part}: attnlab adapts every block")
    if not found:
        raise AttnlabError(f"{WEIGHTS} holds no LoRA tensors")
    return sorted(found, key=[m for _, m in layout.modules.values()].index)


def _check_targets(peft: dict[str, Any], modules: list[str], layout: Layout) -> None:
    """target_modules (when a list) and the modules the file adapts name each other: each name is of a
    module the file adapts, and each module the file adapts is named."""
    targets = peft.get("target_modules")
    if not isinstance(targets, list):
        return
    for name in targets:
        if not any(m == name or m.endswith("." + name) for m in modules):
            known = {_short(layout, m) for _, m in layout.modules.values()}
            raise AttnlabError(
                f"{CONFIG}: target_modules names {name!r}, but {WEIGHTS} adapts no such module "
                f"(attnlab maps {layout.name}'s {', '.join(sorted(known))})"
            )
    for m in modules:
        if not any(m == name or m.endswith("." + name) for name in targets):
            raise AttnlabError(f"{WEIGHTS} adapts {m}, which {CONFIG}'s target_modules does not name")


def _check_shapes(peft: dict[str, Any], shapes: dict, cfg: GPTConfig, layout: Layout, modules: list[str]) -> None:
    """Every A is (rank, in) and every B (out, rank), rank the module's (rank_pattern, else r) and in,
    out its matrix's in the base (the stacked q | k | v: the rows of the parts it carries)."""
    base, rows = expected_shapes(GPT, replace(cfg, n_layer=1)), qkv_rows(cfg)  # one block on the meta device
    for module in modules:
        parts = layout.carried(module)
        out, width = base[f"blocks.0.{layout.modules[parts[0]][0]}.weight"]
        if layout.modules[parts[0]][0] == "attn.qkv_proj":
            out = sum(rows[t][1] - rows[t][0] for t in parts)
        for i in range(cfg.n_layer):
            key = layout.key(i, module)
            r = rank_of(peft, key)
            for ab, want in (("A", (r, width)), ("B", (out, r))):
                got = tuple(shapes[f"{PREFIX}.{key}.lora_{ab}.weight"])
                if got != want:
                    raise AttnlabError(
                        f"{WEIGHTS}: {key}.lora_{ab} has shape {list(got)}; rank {r} ({CONFIG}) "
                        f"on the base's {width} -> {out} matrix needs {list(want)}"
                    )


def _pair(tensors: dict[str, Tensor], key: str) -> tuple[Tensor, Tensor]:
    """A module's A and B, in float32 (a file may hold them in half precision)."""
    return tuple(tensors[f"{PREFIX}.{key}.lora_{ab}.weight"].float() for ab in "AB")  # type: ignore[return-value]


def from_peft(peft: dict[str, Any], tensors: dict[str, Tensor], cfg: GPTConfig) -> tuple[LoRAConfig, dict[str, Tensor]]:
    """PEFT's config and tensors -> (attnlab's LoRAConfig, its adapter tensors), every module padded
    to the largest rank R, its B scaled by its own scale over the adapter's (alpha / r)."""
    layout, rows = layout_of(cfg), qkv_rows(cfg)
    modules = _adapted(tensors, cfg, layout)
    rank = max(_pair(tensors, layout.key(i, m))[0].shape[0] for i in range(cfg.n_layer) for m in modules)
    scale = float(peft.get("lora_alpha", 8)) / int(peft.get("r", 8))  # PEFT's defaults
    out = {}
    for i in range(cfg.n_layer):
        for module in modules:
            a, b = _pair(tensors, layout.key(i, module))  # (r_m, I), (O, r_m)
            own = alpha_of(peft, layout.key(i, module)) / a.shape[0]
            a, b = F.pad(a, (0, 0, 0, rank - a.shape[0])), F.pad(b, (0, rank - a.shape[0]))  # (R, I), (O, R)
            b = b * (own / scale) if own != scale else b
            parts = layout.carried(module)
            for t in parts:
                lo, hi = rows[t] if len(parts) > 1 else (0, b.shape[0])
                ours = f"blocks.{i}.{layout.modules[t][0]}"
                out[f"{ours}.lora_A.{t}"], out[f"{ours}.lora_B.{t}"] = a.clone(), b[lo:hi].clone()
    targets = tuple(t for m in modules for t in layout.carried(m))
    lora = LoRAConfig(rank=rank, alpha=scale * rank, dropout=float(peft.get("lora_dropout") or 0), targets=targets)
    return lora, out


def read_peft(folder: str | Path, cfg: GPTConfig) -> tuple[LoRAConfig, dict[str, Tensor]]:
    """A PEFT adapter folder -> (its LoRAConfig, attnlab adapter tensors for load_lora_state); every
    name and shape checked from the file's header before a tensor is read."""
    d = Path(folder)
    peft = read_peft_config(d)
    layout = layout_of(cfg)  # a GPT that maps, before the weights are read
    path = folder_file(d, WEIGHTS, 2**62)
    if path is None:
        pickles = sorted(p.name for p in d.iterdir() if p.suffix in PICKLES)
        if pickles:
            raise AttnlabError(pickle_refusal(d, pickles, HOW))
        raise AttnlabError(f"{d} has no {WEIGHTS}: attnlab reads PEFT adapters saved as safetensors")
    shapes = {_renamed(k): v for k, v in shapes_of([path]).items()}
    modules = _adapted(shapes, cfg, layout)
    _check_targets(peft, modules, layout)
    _check_shapes(peft, shapes, cfg, layout, modules)
    tensors = {_renamed(k): v for k, v in read_safetensors(path)[0].items()}
    return from_peft(peft, tensors, cfg)


# How to make a PEFT adapter's safetensors from its pickle, with one's own trusted tools.
HOW = (
    "peft: PeftModel.from_pretrained(BASE_MODEL, DIR).save_pretrained(DIR, safe_serialization=True); or "
    f"safetensors.torch.save_file(torch.load(FILE), '{WEIGHTS}')"
)


def _renamed(name: str) -> str:
    return name.replace(".default.weight", ".weight")  # older PEFT wrote the adapter's name
