"""Choosing the device and the numeric precision."""

from __future__ import annotations

import contextlib

import torch

from attnlab.errors import AttnlabError
from attnlab.runtime.precision import decide

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_NAMES = ("auto", *DTYPES)  # what --dtype takes


def pick_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then Apple MPS, then the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise AttnlabError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AttnlabError("--device cuda: no CUDA GPU is available here")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise AttnlabError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise AttnlabError("--device mps: Apple MPS is not available here")
    return device


def dtype_choice(name: str, device: torch.device, width: int = 384, use: str = "train") -> tuple[torch.dtype, str]:
    """The precision to run in, and why in a few words. 'auto': on CUDA GPUs, bf16 to train where the
    GPU has it and float32 to decode (below); on a CPU, whichever of float32 and bf16 ran `use`'s work
    (train: a block's forward and backward; decode: a few rows, a token at a time) faster here at
    `width`, measured so that it can be trusted (precision.py); float32 elsewhere (MPS)."""
    if name == "auto":
        if device.type == "cuda":
            # Decoding under bf16 autocast casts every float32 weight at every step: a cast kernel more
            # per product, in a step whose cost at these sizes is its kernel launches, so it decoded
            # slower than float32 (docs/log.md, "On a GPU"; benchmarks/gpu_generate.py).
            if use == "decode":
                return torch.float32, "auto: float32 to decode on a GPU (bf16 autocast is slower there)"
            bf16 = torch.cuda.is_bf16_supported()
            return (torch.bfloat16, "auto: bf16 on this GPU") if bf16 else (torch.float32, "auto: no bf16 here")
        if device.type == "cpu":
            decision = decide(device, use, width)
            return decision.dtype, decision.note
        return torch.float32, "auto"
    if name not in DTYPES:
        raise AttnlabError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name], "as asked"


def pick_dtype(name: str, device: torch.device, width: int = 384, use: str = "train") -> torch.dtype:
    """dtype_choice without the reason."""
    return dtype_choice(name, device, width, use)[0]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision: weights stay float32, matrix products run in `dtype`."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
