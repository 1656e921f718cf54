"""The training loop every task shares: micro-batches, clipping, AdamW, checkpoints, resume.

session.start(...) prepares a Session (the model, its optimizer, the step-0 checkpoint); then
loop(session)
  -> train_step (forward/backward over micro-batches, clip, AdamW step)
     every eval_interval: validation loss, metrics, checkpoint (saving.py: written by a thread of
     its own while the steps go on), now and then the plot; Ctrl-C saves and stops
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
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from attnlab.engine.config import TrainConfig, budget_seconds, warn_short_warmup
from attnlab.engine.notebook import LiveLoss, in_notebook
from attnlab.engine.optim import lr_at, set_lr
from attnlab.engine.saving import restore_rng, rng_snapshot, save_checkpoint, save_snapshot
from attnlab.engine.session import Session
from attnlab.engine.tracking import close_trackers, open_trackers
from attnlab.errors import AttnlabError, Interrupted
from attnlab.io import read_json
from attnlab.nn.counting import count_parameters
from attnlab.nn.moe import aux_loss, routing_stats
from attnlab.nn.objective import Objective
from attnlab.progress import tqdm
from attnlab.runs.folder import CONFIG, METRICS
from attnlab.runs.marker import record
from attnlab.runtime import distributed
from attnlab.runtime.device import autocast
from attnlab.runtime.threads import revisit
from attnlab.viz.curves import plot_loss

# A validation estimate reads at most one batch per EVAL_EVERY micro-batches trained since the last
# one. Forward only, a batch costs about a third of a training one, so validation stays near 1.5% of
# the run whatever the interval (what the demo paid before: docs/log.md, "The training loop").
EVAL_EVERY = 20
# loss.png is redrawn during training at most once a minute, and less often if drawing it costs
# over PLOT_SHARE of that time (the first drawing imports matplotlib); always at the end.
PLOT_EVERY, PLOT_SHARE = 60.0, 0.02


class Diverged(AttnlabError):
    """The loss or the gradients stopped being finite numbers: the step is not taken."""


def train_step(s: Session) -> float:
    """One optimizer step over grad_accum micro-batches; returns the mean loss."""
    revisit()  # every 30 s: fewer threads beside a training started after this one, more once it ends
    s.model.train()
    micro = s.cfg.batch_size // s.cfg.grad_accum  # sequences per micro-batch, all processes together
    total = 0.0
    for i in range(s.cfg.grad_accum):
        batch = s.data.batch("train", micro, s.rng, (s.dist.rank, s.dist.world))
        batch = [t.to(s.device, non_blocking=True) for t in batch]
        # Under DDP, gradients are averaged across processes only after the last micro-batch.
        last = i == s.cfg.grad_accum - 1
        if s.cfg.parallel == "fsdp" and s.dist.enabled:  # one process (a resumed run, say) shards nothing
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
    return (
        f"step {s.step + 1}: the training loss is {loss:g} (gradient norm {norm:g}): stopped before that update; "
        f"{kept}. Is the learning rate too high? Continue with a lower one: "
        f"attnlab train {s.command} --out {s.run} --resume --lr {lower}"
    )


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


def _log(s: Session, row: dict) -> None:
    if s.dist.main:
        if s.log is None:  # line-buffered: each row reaches the file as it is written
            s.log = open(s.run / METRICS, "a", buffering=1, encoding="utf-8")
        s.log.write(json.dumps(row) + "\n")
        for tracker in s.trackers:  # --log's trackers and a notebook's picture get the same rows
            tracker.log(row["step"], {k: v for k, v in row.items() if k != "step"})


def start_trackers(s: Session, progress: bool) -> None:
    """Open --log's trackers and, inside a Jupyter kernel, the live loss picture (rank 0 alone logs)."""
    if not s.dist.main:
        s.trackers = []
        return
    if progress and in_notebook():
        s.trackers = [*s.trackers, LiveLoss()]
    record(s.run, *[name for t in s.trackers for name in t.files])  # --force removes them with the run
    open_trackers(s.trackers, s.run, read_json(s.run / CONFIG), s.step)


def _draw(s: Session) -> float:
    """loss.png (rank 0); returns the time.monotonic() before which it is not drawn again."""
    t0 = time.monotonic()  # not perf_counter: the loop's clock (tests replace it)
    if s.dist.main:
        plot_loss(s.run / METRICS, s.run / "loss.png")
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


def announce(s: Session) -> None:
    """One line before the first step: the model's size, the data, where and in what precision."""
    if not s.dist.main:
        return
    warn_short_warmup(s.cfg)
    size = count_parameters(s.model).line()  # packed or quantized matrices at their logical count
    procs = f" x {s.dist.world} processes" if s.dist.enabled else ""
    why = f" ({s.dtype_note})" if s.cfg.dtype == "auto" else ""
    print(
        f"model {size} | {s.data.describe()} | {s.device.type}{procs} "
        f"{str(s.dtype).removeprefix('torch.')}{why} | batch {s.cfg.batch_size}",
        file=sys.stderr,
    )


@dataclass
class Progress:
    """What the loop carries from step to step."""

    budget: float | None  # seconds of training allowed (--time-budget), or None
    bar: tqdm
    clock: float  # elapsed = now - clock, earlier sessions included
    snapshot: dict  # RNG states after the last completed step: Ctrl-C mid-step undoes that step
    next_plot: float = 0.0
    recent: list[float] = field(default_factory=list)  # the last 50 training losses
    val: float | None = None
    past_budget: bool = False  # said once: training goes on past the budget to --min-steps


def loop(s: Session, progress: bool = True) -> dict:
    """Train from s.step to max_steps; on Ctrl-C save a checkpoint and stop cleanly."""
    cfg = s.cfg
    announce(s)
    budget = budget_seconds(cfg.time_budget) if cfg.time_budget else None
    start_trackers(s, progress)  # before the bar: a tracker that cannot open stops the run here
    bar = progress_bar(s, budget, disable=not (progress and s.dist.main))
    p = Progress(budget, bar, time.perf_counter() - s.elapsed, rng_snapshot(s), time.monotonic() + PLOT_EVERY)
    first_step = s.step
    try:
        if cfg.snapshot_every and s.step == 0:
            save_snapshot(s)  # the untrained model: where every curve starts
        while s.step < cfg.max_steps and not done(s, budget):
            one_step(s, p)
        if s.step > first_step:
            _draw(s)  # while the last checkpoint is written
        s.writer.wait()
    except KeyboardInterrupt:
        p.bar.close()
        stop_on_interrupt(s, p.snapshot)
    except BaseException:  # a diverged loss, a full disk, ...: the bar ends before the message
        p.bar.close()
        s.writer.wait()  # the checkpoint the message names is whole on disk (or its error is raised)
        raise
    finally:
        if s.log is not None:
            s.log.close()
            s.log = None
        close_trackers(s.trackers)
        s.trackers = []
    p.bar.close()
    if budget and s.step < cfg.max_steps and s.dist.main:
        floor = f" (at least {cfg.min_steps})" if p.past_budget else ""
        print(f"time budget of {cfg.time_budget} spent: {s.step} steps{floor}", file=sys.stderr)
    train = sum(p.recent) / max(1, len(p.recent))
    return {"step": s.step, "val_loss": p.val, "train_loss": train, "elapsed": s.elapsed}


def one_step(s: Session, p: Progress) -> None:
    """A training step, its row in metrics.jsonl and the bar; a snapshot, validation, a checkpoint and
    the plot when they are due."""
    cfg, budget = s.cfg, p.budget
    s.writer.check()  # a checkpoint that failed in the background (a full disk) stops the run
    t0 = time.perf_counter()
    lr = lr_at(s.step, cfg, s.elapsed)
    loss = train_step(s)
    dt = time.perf_counter() - t0
    s.elapsed = agreed(s, time.perf_counter() - p.clock) if budget else time.perf_counter() - p.clock
    p.snapshot = rng_snapshot(s)
    p.recent = (p.recent + [loss])[-50:]
    items, unit = s.data.per_example  # tokens (or examples) in each sequence of a batch
    rate = cfg.batch_size * items / dt
    extra = s.raw.metrics() if isinstance(s.raw, Objective) else {}  # e.g. DPO's reward accuracy
    _log(s, {"step": s.step, "loss": loss, "lr": lr, f"{unit}_per_s": rate, **extra})
    shown = {**({"step": s.step} if budget else {}), **{k: f"{v:.2f}" for k, v in extra.items()}}
    p.bar.set_postfix({**shown, "loss": f"{loss:.3f}", f"{unit[:3]}/s": f"{rate:,.0f}"}, refresh=False)
    p.bar.update(min(s.elapsed, budget) - p.bar.n if budget and not p.past_budget else 1)
    last = s.step == cfg.max_steps or done(s, budget)
    if spent(s, budget) and s.step < cfg.min_steps and not p.past_budget:
        past_the_budget(s, p)
    if cfg.snapshot_every and s.step % cfg.snapshot_every == 0:
        save_snapshot(s)
    if s.step % cfg.eval_interval == 0 or last:
        with deferred_interrupt(s):  # Ctrl-C here waits for the validation row and the checkpoint
            p.val = _evaluate(s, p.bar, p.recent)
            if not last and time.monotonic() >= p.next_plot:
                p.next_plot = _draw(s)
    if s.interrupted:
        raise KeyboardInterrupt


def past_the_budget(s: Session, p: Progress) -> None:
    """The budget is spent short of --min-steps: say so once, and count the steps left on a new bar."""
    cfg, disable = s.cfg, p.bar.disable
    p.past_budget = True
    p.bar.close()
    if s.dist.main:
        print(
            f"time budget of {cfg.time_budget} spent at step {s.step}, short of the {cfg.min_steps} steps a "
            f"trained model needs here: training on to step {cfg.min_steps} (this machine is slower than "
            "expected, or busy)",
            file=sys.stderr,
        )
    p.bar = tqdm(
        total=cfg.min_steps, initial=s.step, desc="training on", unit="step", disable=disable, dynamic_ncols=True
    )


def stop_on_interrupt(s: Session, snapshot: dict) -> None:
    """Ctrl-C: a step caught before its update is forgotten; the run is saved and the way on said."""
    if snapshot["step"] == s.step:  # interrupted before the update: forget the partial step
        restore_rng(s, snapshot)
    s.optimizer.zero_grad(set_to_none=True)
    save_checkpoint(s)  # once the one in flight is written
    _draw(s)
    again = f"attnlab train {s.command} --out {s.run} --resume"
    raise Interrupted(f"interrupted at step {s.step}; saved", again) from None


def progress_bar(s: Session, budget: float | None, disable: bool) -> tqdm:
    """Steps out of max_steps; under a time budget, seconds out of the budget (max_steps is then
    usually a far bound), the step shown beside the loss."""
    if budget is None:
        return tqdm(
            total=s.cfg.max_steps, initial=s.step, desc="training", unit="step", disable=disable, dynamic_ncols=True
        )
    form = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"
    return tqdm(
        total=budget,
        initial=min(s.elapsed, budget),
        desc="training",
        unit="s",
        disable=disable,
        dynamic_ncols=True,
        bar_format=form,
    )


def spent(s: Session, budget: float | None) -> bool:
    return budget is not None and s.elapsed >= budget


def done(s: Session, budget: float | None) -> bool:
    """The budget is spent and the floor of steps (--min-steps) reached."""
    return spent(s, budget) and s.step >= s.cfg.min_steps


def agreed(s: Session, elapsed: float) -> float:
    """Every process's clock differs a little: under torchrun they use rank 0's, so that all stop
    at the same step."""
    if not s.dist.enabled:
        return elapsed
    t = torch.tensor([elapsed if s.dist.main else 0.0], device=s.device)
    torch.distributed.all_reduce(t)
    return float(t)
