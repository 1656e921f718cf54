"""Run directories: saving and loading models, tokenizers and training state, safely.

A run directory holds
    config.json               family, model, training and data settings (JSON)
    model.safetensors         the weights
    tokenizer.json            the tokenizer
    train_state.safetensors   what resuming needs, in one file: the weights, optimizer moments,
                              every RNG state, the step, optimizer settings (JSON metadata)
    metrics.jsonl, loss.png   what training measured
Nothing is pickled, so loading a run never executes code from it. Every file is written
to a temporary name, flushed to disk and renamed into place, so a crash mid-save leaves the
previous version of the file whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from attnlab.errors import AttnlabError

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
STATE = "train_state.safetensors"
SECTIONS = ("model", "train", "data")


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp) and rename tmp over path (atomic on POSIX and Windows)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # on disk before it takes the old file's place
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2))


def model_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a plain or FSDP-sharded model (every process must call it under
    FSDP; rank 0 gets them), each stored once: a tied weight only under its first name."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    return {k: v for k, v in weights.items() if k not in tied_names(model)}


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    write_weights(model_weights(model), path, metadata)


def write_weights(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=metadata or {}))


def tied_names(model: nn.Module) -> set[str]:
    """Names under which a parameter appears a second time (e.g. the LM head tied to the embedding)."""
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a missing or broken file is a user error."""
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise AttnlabError(f"{path} is corrupt or truncated ({e})") from None


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load weights into model; returns the file's metadata."""
    tensors, meta = read_safetensors(path)
    load_state(model, tensors, path)
    return meta


def load_state(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """model.load_state_dict that reports a mismatch as one line. Tied weights may be absent."""
    try:
        result = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shapes that do not fit
        raise AttnlabError(f"{path}: weights do not fit the model ({str(e).splitlines()[-1].strip()})") from None
    missing = [k for k in result.missing_keys if k not in tied_names(model)]
    if missing or result.unexpected_keys:
        raise AttnlabError(
            f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise AttnlabError(f"{path} is corrupt ({e})") from None


def read_run_config(run: Path) -> dict[str, Any]:
    """config.json of a run, checked to have its family and its three settings tables."""
    config = read_json(run / CONFIG)
    if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in SECTIONS):
        raise AttnlabError(f"{run / CONFIG} is corrupt: it needs model, train and data tables")
    config.setdefault("family", "gpt")
    return config


def check_run_dir(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise AttnlabError(f"run directory not found: {p}")
    for name in (CONFIG, WEIGHTS):
        if not (p / name).is_file():
            raise AttnlabError(f"{p} is not a complete run: {name} is missing")
    return p


def check_dir(out: Path, resume: bool, force: bool) -> None:
    """Before a run starts: --resume needs a run in `out`; a new run needs `out` free, or --force
    and an attnlab run there (never another folder)."""
    if resume:
        check_run_dir(out)
        return
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise AttnlabError(f"run directory {out} already exists: use --resume to continue it or --force to replace it")
    if not (out / CONFIG).is_file():  # --force replaces runs, never other folders
        raise AttnlabError(f"{out} is not an attnlab run directory: refusing to replace it; choose another --out")


def fresh_dir(out: Path) -> None:
    """Called once the new run is ready to be written, so a failed start never costs an old run."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    out.mkdir(parents=True)


def read_metrics(path: Path) -> list[dict]:
    """The rows of metrics.jsonl (none if it is missing); a line cut short by a crash is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the checkpoint we resume from, so curves do not double back."""
    rows = [r for r in read_metrics(path) if r["step"] <= step]
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


# ---- training state: weights, optimizer, every RNG, step: one file ------------------------


@dataclass
class TrainState:
    """What resuming needs. Weights and optimizer state are whole (gathered from every process
    under FSDP) and keyed by parameter name, so any number of processes can resume them."""

    step: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]  # {"state": {name: {key: tensor}}, "param_groups": [{..., "params": [name]}]}


def save_train_state(path: Path, state: TrainState, rng: np.random.Generator) -> None:
    """One safetensors file (tensors + JSON metadata), so that a crash mid-save leaves the
    previous state whole, never half of two."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in state.weights.items()}
    for name, values in state.optimizer["state"].items():
        for k, v in values.items():
            tensors[f"opt::{name}::{k}"] = torch.as_tensor(v).detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta_state = {"param_groups": state.optimizer["param_groups"], "numpy_rng": rng.bit_generator.state}
    meta = {"step": str(state.step), "state": json.dumps(meta_state)}
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=meta))


def load_train_state(path: Path, rng: np.random.Generator) -> TrainState:
    """Read `save_train_state`'s file and restore every RNG from it."""
    tensors, meta = read_safetensors(path)
    try:
        meta_state = json.loads(meta["state"])
        weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        opt: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            if key.startswith("opt::"):
                _, name, k = key.split("::")
                opt.setdefault(name, {})[k] = t
        state = TrainState(int(meta["step"]), weights, {"state": opt, "param_groups": meta_state["param_groups"]})
        torch.set_rng_state(tensors["rng.torch"])
        rng.bit_generator.state = meta_state["numpy_rng"]
    except (KeyError, ValueError, TypeError) as e:
        raise AttnlabError(f"{path} is corrupt, cannot resume ({type(e).__name__}: {e})") from None
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    return state
