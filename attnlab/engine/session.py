"""A training session: everything the loop (loop.py) needs, and `start`, which prepares it.

start(run, build, batches, cfg, config, dist, device, resume)
  -> the model (from the seed or the run's checkpoint), sharding, optimizer, step-0 checkpoint,
     the DDP and compile wrappers
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.data.batches import Batches
from attnlab.engine.config import TrainConfig
from attnlab.engine.fits import check_training_fits
from attnlab.engine.optim import apply_settings, make_optimizer
from attnlab.engine.saving import SNAPSHOTS, save_checkpoint
from attnlab.engine.tracking import Tracker
from attnlab.io import truncate_metrics, write_json
from attnlab.models import build_model
from attnlab.nn.stack import set_grad_checkpoint, stacks_of
from attnlab.runs.checkpoint import BackgroundWriter, load_train_state
from attnlab.runs.folder import CONFIG, METRICS, STATE, WEIGHTS
from attnlab.runs.marker import record
from attnlab.runs.weights import load_state, state_dict_api
from attnlab.runtime.device import dtype_choice
from attnlab.runtime.distributed import Dist
from attnlab.runtime.threads import share


@dataclass
class Session:
    """Everything the loop needs, prepared by `start`."""

    run: Path
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: Batches
    cfg: TrainConfig
    device: torch.device
    dtype: torch.dtype
    rng: np.random.Generator
    step: int = 0
    interrupted: bool = False  # Ctrl-C arrived while it could not be acted on
    dist: Dist = field(default_factory=Dist)
    raw: nn.Module | None = None  # the model itself, without the DDP or compile wrappers
    command: str = "lm"  # the `attnlab train` subcommand that continues this run
    saved_step: int | None = None  # the step of the checkpoint on disk
    dtype_note: str = ""  # why this precision (for --dtype auto: what was measured)
    elapsed: float = 0.0  # seconds of training so far, earlier sessions of a resumed run included
    writer: BackgroundWriter = field(default_factory=BackgroundWriter)  # checkpoints in flight
    log: TextIO | None = None  # metrics.jsonl, open while the loop runs (rank 0)
    trackers: list[Tracker] = field(default_factory=list)  # --log's, and a notebook's picture (rank 0)


def start(
    run: Path,
    build: Callable[[], nn.Module],
    data: Batches,
    cfg: TrainConfig,
    config: dict,
    d: Dist,
    device: torch.device,
    resume: bool,
    command: str = "lm",
) -> Session:
    """What every task shares once its data is ready: the model (built from the seed, or the
    run's checkpoint), sharding, optimizer, the step-0 checkpoint, DDP and compile wrappers.
    `config` is written as the run's config.json (family, model, train and the task's data)."""
    share()  # fewer threads when other attnlab/torch processes are busy on these cores (runtime/threads.py)
    tokens, _ = data.per_example
    # One line, not an allocator error; from the config (`build` may also read an --init run's weights).
    check_training_fits(
        lambda: build_model(config["family"], config["model"]), cfg.batch_size // cfg.grad_accum, tokens, device
    )
    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    model = build().to(device)
    set_grad_checkpoint(model, cfg.grad_checkpoint)  # every Stack of every family honours it
    rng = np.random.default_rng(cfg.seed)
    state = load_train_state(run / STATE, rng) if resume else None
    if state is not None:
        load_state(model, state.weights, run / STATE)  # whole weights, before any sharding
    if cfg.parallel == "fsdp" and d.enabled:  # each process keeps 1/world of every block's parameters (alone: all)
        from torch.distributed.fsdp import fully_shard  # torch's FSDP: 2.5 s to import, for --parallel fsdp alone

        for block in (b for stack in stacks_of(model) for b in stack):
            fully_shard(block)
        fully_shard(model)
    width = max((stack.cfg.d_model for stack in stacks_of(model)), default=384)  # what bf16 is measured at
    dtype, note = dtype_choice(cfg.dtype, device, width)
    s = Session(
        run,
        model,
        make_optimizer(model, cfg),
        data,
        cfg,
        device,
        dtype,
        rng,
        dist=d,
        raw=model,
        command=command,
        dtype_note=note,
    )
    if state is not None:
        if state.optimizer["state"]:  # empty at step 0: a fresh optimizer is that state
            api = state_dict_api()
            options = api.StateDictOptions(full_state_dict=True)
            api.set_optimizer_state_dict(model, s.optimizer, state.optimizer, options=options)
        apply_settings(s.optimizer, cfg)
        s.step = s.saved_step = state.step
        s.elapsed = state.elapsed
    if d.main and resume:
        truncate_metrics(run / METRICS, s.step)
    if d.main:
        record(run, CONFIG, STATE, WEIGHTS, METRICS, "loss.png", *[SNAPSHOTS] * bool(cfg.snapshot_every))
        write_json(run / CONFIG, config)  # the settings in force (a resume may change some)
    if not resume:
        save_checkpoint(s)  # step 0: from here on the run directory is complete and resumable
    if d.enabled and cfg.parallel == "ddp":  # gradients averaged over processes in backward
        s.model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        s.model = torch.compile(s.model)
    return s
