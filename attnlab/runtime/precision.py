"""--dtype auto on a CPU: float32 or bf16, whichever ran this kind of work faster here, kept per CPU,
torch version, thread count, use and width in the cache folder (dtype.json).

A CPU's flags cannot say that bf16 is faster (with the same instructions it ran slower than float32
on one CPU and faster on another), but they can say that it is not: without bf16 instructions it is
emulated, many times slower, and float32 is chosen without measuring (the figures: docs/log.md,
"Precision").
Otherwise the run's own kind of work is timed (workloads.py: `train` for training and evaluation,
`decode` for sampling, serving and the decoding engine) by timing.py, and an answer that cannot be
trusted (too noisy after its rounds, or a ratio no CPU can give) is not kept: that run uses float32,
the safe choice, and says so once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import AttnlabError
from attnlab.io import cache_root, write_json
from attnlab.runtime.timing import Measurement, distrust, measure
from attnlab.runtime.workloads import WORKLOADS

BF16_MARGIN = 1.15  # bf16 must be this much faster: autocast also pays for casts and float32 reductions
USES = tuple(WORKLOADS)  # train, decode
CACHE = "dtype.json"


@dataclass
class Decision:
    """What --dtype auto chose for one use and width, why (a few words), and what was measured."""

    dtype: torch.dtype
    note: str
    measurement: Measurement | None = None
    kept: bool = False  # written to the cache


_DECIDED: dict[str, Decision] = {}  # in this process, by key: measured (and warned about) once


def cpu_info() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (Linux); empty elsewhere."""
    with contextlib.suppress(OSError):
        info: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # one processor is enough: they are alike
            name, _, value = line.partition(":")
            info.setdefault(name.strip().lower(), value.strip())
        return info
    return {}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else what platform knows)."""
    return cpu_info().get("model name") or platform.processor() or platform.machine() or "unknown cpu"


def cpu_identity() -> str:
    """The CPU's model name and what tells apart the CPUs sold under it (one model name was a CPU
    without AVX-512 in one session and one with it in the next: docs/log.md, "Precision"): family,
    model and stepping, and a digest of its flags. What is measured on a CPU, or built for it with
    -march=native, is kept under this key, so that another CPU measures (or builds) its own instead of
    trusting this one's."""
    info = cpu_info()
    if not info:
        return cpu_model()
    numbers = " ".join(f"{k} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info)
    digest = hashlib.sha256(" ".join(sorted(cpu_flags() or ())).encode()).hexdigest()[:8]
    return f"{cpu_model()} ({numbers}, flags {digest})"


def cpu_flags() -> set[str] | None:
    """The CPU's instruction-set flags (x86 'flags', ARM 'features'), or None where they cannot be read."""
    info = cpu_info()
    flags = info.get("flags") or info.get("features")
    return set(flags.split()) if flags else None


def native_bf16(flags: set[str] | None) -> bool | None:
    """Has bf16 instructions (x86 avx512_bf16, amx_bf16; ARM bf16); None where unknown."""
    return None if flags is None else any("bf16" in f for f in flags)


def cache_path() -> Path:
    return cache_root() / CACHE


def key(device: torch.device, use: str, width: int) -> str:
    name = cpu_identity() if device.type == "cpu" else torch.cuda.get_device_name(device)
    return f"{device.type}|{name}|torch {torch.__version__}|threads {torch.get_num_threads()}|{use}|width {width}"


def read_cache() -> dict:
    """Every entry of dtype.json (those of other CPUs, versions, or an older format included)."""
    try:
        known = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def entry(value: object) -> Measurement | None:
    """A cached measurement, or None for what is not one (the single ratios kept before)."""
    try:
        return Measurement.from_json(value)  # type: ignore[arg-type]
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def chosen(m: Measurement) -> torch.dtype:
    """What a trusted measurement chooses: bf16 where it was at least BF16_MARGIN faster."""
    return torch.bfloat16 if m.ratio >= BF16_MARGIN else torch.float32


def clear_cache() -> list[str]:
    """Remove dtype.json and forget this process's answers; the keys the file held (nothing else in
    the cache folder is touched)."""
    known = read_cache()
    cache_path().unlink(missing_ok=True)
    _DECIDED.clear()
    return list(known)


def _keep(k: str, m: Measurement, use: str, width: int) -> bool:
    known = read_cache()
    known[k] = {"use": use, "width": width, "measured": time.strftime("%Y-%m-%d %H:%M"), **m.to_json()}
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_path(), known)
    except (OSError, AttnlabError):  # an unwritable cache costs a measurement next time
        return False
    return True


def timer_for(device: torch.device, use: str, width: int) -> Callable[[torch.dtype], float]:
    """seconds(dtype): one run of `use`'s workload at `width` on `device`."""
    run = WORKLOADS[use](device, width)

    def seconds(dtype: torch.dtype) -> float:
        start = time.perf_counter()
        run(dtype)
        return time.perf_counter() - start

    return seconds


def _doubt(m: Measurement) -> str | None:
    """Why `m` cannot be believed on this CPU, or None."""
    flags = cpu_flags()
    return distrust(m, native_bf16(flags), flags is not None and "amx_bf16" in flags)


def _measured(device: torch.device, use: str, width: int, k: str) -> Decision:
    """Time the workload; keep the answer only if it can be trusted."""
    m = measure(timer_for(device, use, width), native_bf16(cpu_flags()))
    why_not = _doubt(m)
    if why_not:
        warnings.warn(
            f"--dtype auto ({use}, width {width}): {why_not}; using float32, the safe choice, and not "
            f"keeping it (`attnlab doctor --measure {width}` measures again)",
            stacklevel=2,
        )
        return Decision(torch.float32, f"the safe choice: {why_not}", m)
    return Decision(chosen(m), f"bf16 measured {m.ratio:.2g}x float32 here", m, _keep(k, m, use, width))


def decide(device: torch.device, use: str, width: int, fresh: bool = False) -> Decision:
    """--dtype auto on a CPU for `use` (train or decode) at `width`: from this process's answer, the
    cache, or a measurement (`fresh`: always measure)."""
    if use not in WORKLOADS:
        raise ValueError(f"unknown use {use!r}: {', '.join(USES)}")
    k = key(device, use, width)
    if k in _DECIDED and not fresh:
        return _DECIDED[k]
    if native_bf16(cpu_flags()) is False:
        decision = Decision(torch.float32, "no bf16 instructions on this CPU: emulated, 15-55x slower")
    elif (m := None if fresh else entry(read_cache().get(k))) is not None and _doubt(m) is None:  # kept, believable
        decision = Decision(chosen(m), f"bf16 measured {m.ratio:.2g}x float32 here", m, True)
    else:
        decision = _measured(device, use, width, k)
    _DECIDED[k] = decision
    return decision
