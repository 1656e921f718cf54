"""Will it fit? Memory estimates made before anything large is allocated.

A size that comes from outside (--context 100000000, --image-size 100000) must give one line
("needs ~51 GB; this machine has 24") before the allocation, not an allocator traceback or a
machine swapping itself to a halt. The estimates are rough on purpose and only refuse what
cannot fit in the whole memory of the device, so they never stop a run that would have worked.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import nn

from attnlab.errors import AttnlabError

ADAM_BYTES = 16  # per float32 parameter: the weight, its gradient and AdamW's two moments


def device_memory(device: torch.device | str = "cpu") -> int:
    """Bytes of memory the device has in all (a GPU's own memory, else the machine's)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound we can read
        return 1 << 62


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f}" if n < 10e9 else f"{n / 1e9:,.0f}"


def check_fits(need: int, what: str, advice: str, device: torch.device | str = "cpu") -> None:
    """One line, before allocating, if `need` bytes exceed the device's whole memory."""
    have = device_memory(device)
    if need > have:
        raise AttnlabError(f"{what} needs ~{gb(need)} GB; this machine has {gb(have)} GB: {advice}")


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
    Activations: about 16 numbers per token per layer and width, and 3 attention maps per head
    (scores, probabilities, dropout mask) without a fused kernel."""
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    cfg = getattr(model, "cfg", None)
    layers, width, heads = (getattr(cfg, k, None) for k in ("n_layer", "d_model", "n_head"))
    if tokens is None or not all(isinstance(v, int) for v in (layers, width, heads)):
        return n * ADAM_BYTES, 0
    act = 4 * batch * tokens * layers * (16 * width + 3 * heads * tokens)
    return n * ADAM_BYTES, act


def check_training_fits(build: Callable[[], nn.Module], batch: int, tokens: int | None, device: torch.device) -> None:
    """Refuse, in one line, a model and batch that cannot fit the device."""
    model = meta_model(build)
    if model is None:
        return
    params, act = training_bytes(model, batch, tokens)
    check_fits(params + act, "training this model", "lower --context, --batch-size, --d-model or --n-layer "
               f"(weights, gradients and AdamW moments ~{gb(params)} GB, a batch's activations ~{gb(act)} GB)",
               device)  # fmt: skip
