"""Run directories: saving and loading models, tokenizers and training state, safely.

A run directory holds
    config.json               family, model, training and data settings (JSON)
    model.safetensors         the weights
    tokenizer.json            the tokenizer
    train_state.safetensors   optimizer moments and RNG states (tensors only)
    train_state.json          step, optimizer hyperparameters, numpy RNG state
    metrics.jsonl, loss.png   what training measured
Nothing is pickled, so loading a run never executes code from it. Every file is written
to a temporary name and renamed into place, so a crash mid-save leaves the previous file.
The step is stored in the weights' metadata and in both state files; resuming checks that
they agree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from attnlab.errors import AttnlabError

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
STATE_TENSORS, STATE_JSON = "train_state.safetensors", "train_state.json"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp) and rename tmp over path (atomic on POSIX and Windows)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2))


def clean_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors, each stored once (tied weights are shared), without wrappers'
    name prefixes (torch.compile's `_orig_mod.`, DDP's `module.`)."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        name = name.replace("_orig_mod.", "").removeprefix("module.")
        key = (t.data_ptr(), t.shape, t.dtype) if t.numel() else None
        if key in seen:
            continue
        if key is not None:
            seen.add(key)
        out[name] = t.detach().cpu().contiguous()
    return out


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    tensors = clean_state_dict(model)
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=metadata or {}))


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a missing or broken file is a user error."""
    from safetensors import safe_open

    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        return load_file(str(path)), meta
    except (SafetensorError, OSError, ValueError) as e:
        raise AttnlabError(f"{path} is corrupt or truncated ({e})") from None


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load weights into model; returns the file's metadata. Tied weights may be absent."""
    tensors, meta = read_safetensors(path)
    result = model.load_state_dict(tensors, strict=False)
    tied = {n for n, p in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise AttnlabError(
            f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    return meta


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise AttnlabError(f"{path} is corrupt ({e})") from None


def check_run_dir(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise AttnlabError(f"run directory not found: {p}")
    for name in (CONFIG, WEIGHTS, TOKENIZER):
        if not (p / name).is_file():
            raise AttnlabError(f"{p} is not a complete run: {name} is missing")
    return p


# ---- training state: optimizer + every RNG, as tensors and JSON ----------------------------


def save_train_state(
    run: Path, step: int, optimizer: torch.optim.Optimizer, rng: np.random.Generator, extra: dict[str, Any]
) -> None:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"opt.{pid}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta = {"step": str(step)}
    atomic_write(run / STATE_TENSORS, lambda p: save_file(tensors, str(p), metadata=meta))
    state = {"step": step, "param_groups": sd["param_groups"], "numpy_rng": rng.bit_generator.state, **extra}
    write_json(run / STATE_JSON, state)


def load_train_state(
    run: Path, optimizer: torch.optim.Optimizer, rng: np.random.Generator, model_step: int
) -> dict[str, Any]:
    """Restore optimizer and RNGs in place; return the JSON state (step, extras)."""
    state = read_json(run / STATE_JSON)
    tensors, meta = read_safetensors(run / STATE_TENSORS)
    if not (int(meta.get("step", -1)) == state.get("step") == model_step):
        raise AttnlabError(
            f"{run}: the saved weights (step {model_step}) and training state (step {state.get('step')}) "
            "disagree, probably from a crash mid-save; cannot resume exactly"
        )
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        if key.startswith("opt."):
            _, pid, name = key.split(".", 2)
            opt_state.setdefault(int(pid), {})[name] = t
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    rng.bit_generator.state = state["numpy_rng"]
    return state
