"""The training settings every task shares: steps, batch, optimizer, schedule, precision, parallelism."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

from attnlab.config import check_seed, check_types, names, option
from attnlab.decoding.settings import DTYPE_NAMES  # runtime/device.py's, torch-free: help without torch
from attnlab.engine.tracking import TRACKERS

SCHEDULES = ("cosine", "wsd", "inverse_sqrt")
OPTIMIZERS = ("adamw", "muon")


UNITS = {"s": 1, "m": 60, "h": 3600}


@functools.cache  # the schedule asks at every step
def budget_seconds(text: str) -> float:
    """'90s', '2m', '1.5h' (or plain seconds) -> seconds, a finite number above 0."""
    text = str(text).strip().lower()
    unit = UNITS.get(text[-1:], None)
    try:
        value = float(text[:-1] if unit else text) * (unit or 1)
    except ValueError:
        raise ValueError(f"time_budget: expected a duration like 90s, 2m or 1.5h, got {text!r}") from None
    if not (0 < value < math.inf):
        raise ValueError(f"time_budget must be a finite duration above 0, got {text!r}")
    return value


def warn_short_warmup(cfg: TrainConfig) -> None:
    """The warmup a run never finishes, and the peak rate it reaches instead, in words (said by the
    training loop as it starts: once a run, however many times the config is built)."""
    if not cfg.warmup_steps > cfg.max_steps > 0:
        return
    peak = cfg.lr * cfg.max_steps / cfg.warmup_steps  # lr_at: lr * (step + 1) / warmup_steps up to max_steps - 1
    share = cfg.max_steps / cfg.warmup_steps
    warnings.warn(
        f"warmup_steps {cfg.warmup_steps} is more than max_steps {cfg.max_steps}: the learning rate is "
        f"still warming up when training ends and peaks at {peak:.3g}, {share:.0%} of lr {cfg.lr:g} "
        "(lower warmup_steps to reach lr)",
        stacklevel=2,
    )


@dataclass
class TrainConfig:
    max_steps: int = option(2000, "optimizer steps to train for")
    time_budget: str | None = option(
        None,
        "train for this long (90s, 2m, 1.5h): the cosine decay follows elapsed "
        "time and ends with it; max_steps still caps the steps",
    )
    min_steps: int = option(
        0,
        "with --time-budget: train at least this many steps, past the budget if this "
        "machine is slow or busy (the decay then ends with the steps)",
    )
    batch_size: int = option(32, "sequences per optimizer step (the global batch)")
    grad_accum: int = option(1, "micro-batches per step, each of batch_size / grad_accum sequences")
    block_size: int | None = option(None, "tokens per training sequence (default: the model's context)")
    lr: float = option(3e-3, "peak learning rate")
    min_lr: float | None = option(None, "learning rate at the end of the cosine decay (default lr / 10)")
    warmup_steps: int = option(100, "steps of linear warmup from 0 to lr")
    schedule: str = option(
        "cosine",
        "after warmup: cosine decay to min_lr; wsd (warmup-stable-decay): lr held, "
        "then a linear decay to min_lr over the last --cooldown of training; or the "
        "Transformer paper's inverse square root of the step",
        SCHEDULES,
    )
    cooldown: float = option(0.3, "wsd: the final fraction of training (steps, or the time budget) spent decaying")
    optimizer: str = option(
        "adamw",
        "adamw, or muon: Muon for the blocks' weight matrices and AdamW for the rest (embeddings, head, norms, biases)",
        OPTIMIZERS,
    )
    muon_lr: float = option(0.02, "muon: peak learning rate of the Muon-trained matrices (lr is AdamW's)")
    weight_decay: float = option(0.1, "AdamW weight decay, on weight matrices only")
    beta1: float = option(0.9, "AdamW beta1")
    beta2: float = option(0.95, "AdamW beta2")
    grad_clip: float = option(1.0, "clip the gradients' global norm to this (0 = off)")
    eval_interval: int = option(250, "steps between validation-loss estimates and checkpoints")
    eval_batches: int = option(20, "batches per validation-loss estimate")
    snapshot_every: int = option(
        0,
        "keep the weights every N steps in RUN/snapshots/, to follow the model as it "
        "learns (attnlab inspect RUN --what over-training); 0: none",
    )
    seed: int = option(1337, "random seed (initialization, batches, dropout)")
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps")
    parallel: str = option(
        "ddp", "with several processes: replicate the model (ddp) or shard it (fsdp)", ("ddp", "fsdp")
    )
    compile: bool = option(False, "run the model through torch.compile (slower first steps, faster after)")
    grad_checkpoint: bool = option(False, "recompute activations in backward: less memory, ~1/3 more compute")
    dtype: str = option(
        "auto", "auto (bf16 on a GPU that has it; on a CPU where measured faster), float32 or bfloat16", DTYPE_NAMES
    )
    log: str | None = option(
        None,
        "also send the metrics to a tracker (metrics.jsonl is always written): "
        "tensorboard, event files in RUN/tensorboard/",
        names(TRACKERS),
    )

    def __post_init__(self):
        check_types(self)  # TrainConfig(max_steps="5"): named here, not "'<' not supported" below
        check_seed("seed", self.seed)
        if self.time_budget is not None:
            budget_seconds(self.time_budget)  # a clear error now, not at the first step
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if min(self.max_steps, self.min_steps, self.warmup_steps, self.snapshot_every) < 0:
            raise ValueError("max_steps, min_steps, warmup_steps and snapshot_every must be >= 0")
        # Written as `not (...)`: NaN fails every comparison, so `lr <= 0` would let it through.
        if not (0 < self.lr < math.inf):
            raise ValueError(f"lr must be a finite number above 0, got {self.lr}")
        for name in ("min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if value is not None and not (0 <= value < math.inf):
                raise ValueError(f"{name} must be a finite number, 0 or more, got {value}")
        for name in ("beta1", "beta2"):
            if not (0 <= getattr(self, name) < 1):
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.log is not None and self.log not in TRACKERS:
            raise ValueError(f"log must be one of {', '.join(TRACKERS)}, got {self.log!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.optimizer == "muon" and self.parallel == "fsdp":
            raise ValueError(
                "muon orthogonalizes whole matrices, which FSDP splits between processes: use --parallel ddp"
            )
        if not (0 < self.cooldown <= 1):
            raise ValueError(f"cooldown must be in (0, 1], got {self.cooldown}")
        if not (0 < self.muon_lr < math.inf):
            raise ValueError(f"muon_lr must be a finite number above 0, got {self.muon_lr}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        self._check_schedule()

    def _check_schedule(self) -> None:
        """A decay that climbs is refused (a warmup the run never finishes is said by the loop as it
        starts: warn_short_warmup)."""
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr:g} is above lr {self.lr:g}: the decay would raise the rate; "
                f"give a min_lr below lr (default lr / 10)"
            )
