"""Timing float32 against bf16 so that the answer can be trusted: interleaved, repeated, medians,
a spread check that measures again when the samples disagree, and bounds on what a CPU can gain.

One timing of one product is not to be trusted on a shared machine (a loaded one once gave bf16 a
large gain and a large loss for the same width; docs/log.md, "Precision"). Here:
  - float32 and bf16 alternate (and swap order each pair), so a neighbour's burst hits both sides;
  - REPEATS pairs per round; each side's median, and its spread: (q3 - q1) / median;
  - a round where either side's spread is above SPREAD_LIMIT is measured again, ROUNDS in all, and
    the steadiest round is kept; `trusted` says whether it may be believed, and why not.
`timer(dtype)` runs the work once in that dtype and returns its seconds; the first call of each
dtype is a warm-up (kernels, caches) and is not counted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

REPEATS = 7  # pairs per round: the median of 7 shrugs off up to 3 samples hit by a neighbour
MIN_PAIRS = 3  # fewer samples have no spread worth the name
ROUNDS = 3  # a noisy round is measured again, at most this many rounds in all
BUDGET = 2.0  # seconds: no round begins, and a round takes no pair past MIN_PAIRS, after this: a quiet
# 2-core CPU needs well under a second a round, a loaded one would take tens of seconds (docs/log.md).
SPREAD_LIMIT = 0.3  # interquartile range over the median of either side above this: too noisy
Timer = Callable[[torch.dtype], float]  # seconds of one run of the work in that dtype
EMULATED = 8.0  # bf16 this many times slower on the first pair: emulated, no need to look closer

# What a CPU can gain from bf16 in these workloads. AVX512-BF16 multiplies twice as many pairs per
# instruction as float32 FMAs, and bf16 halves the bytes read: a block gains a little over twice at
# most, so MOST_GAIN leaves room and still rejects the gain a loaded machine once produced. AMX
# multiplies whole tiles, and then what autocast keeps in float32 (norms, softmax, GELU, casts: about
# an eighth of a step) bounds the gain. The measurements behind both: docs/log.md, "Precision".
MOST_GAIN, MOST_GAIN_AMX = 4.0, 8.0
# How much slower bf16 can honestly be with bf16 instructions: autocast casts every weight at every
# step, which can cost more than a few rows' products; MOST_LOSS is twice the worst seen, and still
# rejects what a loaded machine once kept (docs/log.md, "Precision"). Without bf16 instructions
# (emulated, far slower) no bound applies.
MOST_LOSS = 10.0


@dataclass
class Timing:
    """One dtype's samples, in seconds: their median and spread ((q3 - q1) / median)."""

    median: float
    spread: float
    samples: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        median = statistics.median(seconds)
        if len(seconds) < 2 or median <= 0:
            return cls(median, 0.0, len(seconds))
        q1, _, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
        return cls(median, (q3 - q1) / median, len(seconds))


@dataclass
class Measurement:
    """float32 against bf16 on one workload; `ratio` above 1: bf16 is that many times faster."""

    float32: Timing
    bfloat16: Timing
    rounds: int = 1

    @property
    def ratio(self) -> float:
        return self.float32.median / self.bfloat16.median if self.bfloat16.median > 0 else float("inf")

    @property
    def samples(self) -> int:
        return min(self.float32.samples, self.bfloat16.samples)

    @property
    def spread(self) -> float:
        return max(self.float32.spread, self.bfloat16.spread)

    def to_json(self) -> dict:
        return {"ratio": round(self.ratio, 4), **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> Measurement:
        return cls(Timing(**d["float32"]), Timing(**d["bfloat16"]), int(d.get("rounds", 1)))


def one_round(timer: Timer, repeats: int, deadline: float, early: bool) -> Measurement:
    """Up to `repeats` interleaved pairs (each pair in the other order from the last) after a warm-up,
    fewer (never under MIN_PAIRS) once `deadline` (perf_counter) is past. `early`: stop after one
    pair that shows emulated bf16 (far slower: seconds a call, the answer clear)."""
    timer(torch.float32), timer(torch.bfloat16)  # warm-up: first calls build kernels and fill caches
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    for i in range(repeats):
        for dtype in (torch.float32, torch.bfloat16) if i % 2 == 0 else (torch.bfloat16, torch.float32):
            times[dtype].append(timer(dtype))
        if early and i == 0 and times[torch.bfloat16][0] > EMULATED * times[torch.float32][0]:
            break
        if i + 1 >= MIN_PAIRS and time.perf_counter() > deadline:
            break
    return Measurement(Timing.of(times[torch.float32]), Timing.of(times[torch.bfloat16]))


def measure(
    timer: Timer, native: bool | None = True, repeats: int = REPEATS, rounds: int = ROUNDS, budget: float = BUDGET
) -> Measurement:
    """Rounds until one is steady (both spreads within SPREAD_LIMIT), at most `rounds` and none begun
    after `budget` seconds; the steadiest round. `native`: the CPU has bf16 instructions (None: unknown)."""
    deadline = time.perf_counter() + budget
    best, done = one_round(timer, repeats, deadline, early=native is not True), 1
    while best.spread > SPREAD_LIMIT and best.samples >= MIN_PAIRS and done < rounds and time.perf_counter() < deadline:
        m, done = one_round(timer, repeats, deadline, early=False), done + 1  # noisy: measure again
        best = m if m.spread < best.spread else best
    best.rounds = done
    return best


def bounds(native: bool | None, amx: bool) -> tuple[float, float]:
    """The ratios a CPU can honestly measure: (lowest, highest). `native`: has bf16 instructions
    (None: unknown, as without them, since emulation can be any amount slower)."""
    return (1 / MOST_LOSS if native else 0.0), (MOST_GAIN_AMX if amx else MOST_GAIN)


def distrust(m: Measurement, native: bool | None, amx: bool) -> str | None:
    """Why `m` cannot be believed (a few words), or None when it can."""
    if m.samples < MIN_PAIRS and not (native is not True and m.ratio < 1 / EMULATED):
        return f"only {m.samples} timing{'s' * (m.samples > 1)} of each in the time allowed"
    if m.spread > SPREAD_LIMIT:
        return (
            f"timings too noisy to trust, spread {m.spread:.0%} > {SPREAD_LIMIT:.0%} after {m.rounds} "
            f"round{'s' * (m.rounds > 1)}"
        )
    low, high = bounds(native, amx)
    if m.ratio > high:
        return f"bf16 measured {m.ratio:.2g}x float32, more than a CPU can gain, {high:g}x at most"
    if m.ratio < low:
        return f"bf16 measured {m.ratio:.2g}x float32, slower than a CPU with bf16 instructions can be"
    return None
