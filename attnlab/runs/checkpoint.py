"""Training state: weights, optimizer moments, every RNG state and the step, in one file.

A checkpoint is train_state.safetensors (what resuming needs) and model.safetensors (the weights),
written state first: a kill between the two leaves a run that resumes. Training writes them on a
thread of its own (`BackgroundWriter`) from copies taken at the step, so the steps go on while the
bytes go to disk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors, snapshot, write_safetensors
from attnlab.runs.folder import STATE, WEIGHTS


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
        state = TrainState(
            int(meta["step"]),
            weights,
            {"state": opt, "param_groups": meta_state["param_groups"]},
            float(meta.get("elapsed", 0.0)),
        )
        torch.set_rng_state(tensors["rng.torch"])
        rng.bit_generator.state = meta_state["numpy_rng"]
    except (KeyError, ValueError, TypeError) as e:
        raise AttnlabError(f"{path} is corrupt, cannot resume ({type(e).__name__}: {e})") from None
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    # Saved from every GPU of rank 0's machine; one resuming with fewer GPUs restores those it has.
    for i, generator in enumerate(cuda[: torch.cuda.device_count() if torch.cuda.is_available() else 0]):
        torch.cuda.set_rng_state(generator, i)
    return state
