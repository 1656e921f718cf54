"""Head ablation: how much the loss rises when one head is taken out.

Legend: L layers, H heads, B batch, T time, Dh head size.

Each head's output (before the output projection, `attn.hook_head_out`) is replaced, one head at
a time, by zeros ("zero") or by its mean over the batch and positions ("mean", which keeps the
average signal downstream layers are used to and removes only what depends on the input); the
table is the loss with the head removed minus the loss with every head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.interpret.trace import trace
from attnlab.nn.hooks import Hook, hooks, taps, zero_head

MODES = ("zero", "mean")


def attention_layers(model: nn.Module, stack: str = "blocks") -> list[str]:
    """The attention modules of one stack, in order (`blocks.0.attn`, ...)."""
    return [
        name[: -len(".hook_head_out")]
        for name in taps(model)
        if name.startswith(stack + ".") and name.endswith(".attn.hook_head_out")
    ]


def _replace_head(head: int, value: Tensor) -> Hook:
    def fn(x: Tensor) -> Tensor:
        x = x.clone()
        x[:, head] = value  # value (T|1, Dh) broadcast over the batch
        return x

    return fn


@torch.no_grad()
def head_ablation(
    model: nn.Module, loss: Callable[[], Tensor], inputs: tuple = (), mode: str = "zero", stack: str = "blocks"
) -> Tensor:
    """(L, H) loss increase for removing each head of `stack`; loss() runs the model and returns the
    loss, `inputs` are what to trace for the mean ablation's means."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    layers = attention_layers(model, stack)
    means = {}
    if mode == "mean":
        t = trace(model, *inputs)
        means = {name: t[f"{name}.hook_head_out"].mean(dim=(0, 2)) for name in layers}  # (H, Dh) each
    base = float(loss())
    rows = []
    for name in layers:
        heads = model.get_submodule(name).n_heads
        row = []
        for h in range(heads):
            fn = zero_head(h) if mode == "zero" else _replace_head(h, means[name][h])
            with hooks(model, {f"{name}.hook_head_out": fn}):
                row.append(float(loss()) - base)
        rows.append(row)
    return torch.tensor(rows)
