"""Choosing the device and the numeric precision."""

from __future__ import annotations

import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.errors import AttnlabError
from attnlab.io import cache_root, write_json

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


BF16_MARGIN = 1.15  # bf16 must be this much faster: autocast also pays for casts and float32 reductions
_CHOICES: dict[str, float] = {}  # measured in this process, by key


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else platform), for the measurement's cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _seconds(fn: Callable[[], object], budget: float) -> float:
    """Median seconds of fn over up to 7 calls, stopping once `budget` seconds are spent."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 7 and (not times or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bf16_speedup(device: torch.device, width: int = 384) -> float:
    """How much faster a matrix product of a block's shape, (256, width) @ (width, 4 width), runs
    under bf16 autocast than in float32 on `device` (above 1: bf16 is faster). Float32 and bf16
    alternate, and an emulated bf16 (100x slower on AVX2-only CPUs) stops after one call, so the
    whole measurement takes well under a second."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(256, width, generator=g).to(device)
    b = torch.randn(width, 4 * width, generator=g).to(device)

    def run(dtype: torch.dtype) -> Callable[[], object]:
        def step():
            with autocast(device, dtype):
                (a @ b).sum().item()  # .item(): wait for the device

        return step

    f32, bf16 = run(torch.float32), run(torch.bfloat16)
    f32(), bf16()  # warm up kernels and caches
    ratios = []
    for _ in range(3):  # interleaved, so that a noisy neighbour hits both
        t32 = _seconds(f32, 0.05)
        t16 = _seconds(bf16, 0.05)
        ratios.append(t32 / t16)
        if t16 > 3 * t32:  # clearly slower: no need to look closer
            break
    return statistics.median(ratios)


def bf16_speedup(device: torch.device, width: int = 384) -> float:
    """measure_bf16_speedup, once per device, CPU model, torch version and width: kept in the cache
    folder (dtype.json), so later runs start without measuring."""
    key = f"{device.type}|{cpu_model() if device.type == 'cpu' else torch.cuda.get_device_name(device)}|" \
          f"torch {torch.__version__}|width {width}"  # fmt: skip
    if key in _CHOICES:
        return _CHOICES[key]
    path = cache_root() / "dtype.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get(key), (int, float)):
        known = known if isinstance(known, dict) else {}
        known[key] = round(measure_bf16_speedup(device, width), 3)
        with contextlib.suppress(OSError, AttnlabError):  # an unwritable cache costs a measurement next time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, known)
    _CHOICES[key] = float(known[key])
    return _CHOICES[key]


def dtype_choice(name: str, device: torch.device, width: int = 384) -> tuple[torch.dtype, str]:
    """The precision to run in, and why in a few words. 'auto': bf16 on CUDA GPUs that support it;
    on a CPU, whichever of float32 and bf16 ran a block-shaped matrix product faster here (a CPU's
    flags cannot tell: bf16 was 2.5x faster on an AMD Zen 5, 0.5x on a Xeon with AVX512-BF16 but no
    AMX, and 0.01x where it is emulated); float32 elsewhere (MPS)."""
    if name == "auto":
        if device.type == "cuda":
            bf16 = torch.cuda.is_bf16_supported()
            return (torch.bfloat16, "auto: bf16 on this GPU") if bf16 else (torch.float32, "auto: no bf16 here")
        if device.type == "cpu":
            ratio = bf16_speedup(device, width)
            chosen = torch.bfloat16 if ratio >= BF16_MARGIN else torch.float32
            return chosen, f"bf16 measured {ratio:.2g}x float32 here"
        return torch.float32, "auto"
    if name not in DTYPES:
        raise AttnlabError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name], "as asked"


def pick_dtype(name: str, device: torch.device, width: int = 384) -> torch.dtype:
    """dtype_choice without the reason."""
    return dtype_choice(name, device, width)[0]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision: weights stay float32, matrix products run in `dtype`."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
