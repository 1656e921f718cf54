"""Run directories: saving and loading models, tokenizers and training state, safely.

A run directory holds
    attnlab.json              the run marker, written first: only a folder that has it (or a run
                              made before markers existed) is ever replaced by --force
    config.json               family, model, training and data settings (JSON)
    model.safetensors         the weights
    tokenizer.json            the tokenizer
    train_state.safetensors   what resuming needs, in one file: the weights, optimizer moments,
                              every RNG state, the step, optimizer settings (JSON metadata)
    metrics.jsonl, loss.png   what training measured
Nothing is pickled, so loading a run never executes code from it. Every file is written
to a temporary name, flushed to disk and renamed into place, so a crash mid-save leaves the
previous version of the file whole. Training writes its checkpoints on a thread of their own
(`BackgroundWriter`) from copies taken at the step, so the steps go on while the bytes go to disk.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from attnlab.errors import AttnlabError

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
STATE = "train_state.safetensors"
MARKER = "attnlab.json"  # {"attnlab": "run", "format": 1, "version": ...}
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
    except (OSError, SafetensorError) as e:
        if not disk_full(e):
            raise
        size = tmp.stat().st_size if tmp.exists() else 0
        raise AttnlabError(disk_full_message(path, size)) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def disk_full(e: BaseException) -> bool:
    """An OSError for a full disk or quota, or safetensors' wrapping of one (it keeps only the text)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return "No space left on device" in str(e) or "Disk quota exceeded" in str(e)


def disk_full_message(path: Path, written: int) -> str:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    keep = f"the previous {path.name} is intact" if path.exists() else f"{path.name} was not written"
    return (f"disk full writing {path} ({mb(written)} written when space ran out, {mb(free)} free on that disk); "
            f"{keep}: free some space and run the command again")  # fmt: skip


def mb(n: int) -> str:
    """A size in the unit that reads best: 12.3 KB, 45.6 MB, 7.8 GB."""
    unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("bytes", 1)) if n >= s or s == 1)
    return f"{n / scale:.1f} {unit}" if scale > 1 else f"{n} bytes"


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2))


def model_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a plain or FSDP-sharded model (every process must call it under
    FSDP; rank 0 gets them), each stored once: a tied weight only under its first name."""
    # Imported here: torch.distributed.checkpoint takes a second to import, which every command would pay.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    return {k: v for k, v in weights.items() if k not in tied_names(model)}


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    write_weights(model_weights(model), path, metadata)


def write_weights(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    write_safetensors(path, {k: snapshot(v, copy=False) for k, v in tensors.items()}, metadata or {})


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
    """model.load_state_dict that reports a mismatch, or a weight that is not a finite number, as one
    line. Tied weights may be absent."""
    bad = next((k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise AttnlabError(f"{path}: the weights hold NaN or infinite values (first in {bad}): this run diverged; "
                           "train it again, with a lower --lr")  # fmt: skip
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


def started_folder(path: str | Path, restart: str) -> Path:
    """A folder that exists and is past its first checkpoint (else one line ending in `restart`)."""
    p = Path(path)
    if not p.is_dir():
        raise AttnlabError(f"run directory not found: {p}")
    if unstarted(p):
        raise AttnlabError(f"{p} has no checkpoint yet (its start did not finish): {restart}")
    return p


def check_run_dir(path: str | Path) -> Path:
    """A run that loads: its config and weights are there."""
    p = started_folder(path, "start it again with the command that made it")
    for name in (CONFIG, WEIGHTS):
        if not (p / name).is_file():
            raise AttnlabError(f"{p} is not a complete run: {name} is missing")
    return p


def check_resumable(path: str | Path) -> Path:
    """A run that --resume continues: its config and training state are there (the weights are in
    the state; a kill between writing the two leaves a run that still resumes)."""
    p = started_folder(path, "run the same command without --resume to start it again")
    if not (p / CONFIG).is_file():
        raise AttnlabError(f"{p} is not a complete run: {CONFIG} is missing")
    if not is_run(p):
        raise AttnlabError(f"{p} is not an attnlab run ({describe(p)}): nothing to resume")
    if not (p / STATE).is_file():
        raise AttnlabError(f"{p} has no training state ({STATE}), so it cannot be resumed; start a new run from "
                           f"its weights with --init {p}")  # fmt: skip
    return p


def is_marked(d: Path) -> bool:
    """The folder carries attnlab's run marker."""
    try:
        marker = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("attnlab") == "run"


def is_run(d: Path) -> bool:
    """An attnlab run folder: marked, or made before markers (a config.json with attnlab's tables)."""
    if not d.is_dir():
        return False
    if is_marked(d):
        return True
    try:
        read_run_config(d)
    except AttnlabError:
        return False
    return True


def unstarted(d: Path) -> bool:
    """A run attnlab began and never checkpointed (killed or failed in its first seconds)."""
    return is_marked(d) and not (d / WEIGHTS).exists() and not (d / STATE).exists()


def check_dir(out: Path, resume: bool, force: bool) -> None:
    """Before a run starts: --resume needs a run in `out`; a new run needs `out` free (or holding
    a start of ours that never checkpointed), or --force and an attnlab run there. Anything else
    in `out` is the user's and is never replaced."""
    if resume:
        check_resumable(out)
        for tmp in out.glob(".*.tmp-*"):  # left by a kill in the middle of a save
            tmp.unlink(missing_ok=True)
        return
    if not out.exists() or (out.is_dir() and not any(out.iterdir())) or (out.is_dir() and unstarted(out)):
        return
    if not is_run(out):
        raise AttnlabError(f"{out} exists and is not an attnlab run ({describe(out)}): refusing to "
                           f"{'replace' if force else 'write into'} it; choose another --out")  # fmt: skip
    if not force:
        raise AttnlabError(f"run directory {out} already exists: use --resume to continue it or --force to replace it")


def describe(p: Path) -> str:
    """What a folder holds, in a few words: "it holds config.json, src and 3 more"."""
    if not p.is_dir():
        return "it is a file"
    names = sorted(x.name for x in p.iterdir())
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"it holds {', '.join(names[:3])}{more}"


def fresh_dir(out: Path) -> None:
    """Called once the new run is ready to be written (after check_dir said `out` may be replaced),
    so a failed start never costs an old run. The marker comes first."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    out.mkdir(parents=True)
    from attnlab import __version__

    write_json(out / MARKER, {"attnlab": "run", "format": 1, "version": __version__})


def discard_unstarted(out: Path) -> None:
    """After a failed start: remove what it wrote, if it never reached its first checkpoint."""
    if out.is_dir() and unstarted(out):
        shutil.rmtree(out, ignore_errors=True)


def read_metrics(path: Path, max_rows: int | None = None) -> list[dict]:
    """The rows of metrics.jsonl (none if it is missing), read line by line; a line cut short by a
    crash is skipped. With max_rows, a long run's training rows are thinned to about that many
    (every k-th), and every validation row is kept."""
    if not path.is_file():
        return []
    every = 1
    if max_rows is not None:
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        every = max(1, -(-lines // max_rows))
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and (n % every == 0 or "loss" not in row):
                rows.append(row)
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
    elapsed: float = 0.0  # seconds of training so far (what a time budget counts)


def train_state_file(
    state: TrainState, rng: np.random.Generator, copy: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of train_state.safetensors, with every RNG state as it is now: one
    file (tensors + JSON metadata), so that a crash mid-save leaves the previous state whole, never
    half of two.
    copy: copy tensors that are already on the CPU too (they may be the training's own, which its
    next steps change in place while a thread writes the file)."""
    tensors = {f"model.{k}": snapshot(v, copy) for k, v in state.weights.items()}
    for name, values in state.optimizer["state"].items():
        for k, v in values.items():
            tensors[f"opt::{name}::{k}"] = snapshot(torch.as_tensor(v), copy)
    tensors["rng.torch"] = torch.get_rng_state()  # a copy
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta_state = {"param_groups": state.optimizer["param_groups"], "numpy_rng": rng.bit_generator.state}
    meta = {"step": str(state.step), "elapsed": repr(float(state.elapsed)), "state": json.dumps(meta_state)}
    return tensors, meta


def snapshot(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """t on the CPU, contiguous; with copy, never sharing memory with t."""
    return t.detach().to("cpu", copy=copy).contiguous()


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=metadata))


@dataclass
class Checkpoint:
    """A checkpoint's two files, taken at one step, ready to be written by any thread."""

    state: tuple[dict[str, torch.Tensor], dict[str, str]]  # train_state.safetensors: tensors, metadata
    weights: tuple[dict[str, torch.Tensor], dict[str, str]]  # model.safetensors


def checkpoint(state: TrainState, rng: np.random.Generator, copy: bool = False) -> Checkpoint:
    """Both files of a checkpoint as they are now (copy: see train_state_file); the weights file
    reuses the state's copies of the weights."""
    tensors, meta = train_state_file(state, rng, copy)
    weights = {k: tensors[f"model.{k}"] for k in state.weights}
    return Checkpoint((tensors, meta), (weights, {"step": str(state.step)}))


def write_checkpoint(run: Path, c: Checkpoint) -> None:
    """The state first, then the weights: a kill between the two leaves a run that resumes (the
    state holds the weights too), and a kill inside either leaves that file's previous version."""
    write_safetensors(run / STATE, *c.state)
    write_safetensors(run / WEIGHTS, *c.weights)


class BackgroundWriter:
    """Runs one writing job at a time on a thread of its own, so that training goes on while a
    checkpoint goes to disk. `submit` first waits for the job before it, so files land in the
    order they were taken and at most one checkpoint waits in memory; an error in a job (a full
    disk) is raised in the training's thread by the next `check`, `submit` or `wait`. A kill at
    any moment stops the thread mid-file: atomic_write leaves that file's previous version."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()
        self.thread = threading.Thread(target=self._run, args=(job,), name="attnlab-writer")
        self.thread.start()  # not a daemon: an exiting interpreter still lets the file land

    def _run(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # raised again in the training's thread
            self.error = e

    def check(self) -> None:
        """Raise the error of a job that failed, once."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def wait(self) -> None:
        """Until the job in flight is written (then raise its error, if it failed)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.check()


def load_train_state(path: Path, rng: np.random.Generator) -> TrainState:
    """Read `train_state_file`'s file (written by `write_checkpoint`) and restore every RNG from it."""
    tensors, meta = read_safetensors(path)
    try:
        meta_state = json.loads(meta["state"])
        weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        opt: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            if key.startswith("opt::"):
                _, name, k = key.split("::")
                opt.setdefault(name, {})[k] = t
        state = TrainState(int(meta["step"]), weights, {"state": opt, "param_groups": meta_state["param_groups"]},
                           float(meta.get("elapsed", 0.0)))  # fmt: skip
        torch.set_rng_state(tensors["rng.torch"])
        rng.bit_generator.state = meta_state["numpy_rng"]
    except (KeyError, ValueError, TypeError) as e:
        raise AttnlabError(f"{path} is corrupt, cannot resume ({type(e).__name__}: {e})") from None
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    return state
