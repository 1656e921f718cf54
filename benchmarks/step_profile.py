"""Where a decode step's time goes: a greedy decoding call run under PyTorch's profiler, its operators'
own time per new token (the largest first) and the rest, the time no operator accounts for: Python,
the decoding engine's bookkeeping and dispatch between the operators.

    .venv/bin/python benchmarks/generate_speed.py --shape 6x384 --profile    # each attnlab row of the table

An operator's "own" time (the profiler's self CPU time) excludes the operators it calls, so the sum over
operators is the time spent inside them once; wall time per token minus that sum is what a step pays
outside them. A compiled step shows as few operators (inductor's library calls, attnlab's row
products): most of its time is inside them, where an eager step's is spread over some 200 small ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

TOP = 8  # operators listed per row


def step_profile(call: Callable[[], object], new_tokens: int) -> dict:
    """Run `call` (a decoding call that writes new_tokens tokens per row) once under the profiler:
    its wall ms per token, the ms per token inside operators and outside them, and the TOP operators
    by own time [(name, ms per token, calls per token)]."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        call()
        wall = (time.perf_counter() - t0) * 1e3 / new_tokens
    ops = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    own = sorted(
        ((e.key, e.self_cpu_time_total / 1e3 / new_tokens, e.count / new_tokens) for e in ops), key=lambda t: -t[1]
    )
    inside = sum(ms for _, ms, _ in own)
    return {"wall_ms": wall, "inside_ms": inside, "outside_ms": max(0.0, wall - inside), "top": own[:TOP]}


def report(label: str, p: dict) -> str:
    """A few lines for one row: the split, then the largest operators."""
    share = p["outside_ms"] / p["wall_ms"] if p["wall_ms"] else 0.0
    lines = [
        f"{label}: {p['wall_ms']:.3f} ms/token, {p['inside_ms']:.3f} inside operators, "
        f"{p['outside_ms']:.3f} outside them ({share:.0%}: Python, the engine, dispatch)"
    ]
    lines += [f"    {ms:8.4f} ms  {calls:6.1f} calls  {name}" for name, ms, calls in p["top"]]
    return "\n".join(lines)
