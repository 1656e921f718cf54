"""The optimizer and the learning-rate schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnlab.engine.config import budget_seconds

if TYPE_CHECKING:
    from attnlab.engine.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig, elapsed: float | None = None) -> float:
    """Linear warmup to cfg.lr, then cosine decay to min_lr at max_steps, or (schedule
    "inverse_sqrt") decay as 1/sqrt(step). With a time budget, the cosine follows `elapsed`
    seconds of training instead of steps, so that it ends with the budget on any machine.

    The paper's schedule, lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), is this
    inverse_sqrt one with its peak lr = (d_model * warmup)^-0.5 reached at step = warmup
    (7.0e-4 for d_model 512, 4000 warmup steps).
    """
    min_lr = cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * math.sqrt(max(1, cfg.warmup_steps) / (step + 1))
    if cfg.time_budget is not None and elapsed is not None:
        progress = min(1.0, elapsed / budget_seconds(cfg.time_budget))
    else:
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: not on biases, norms or embeddings."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in params if p.dim() < 2 or id(p) in embeddings]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def apply_settings(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """Settings of cfg over those restored with a checkpoint (a resumed run may change them)."""
    decay, no_decay = optimizer.param_groups
    decay["weight_decay"], no_decay["weight_decay"] = cfg.weight_decay, 0.0
    for group in optimizer.param_groups:
        group["betas"] = (cfg.beta1, cfg.beta2)
