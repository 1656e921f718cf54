"""Will this model and batch fit? The training estimate behind one line before any allocation.

The model is built on PyTorch's meta device (shapes, no memory); its Stacks say how many blocks of
which width and heads it runs, which is what the activations grow with. The estimate is rough on
purpose and refuses only what cannot fit in the whole memory of the device (runtime/memory.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from attnlab.nn.stack import Stack
from attnlab.runtime.memory import check_fits, gb

ADAM_BYTES = 16  # per float32 parameter: the weight, its gradient and AdamW's two moments


def meta_model(build: Callable[[], nn.Module]) -> nn.Module | None:
    """The model built on PyTorch's meta device: shapes, no memory (None if a family cannot)."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build()
    except Exception:  # e.g. a family that fills a table with numpy: no estimate, no refusal
        return None


def training_bytes(model: nn.Module, batch: int, tokens: int | None) -> tuple[int, int]:
    """(weights + gradients + AdamW moments, activations of one micro-batch), in bytes, float32.
    Activations: about 16 numbers per token per block and width, and 3 attention maps per head
    (scores, probabilities, dropout mask) without a fused kernel, summed over the model's Stacks."""
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    if tokens is None or not stacks:
        return n * ADAM_BYTES, 0
    act = sum(4 * batch * tokens * len(s) * (16 * s.cfg.d_model + 3 * s.cfg.n_head * tokens) for s in stacks)
    return n * ADAM_BYTES, act


def check_training_fits(build: Callable[[], nn.Module], batch: int, tokens: int | None, device: torch.device) -> None:
    """Refuse, in one line, a model and batch that cannot fit the device."""
    model = meta_model(build)
    if model is None:
        return
    params, act = training_bytes(model, batch, tokens)
    check_fits(
        params + act,
        "training this model",
        "lower --context, --batch-size, --d-model or --n-layer "
        f"(weights, gradients and AdamW moments ~{gb(params)} GB, a batch's activations ~{gb(act)} GB)",
        device,
    )
