"""A model's weights to and from safetensors: whole (gathered from every process under FSDP), each
tied weight stored once, every mismatch or non-finite value one line."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from types import ModuleType

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors, snapshot, write_safetensors
from attnlab.nn.lora import adapter_names, has_lora
from attnlab.nn.objective import inner


def state_dict_api() -> ModuleType:
    """torch.distributed.checkpoint.state_dict: whole weights and optimizer state of plain, DDP and
    FSDP models alike, what saving and resuming read and write through."""
    import torch.distributed.checkpoint.state_dict as api  # torch.distributed.checkpoint: 2.4 s to import

    return api


def model_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a plain or FSDP-sharded model (every process must call it under
    FSDP; rank 0 gets them), each stored once: a tied weight only under its first name."""
    model = inner(model)  # an objective's (DPO's, a reward model's) weights are its model's
    if has_lora(model):  # a LoRA run saves what trains; its frozen base is the base run's
        keep = trained_names(model)
        if not any(hasattr(p, "full_tensor") for p in model.parameters()):  # unsharded: only those, not a
            return {k: v.detach().cpu() for k, v in model.state_dict().items() if k in keep}  # whole copy
    api = state_dict_api()
    options = api.StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = api.get_model_state_dict(model, options=options)
    if has_lora(model):
        return {k: v for k, v in weights.items() if k in keep}
    tied = tied_names(model)  # once: asked per tensor, it made a save quadratic in depth (152 s at 500 layers)
    return {k: v for k, v in weights.items() if k not in tied}


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    write_weights(model_weights(model), path, metadata)


def write_weights(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    write_safetensors(path, {k: snapshot(v, copy=False) for k, v in tensors.items()}, metadata or {})


def trained_names(model: nn.Module) -> set[str]:
    """The parameters a LoRA run trains and saves: its adapters, and a new head beside them."""
    return {n for n, p in model.named_parameters() if p.requires_grad} | adapter_names(model)


def tied_names(model: nn.Module) -> set[str]:
    """Names under which a parameter appears a second time (e.g. the LM head tied to the embedding)."""
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load weights into model; returns the file's metadata."""
    tensors, meta = read_safetensors(path)
    load_state(model, tensors, path)
    return meta


def first_not_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or an infinity, if any."""
    return next((k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)


def _diverged(path: Path, name: str) -> AttnlabError:
    return AttnlabError(
        f"{path}: the weights hold NaN or infinite values (first in {name}): this run diverged; "
        "train it again, with a lower --lr"
    )


def _misfit(path: Path, missing: list[str], unexpected: list[str]) -> AttnlabError:
    return AttnlabError(f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")


def load_state(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, new: Collection[str] = ()) -> None:
    """model.load_state_dict that reports a mismatch, or a weight that is not a finite number, as one
    line. Tied weights may be absent, and those named in `new` (a head the file's model has not got)."""
    model = inner(model)
    bad = first_not_finite(tensors)
    if bad is not None:
        raise _diverged(path, bad)
    try:
        result = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shapes that do not fit
        raise AttnlabError(f"{path}: weights do not fit the model ({str(e).splitlines()[-1].strip()})") from None
    tied = tied_names(model)
    keep = trained_names(model) if has_lora(model) else None  # a LoRA run's file: what trains alone
    missing = [k for k in result.missing_keys if k not in tied and k not in new and (keep is None or k in keep)]
    if missing or result.unexpected_keys:
        raise _misfit(path, missing, result.unexpected_keys)


def load_streamed(model: nn.Module, path: Path, new: Collection[str] = ()) -> None:
    """load_weights one tensor at a time, each copied into its place and let go: the memory of the
    model and one tensor, where reading the whole file first holds two copies of the model (a 124M
    base: 0.5 GB less at its peak). The same checks, one line each: names, shapes, finite values."""
    own = model.state_dict(keep_vars=True)  # name -> the parameter or buffer itself
    skip = tied_names(model) | set(new)
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())  # the file's order: the first bad tensor is the one load_state names
            missing, unexpected = sorted(set(own) - set(names) - skip), sorted(set(names) - set(own))
            if missing or unexpected:
                raise _misfit(path, missing, unexpected)
            for name in names:
                t = f.get_tensor(name)
                if t.shape != own[name].shape:
                    raise AttnlabError(
                        f"{path}: weights do not fit the model ({name} is {tuple(t.shape)}, "
                        f"the model's {tuple(own[name].shape)})"
                    )
                if first_not_finite({name: t}):
                    raise _diverged(path, name)
                with torch.no_grad():
                    own[name].copy_(t)
    except (SafetensorError, OSError) as e:
        raise AttnlabError(f"{path} is corrupt or truncated ({e})") from None
