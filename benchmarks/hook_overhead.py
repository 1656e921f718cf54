"""What the hook points (nn/hooks.py) cost when no hook is set: per point, and as a share of a forward.

    .venv/bin/python benchmarks/hook_overhead.py

Times one point with no hook (timeit, a million calls), counts the points a forward passes through,
and times the forward itself (gpt-nano: one decode step with the cache, and a 64-token forward),
median of 7 runs each; the share is points x cost / forward time.
"""

from __future__ import annotations

import statistics
import time
import timeit

import torch
from common import cpu_name

from attnlab.models import build_model
from attnlab.models.gpt import PRESETS
from attnlab.nn.hooks import Tap, taps


def median_seconds(fn, repeat: int = 7, number: int = 20) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    model = build_model("gpt", PRESETS["gpt-nano"]).eval()
    x = torch.zeros(1)
    point = Tap()
    per_call = min(timeit.repeat(lambda: point(x), number=1_000_000, repeat=3)) / 1_000_000
    fired = []
    points = taps(model)
    for p in points.values():
        p.fns.append(lambda t, fired=fired: fired.append(1))
    ids = torch.randint(0, model.cfg.vocab_size, (1, 64))
    model(ids)
    per_forward = len(fired)
    for p in points.values():
        p.fns.clear()
    caches = model.new_caches()
    model(ids[:, :63], caches=caches)
    step = ids[:, 63:]

    def decode() -> None:
        for c in caches:
            c.length = 63  # back to 63 cached positions: the same step each time
        model(step, caches=caches, offset=63)

    timings = {
        "decode step (1 token, 63 cached)": median_seconds(decode),
        "forward, 64 tokens": median_seconds(lambda: model(ids)),
    }
    print(f"{cpu_name()}; gpt-nano; a point with no hook: {per_call * 1e9:.0f} ns; {per_forward} points per forward\n")
    for name, seconds in timings.items():
        share = per_forward * per_call / seconds
        print(f"{name:<36} {seconds * 1e3:8.3f} ms   points: {per_forward * per_call * 1e6:6.1f} us = {share:.2%}")


if __name__ == "__main__":
    main()
