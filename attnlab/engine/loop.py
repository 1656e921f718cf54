"""The training loop every task shares: micro-batches, clipping, AdamW, checkpoints, resume.

start(run, build, batches, cfg, config, dist, device, resume)
  -> the model (from the seed or the run's checkpoint), sharding, optimizer, step-0 checkpoint
loop(session)
  -> train_step (forward/backward over micro-batches, clip, AdamW step)
     every eval_interval: validation loss, metrics, checkpoint (written by a thread of its own
     while the steps go on), now and then the plot; Ctrl-C saves and stops
  -> at the end: the plot, and the last checkpoint whole on disk
What is not a step is kept small: validation reads at most one batch per EVAL_EVERY trained,
loss.png is redrawn at most once a minute, metrics.jsonl stays open.
Every batch source answers `batch(split, n, rng, part)` and every model `model(*batch) ->
(output, loss)`, so nothing here knows which task it trains.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from attnlab.data.batches import Batches
from attnlab.engine.config import TrainConfig, budget_seconds
from attnlab.engine.fits import check_training_fits
from attnlab.engine.optim import apply_settings, lr_at, make_optimizer, set_lr
from attnlab.errors import AttnlabError
from attnlab.io import snapshot, truncate_metrics, write_json
from attnlab.models import build_model
from attnlab.nn.moe import aux_loss, routing_stats
from attnlab.nn.stack import set_grad_checkpoint, stacks_of
from attnlab.runs.checkpoint import BackgroundWriter, TrainState, checkpoint, load_train_state, write_checkpoint
from attnlab.runs.folder import CONFIG, STATE
from attnlab.runs.weights import load_state, model_weights, state_dict_api, write_weights
from attnlab.runtime import distributed
from attnlab.runtime.device import autocast, dtype_choice
from attnlab.runtime.distributed import Dist
from attnlab.viz.curves import plot_loss

# A validation estimate reads at most one batch per EVAL_EVERY micro-batches trained since the last
# one. Forward only, a batch costs about a third of a training one, so validation stays near 1.5% of
# the run whatever the interval (measured: 20 batches every 150 steps cost 3.7% of gpt-nano's demo).
EVAL_EVERY = 20
# loss.png is redrawn during training at most once a minute, and less often if drawing it took
# over 2% of that time (about 0.3 s, and 1 s for the first with matplotlib's import); always at the end.
PLOT_EVERY, PLOT_SHARE = 60.0, 0.02


@dataclass
class Session:
    """Everything the loop needs, prepared by `prepare`."""

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


class Diverged(AttnlabError):
    """The loss or the gradients stopped being finite numbers: the step is not taken."""


def train_step(s: Session) -> float:
    """One optimizer step over grad_accum micro-batches; returns the mean loss."""
    s.model.train()
    micro = s.cfg.batch_size // s.cfg.grad_accum  # sequences per micro-batch, all processes together
    total = 0.0
    for i in range(s.cfg.grad_accum):
        batch = s.data.batch("train", micro, s.rng, (s.dist.rank, s.dist.world))
        batch = [t.to(s.device, non_blocking=True) for t in batch]
        # Under DDP, gradients are averaged across processes only after the last micro-batch.
        last = i == s.cfg.grad_accum - 1
        if s.cfg.parallel == "fsdp":
            s.raw.set_requires_gradient_sync(last)
        ddp = s.dist.enabled and s.cfg.parallel == "ddp"
        with s.model.no_sync() if ddp and not last else contextlib.nullcontext():
            with autocast(s.device, s.dtype):
                _, loss = s.model(*batch)  # every model: forward(inputs..., labels) -> (output, loss)
                aux = aux_loss(s.raw)  # mixture-of-experts layers' balancing losses, weighted (or None)
            ((loss if aux is None else loss + aux) / s.cfg.grad_accum).backward()
        total += loss.item()
    mean = distributed.mean(s.dist, total / s.cfg.grad_accum, s.device)  # the same on every process
    norm = clip_gradients(list(s.model.parameters()), s.cfg.grad_clip)
    if not (math.isfinite(mean) and math.isfinite(norm)):  # never let NaN into the weights
        s.optimizer.zero_grad(set_to_none=True)
        raise Diverged(diverged_message(s, mean, norm))
    set_lr(s.optimizer, lr_at(s.step, s.cfg, s.elapsed))
    with deferred_interrupt(s):  # the update and the step count change together, or not at all
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        s.step += 1
    return mean


def diverged_message(s: Session, loss: float, norm: float) -> str:
    kept = f"{s.run} keeps its checkpoint from step {s.saved_step}" if s.saved_step is not None else "nothing saved"
    lower = f"{s.cfg.lr / 10:.3g}"
    return (f"step {s.step + 1}: the training loss is {loss:g} (gradient norm {norm:g}): stopped before that update; "
            f"{kept}. Is the learning rate too high? Continue with a lower one: "
            f"attnlab train {s.command} --out {s.run} --resume --lr {lower}")  # fmt: skip


def clip_gradients(params: list[nn.Parameter], max_norm: float) -> float:
    """Scale gradients so that their global norm is at most max_norm (0: leave them); returns that norm.

    Under FSDP each process holds a shard of every gradient, and the norm must be taken over
    all shards (the full tensor), not over this process's part.
    """
    norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if hasattr(norm, "full_tensor"):  # a DTensor: this process's shard of the norm
        norm = norm.full_tensor()
    if max_norm > 0:
        nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm.item()


@contextlib.contextmanager
def deferred_interrupt(s: Session):
    """Hold back Ctrl-C during the block: it sets s.interrupted, which the loop acts on once
    the step is logged (main thread only; elsewhere Ctrl-C is not ours to catch)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *a: setattr(s, "interrupted", True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def eval_batches(cfg: TrainConfig) -> int:
    """Batches per validation estimate: cfg.eval_batches, but at most one per EVAL_EVERY micro-batches
    trained between two estimates (and at least one)."""
    return max(1, min(cfg.eval_batches, cfg.eval_interval * cfg.grad_accum // EVAL_EVERY))


@torch.no_grad()
def estimate_loss(s: Session, split: str = "val") -> float:
    """Mean loss over eval_batches(cfg) random batches, drawn from a fixed seed so that every
    estimate in a run looks at the same text (and the training RNG is left alone)."""
    s.model.eval()
    rng = np.random.default_rng(s.cfg.seed + 1)
    losses = []
    part = (s.dist.rank, s.dist.world)
    for _ in range(eval_batches(s.cfg)):
        batch = s.data.batch(split, s.cfg.batch_size // s.cfg.grad_accum, rng, part)
        with autocast(s.device, s.dtype):
            _, loss = s.model(*[t.to(s.device) for t in batch])
        losses.append(loss.item())
    return distributed.mean(s.dist, sum(losses) / len(losses), s.device)


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
    tokens, _ = data.per_example
    # One line, not an allocator error; from the config (`build` may also read an --init run's weights).
    check_training_fits(lambda: build_model(config["family"], config["model"]), cfg.batch_size // cfg.grad_accum,
                        tokens, device)  # fmt: skip
    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    model = build().to(device)
    set_grad_checkpoint(model, cfg.grad_checkpoint)  # every Stack of every family honours it
    rng = np.random.default_rng(cfg.seed)
    state = load_train_state(run / STATE, rng) if resume else None
    if state is not None:
        load_state(model, state.weights, run / STATE)  # whole weights, before any sharding
    if cfg.parallel == "fsdp":  # each process keeps 1/world of every block's parameters
        from torch.distributed.fsdp import fully_shard  # torch's FSDP: 2.5 s to import, for --parallel fsdp alone

        for block in (b for stack in stacks_of(model) for b in stack):
            fully_shard(block)
        fully_shard(model)
    width = max((stack.cfg.d_model for stack in stacks_of(model)), default=384)  # what bf16 is measured at
    dtype, note = dtype_choice(cfg.dtype, device, width)
    s = Session(run, model, make_optimizer(model, cfg), data, cfg, device, dtype, rng, dist=d, raw=model,
                command=command, dtype_note=note)  # fmt: skip
    if state is not None:
        if state.optimizer["state"]:  # empty at step 0: a fresh optimizer is that state
            api = state_dict_api()
            options = api.StateDictOptions(full_state_dict=True)
            api.set_optimizer_state_dict(model, s.optimizer, state.optimizer, options=options)
        apply_settings(s.optimizer, cfg)
        s.step = s.saved_step = state.step
        s.elapsed = state.elapsed
    if d.main and resume:
        truncate_metrics(run / "metrics.jsonl", s.step)
    if d.main:
        write_json(run / CONFIG, config)  # the settings in force (a resume may change some)
    if not resume:
        save_checkpoint(s)  # step 0: from here on the run directory is complete and resumable
    if d.enabled and cfg.parallel == "ddp":  # gradients averaged over processes in backward
        s.model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        s.model = torch.compile(s.model)
    return s


def save_checkpoint(s: Session, background: bool = False) -> None:
    """Whole weights and optimizer state (every process takes part in gathering them under
    FSDP); rank 0 writes them, as a run any number of processes can load or resume. In the
    background, they are copied now and s.writer's thread writes them while training goes on:
    the loop waits for it before it returns or raises, so the run it leaves is whole."""
    weights = model_weights(s.raw)
    if s.optimizer.state:
        api = state_dict_api()
        options = api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer = api.get_optimizer_state_dict(s.raw, s.optimizer, options=options)
    else:  # before the first step; asking torch would run a zero step and shift AdamW's step count
        names = {id(p): n for n, p in s.raw.named_parameters()}
        groups = [{**g, "params": [names[id(p)] for p in g["params"]]} for g in s.optimizer.param_groups]
        optimizer = {"state": {}, "param_groups": groups}
    if s.dist.main:
        # Copies: the state dicts may hold the training's own tensors (all of them on the CPU, AdamW's
        # step counts on a GPU), which the next steps change in place while the thread writes.
        files = checkpoint(TrainState(s.step, weights, optimizer, s.elapsed), s.rng, copy=background)
        s.writer.submit(partial(write_checkpoint, s.run, files))  # after the one before it is written
        if not background:
            s.writer.wait()
    s.saved_step = s.step  # on disk, or (background) once the loop ends
    distributed.barrier(s.dist)


SNAPSHOTS = "snapshots"  # RUN/snapshots/step_0000100.safetensors: weights only, every --snapshot-every steps


def save_snapshot(s: Session) -> None:
    """The weights at this step, kept apart from the checkpoint (which each save replaces), written
    by the checkpoint thread from copies taken now."""
    weights = model_weights(s.raw)  # every process takes part under FSDP
    if s.dist.main:
        copies = {k: snapshot(v, copy=True) for k, v in weights.items()}
        path = s.run / SNAPSHOTS / f"step_{s.step:07d}.safetensors"
        path.parent.mkdir(exist_ok=True)
        s.writer.submit(partial(write_weights, copies, path, {"step": str(s.step)}))


def _log(s: Session, row: dict) -> None:
    if s.dist.main:
        if s.log is None:  # line-buffered: each row reaches the file as it is written
            s.log = open(s.run / "metrics.jsonl", "a", buffering=1, encoding="utf-8")
        s.log.write(json.dumps(row) + "\n")


def _draw(s: Session) -> float:
    """loss.png (rank 0); returns the time.monotonic() before which it is not drawn again."""
    t0 = time.monotonic()  # not perf_counter: the loop's clock (tests replace it)
    if s.dist.main:
        plot_loss(s.run / "metrics.jsonl", s.run / "loss.png")
    now = time.monotonic()
    return now + max(PLOT_EVERY, (now - t0) / PLOT_SHARE)


def _evaluate(s: Session, bar: tqdm, recent: list[float]) -> float | None:
    routing = routing_stats(s.raw)  # the last training batch's (validation routes its own next)
    val = estimate_loss(s) if s.data.has("val") else None
    train = sum(recent) / len(recent) if recent else float("nan")
    if val is not None or routing:
        _log(s, {"step": s.step, **({} if val is None else {"val_loss": val}), **routing})
    if s.dist.main:
        bar.write(f"step {s.step:>6} | train loss {train:.4f} | val loss {val if val is None else round(val, 4)}")
    save_checkpoint(s, background=True)
    return val


def rng_snapshot(s: Session) -> dict:
    state = {"step": s.step, "numpy": s.rng.bit_generator.state, "torch": torch.get_rng_state()}
    if s.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(s.device)
    return state


def restore_rng(s: Session, state: dict) -> None:
    s.rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], s.device)


def loop(s: Session, progress: bool = True) -> dict:
    """Train from s.step to max_steps; on Ctrl-C save a checkpoint and stop cleanly."""
    cfg = s.cfg
    n_params = sum(p.numel() for p in s.model.parameters())
    procs = f" x {s.dist.world} processes" if s.dist.enabled else ""
    if s.dist.main:
        print(
            f"model {n_params / 1e6:.2f}M parameters | {s.data.describe()} | "
            f"{s.device.type}{procs} {str(s.dtype).removeprefix('torch.')}"
            f"{f' ({s.dtype_note})' if cfg.dtype == 'auto' else ''} | batch {cfg.batch_size}",
            file=sys.stderr,
        )
    budget = budget_seconds(cfg.time_budget) if cfg.time_budget else None
    bar = progress_bar(s, budget, disable=not (progress and s.dist.main))
    items, unit = s.data.per_example  # tokens (or examples) in each sequence of a batch
    items_per_step = cfg.batch_size * items
    recent: list[float] = []
    val = None
    # RNG states after the last completed step: if Ctrl-C lands mid-step, that step is undone.
    snapshot = rng_snapshot(s)
    clock = time.perf_counter() - s.elapsed  # elapsed = now - clock, earlier sessions included
    next_plot, first_step = time.monotonic() + PLOT_EVERY, s.step
    try:
        if cfg.snapshot_every and s.step == 0:
            save_snapshot(s)  # the untrained model: where every curve starts
        while s.step < cfg.max_steps and not spent(s, budget):
            s.writer.check()  # a checkpoint that failed in the background (a full disk) stops the run
            t0 = time.perf_counter()
            lr = lr_at(s.step, cfg, s.elapsed)
            loss = train_step(s)
            dt = time.perf_counter() - t0
            s.elapsed = agreed(s, time.perf_counter() - clock) if budget else time.perf_counter() - clock
            snapshot = rng_snapshot(s)
            recent = (recent + [loss])[-50:]
            _log(s, {"step": s.step, "loss": loss, "lr": lr, f"{unit}_per_s": items_per_step / dt})
            shown = {"step": s.step} if budget else {}
            bar.set_postfix({**shown, "loss": f"{loss:.3f}", f"{unit[:3]}/s": f"{items_per_step / dt:,.0f}"},
                            refresh=False)  # fmt: skip
            bar.update(min(s.elapsed, budget) - bar.n if budget else 1)
            last = s.step == cfg.max_steps or spent(s, budget)
            if cfg.snapshot_every and s.step % cfg.snapshot_every == 0:
                save_snapshot(s)
            if s.step % cfg.eval_interval == 0 or last:
                with deferred_interrupt(s):  # Ctrl-C here waits for the validation row and the checkpoint
                    val = _evaluate(s, bar, recent)
                    if not last and time.monotonic() >= next_plot:
                        next_plot = _draw(s)
            if s.interrupted:
                raise KeyboardInterrupt
        if s.step > first_step:
            _draw(s)  # while the last checkpoint is written
        s.writer.wait()
    except KeyboardInterrupt:
        bar.close()
        if snapshot["step"] == s.step:  # interrupted before the update: forget the partial step
            restore_rng(s, snapshot)
        s.optimizer.zero_grad(set_to_none=True)
        save_checkpoint(s)  # once the one in flight is written
        _draw(s)
        raise AttnlabError(
            f"interrupted at step {s.step}; saved. Continue with: attnlab train {s.command} --out {s.run} --resume"
        ) from None
    except BaseException:  # a diverged loss, a full disk, ...: the bar ends before the message
        bar.close()
        s.writer.wait()  # the checkpoint the message names is whole on disk (or its error is raised)
        raise
    finally:
        if s.log is not None:
            s.log.close()
            s.log = None
    bar.close()
    if budget and s.step < cfg.max_steps and s.dist.main:
        print(f"time budget of {cfg.time_budget} spent: {s.step} steps", file=sys.stderr)
    return {"step": s.step, "val_loss": val, "train_loss": sum(recent) / max(1, len(recent)), "elapsed": s.elapsed}


def progress_bar(s: Session, budget: float | None, disable: bool) -> tqdm:
    """Steps out of max_steps; under a time budget, seconds out of the budget (max_steps is then
    usually a far bound), the step shown beside the loss."""
    if budget is None:
        return tqdm(total=s.cfg.max_steps, initial=s.step, desc="training", unit="step", disable=disable,
                    dynamic_ncols=True)  # fmt: skip
    form = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=budget, initial=min(s.elapsed, budget), desc="training", unit="s", disable=disable,
                dynamic_ncols=True, bar_format=form)  # fmt: skip


def spent(s: Session, budget: float | None) -> bool:
    return budget is not None and s.elapsed >= budget


def agreed(s: Session, elapsed: float) -> float:
    """Every process's clock differs a little: under torchrun they use rank 0's, so that all stop
    at the same step."""
    if not s.dist.enabled:
        return elapsed
    t = torch.tensor([elapsed if s.dist.main else 0.0], device=s.device)
    torch.distributed.all_reduce(t)
    return float(t)
