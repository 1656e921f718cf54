"""The optimizer and the learning-rate schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnlab.engine.config import budget_seconds
from attnlab.engine.muon import Muon
from attnlab.nn.stack import stacks_of

if TYPE_CHECKING:
    from attnlab.engine.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig, elapsed: float | None = None) -> float:
    """Linear warmup to cfg.lr, then cosine decay to min_lr at max_steps, or (schedule "wsd")
    lr held until the last `cooldown` fraction of training and a linear decay to min_lr over it,
    or (schedule "inverse_sqrt") decay as 1/sqrt(step). With a time budget, cosine and wsd
    follow `elapsed` seconds of training instead of steps, so that they end with the budget on
    any machine.

    Warmup-stable-decay (Hu et al. 2024, "MiniCPM"; Hägele et al. 2024) trains at the peak rate
    for longer than a cosine does and gets its loss drop from the short final decay.

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
        if cfg.min_steps:  # a floor of steps as well: the decay ends with whichever is met last
            progress = min(progress, (step - cfg.warmup_steps) / max(1, cfg.min_steps - cfg.warmup_steps))
    else:
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    if cfg.schedule == "wsd":
        into_decay = max(0.0, progress - (1 - cfg.cooldown)) / cfg.cooldown  # 0 until the cooldown, then -> 1
        return cfg.lr + (min_lr - cfg.lr) * into_decay
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))


class Optimizers(list):
    """Several optimizers stepping as one: Muon for the blocks' matrices, AdamW for the rest.

    It has what the training loop asks of an optimizer (param_groups, state, step, zero_grad),
    and torch.distributed.checkpoint's get/set_optimizer_state_dict take it as the iterable of
    optimizers they accept, so saving and resuming go through the same code as for AdamW alone.
    """

    @property
    def param_groups(self) -> list[dict]:
        return [group for opt in self for group in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self for p, s in opt.state.items()}

    def step(self) -> None:
        for opt in self:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)


def hidden_matrices(model: nn.Module) -> set[int]:
    """ids of the weight matrices inside the Transformer blocks (Muon's share): every parameter of 2
    or more dims of the model's Stacks (nn/stack.py) that is not an embedding. The model's modules
    say where its blocks are; the embeddings, heads and classifiers outside them stay AdamW's."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    inside = {id(p) for stack in stacks_of(model) for p in stack.parameters()}
    return {id(p) for p in model.parameters() if p.dim() >= 2 and id(p) in inside and id(p) not in embeddings}


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer | Optimizers:
    """AdamW with weight decay on weight matrices only: not on biases, norms or embeddings.
    optimizer "muon": the blocks' matrices go to Muon (at muon_lr, with the same decay) instead."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = [p for p in model.parameters() if p.requires_grad]
    muon_ids = hidden_matrices(model) if cfg.optimizer == "muon" else set()
    decay = [p for p in params if p.dim() >= 2 and id(p) not in embeddings and id(p) not in muon_ids]
    no_decay = [p for p in params if p.dim() < 2 or id(p) in embeddings]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "role": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "role": "no_decay"},
    ]
    groups = [g for g in groups if g["params"]]  # with Muon and a tied head no AdamW matrix may be left
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=True)
    if not muon_ids:
        return adamw
    muon_group = {"params": [p for p in params if id(p) in muon_ids], "role": "muon", "lr_scale": cfg.muon_lr / cfg.lr}
    return Optimizers([adamw, Muon([muon_group], lr=cfg.muon_lr, weight_decay=cfg.weight_decay)])


def set_lr(optimizer: torch.optim.Optimizer | Optimizers, lr: float) -> None:
    """The schedule's learning rate for this step; Muon's groups take it times muon_lr / lr."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def apply_settings(optimizer: torch.optim.Optimizer | Optimizers, cfg: TrainConfig) -> None:
    """Settings of cfg over those restored with a checkpoint (a resumed run may change them)."""
    for i, group in enumerate(optimizer.param_groups):
        role = group.get("role") or ("decay", "no_decay")[min(i, 1)]  # runs saved before roles: AdamW's two
        group["weight_decay"] = 0.0 if role == "no_decay" else cfg.weight_decay
        if role == "muon":
            group["lr_scale"] = cfg.muon_lr / cfg.lr
        else:
            group["betas"] = (cfg.beta1, cfg.beta2)
