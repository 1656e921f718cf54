"""Whether a packed layer (quant/packed.py) runs faster than float32 at its shape on this machine: measured
once per CPU, torch version, thread count, kind and shape, and kept in the cache folder (kernels.json).

A packed product reads fewer bytes but pays to widen them again, and PyTorch's kernels are tuned for
some shapes more than others: on one CPU a small bf16 product by one row took longer than
float32's while a larger int8 one took less time (docs/log.md, "Packed layers"). So, as `--dtype auto`
does for compute, a layer is packed where it measured faster and stays float32 where float32 measured
faster by MARGIN; an answer too noisy to trust (runtime/timing.py) packs, since the user asked for the
smaller weights. The products timed are the kernels a decode step runs, on one row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.io import cache_root, read_json, write_json
from attnlab.quant import row_kernels
from attnlab.quant.packed import COMPUTE, KERNELS, ONE_ROW, ROW_OPS, PackedLinear
from attnlab.runtime.precision import cpu_identity
from attnlab.runtime.timing import MIN_PAIRS, SPREAD_LIMIT, Measurement, measure

CACHE = "kernels.json"
MARGIN = 1.1  # float32 is kept only when it ran this much faster: a tie packs (fewer bytes held)
CALLS = 20  # products per timed sample: a 384 x 384 one takes microseconds, too short to time alone
AGAIN_AFTER = 0.2  # seconds between the two measurements of an answer that keeps float32


@dataclass
class Choice:
    """Pack this shape or keep it float32, and why (a few words)."""

    pack: bool
    note: str


_CHOSEN: dict[str, Choice] = {}


def _key(kind: str, shape: tuple[int, int], device: torch.device) -> str:
    kernel = "|row operator" if _row_op(kind) else ""  # a kept answer is about the kernel it timed
    return f"{_where()}|{kind}|{shape[0]}x{shape[1]}{kernel}"


def _where() -> str:
    """The CPU, the instructions its kernels use (ATEN_CPU_CAPABILITY may ask for fewer), torch, threads."""
    isa = torch.backends.cpu.get_cpu_capability()
    return f"{cpu_identity()}|{isa}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _row_op(kind: str) -> bool:
    """Whether a one-row product of `kind` is attnlab's own operator here (quant/row_kernels.py)."""
    return kind in ROW_OPS and row_kernels.loaded()


def _timer(kind: str, shape: tuple[int, int]):
    """seconds(side): CALLS one-row products, float32's for the torch.float32 side, the packed kernel's
    (attnlab's one-row operator where it is loaded) for the other (timing.measure alternates two sides
    named by dtype; here they are the two kernels). The kernels alone: the casts around a packed product
    are fused away in a compiled step."""
    linear = nn.Linear(shape[1], shape[0])
    layer = PackedLinear.from_linear(linear, kind)
    operands = layer.operands()
    x = torch.randn(1, shape[1])
    if _row_op(kind):
        x_packed, kernel = x, lambda x, *_: ROW_OPS[kind](x, layer)
    else:
        x_packed, kernel = x.to(COMPUTE), KERNELS[kind]

    def seconds(side: torch.dtype) -> float:
        with torch.inference_mode():
            start = time.perf_counter()
            for _ in range(CALLS):
                F.linear(x, linear.weight, linear.bias) if side == torch.float32 else kernel(x_packed, *operands)
            return time.perf_counter() - start

    return seconds


def choose(kind: str, shape: tuple[int, int], device: torch.device, compiled: bool = False) -> Choice:
    """Pack an (O, I) layer as `kind` on `device`, or keep it float32 (measured on a CPU; elsewhere it
    is packed: the memory is what is asked for there). compiled: the model decodes through compiled
    steps, where a bf16 row is a sum that reads the stored bytes (packed.py, ONE_ROW): half float32's
    bytes in the same memory-bound loop, whatever PyTorch's bf16 product measures here."""
    if device.type != "cpu":
        return Choice(True, f"not measured on {device.type}")
    if compiled and kind in ONE_ROW and shape[0] * shape[1] >= ONE_ROW[kind] and not _row_op(kind):
        return Choice(True, f"{kind}: a compiled step's sum over the stored rows")
    k = _key(kind, shape, device)
    if k in _CHOSEN:
        return _CHOSEN[k]
    kept = _read().get(k)
    if isinstance(kept, dict) and isinstance(kept.get("ratio"), (int, float)):
        choice = _decided(kind, float(kept["ratio"]))
    else:
        ratio, doubt = _measured(_timer(kind, shape))
        choice = Choice(True, f"packed: timing not trusted ({doubt})") if doubt else _decided(kind, ratio)
        if not doubt:
            _keep(k, ratio)
    _CHOSEN[k] = choice
    return choice


def _measured(timer) -> tuple[float, str | None]:
    """(float32's time over the packed product's, why it is not trusted or None). An answer that keeps
    float32 is measured twice and kept only when both agree: it is kept for good, and a burst of other
    work once made three packed GPT-2 layers measure far slower than float32 (all three packed faster
    when measured again on a quiet machine: docs/log.md, "Packed layers"), which left them float32 in
    every later run."""
    m = measure(timer)
    if _doubt(m) or m.ratio * MARGIN >= 1:
        return m.ratio, _doubt(m)
    time.sleep(AGAIN_AFTER)
    again = measure(timer)
    if _doubt(again) or again.ratio * MARGIN >= 1:
        return again.ratio, f"float32 {1 / m.ratio:.2g}x faster once, {1 / again.ratio:.2g}x the second time"
    return max(m.ratio, again.ratio), None


def _doubt(m: Measurement) -> str | None:
    """Why a timing cannot be believed: too few samples or too much spread (no bounds on the ratio: an
    int4 product may honestly run several times faster, or a kernel's slow path many times slower)."""
    if m.samples < MIN_PAIRS:
        return f"only {m.samples} timings of each"
    if m.spread > SPREAD_LIMIT:
        return f"spread {m.spread:.0%} after {m.rounds} rounds"
    return None


def _decided(kind: str, ratio: float) -> Choice:
    """ratio: float32's time over the packed layer's."""
    if ratio * MARGIN < 1:
        return Choice(False, f"float32 measured {1 / ratio:.2g}x faster than {kind} here")
    return Choice(True, f"{kind} measured {ratio:.2g}x float32 here")


def clear_cache() -> list[str]:
    """Remove kernels.json and forget this process's answers; the keys the file held."""
    known = _read()
    (cache_root() / CACHE).unlink(missing_ok=True)
    _CHOSEN.clear()
    return list(known)


def _read() -> dict:
    try:
        known = read_json(cache_root() / CACHE)
    except AttnlabError:  # no file, or a corrupt one: measure again
        return {}
    return known if isinstance(known, dict) else {}


def _keep(k: str, ratio: float) -> None:
    known = _read()
    known[k] = {"ratio": round(ratio, 4), "measured": time.strftime("%Y-%m-%d %H:%M")}
    try:
        (cache_root() / CACHE).parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_root() / CACHE, known)
    except (OSError, AttnlabError):  # an unwritable cache costs a measurement next time
        pass
