"""One batched decode step (the engine's step over B slotted rows: a server's streams, `sample
--num-samples`), eager against compiled (decoding/compiled_rows.py), in one process.

For each --precision the random run of --shape (random_run.py) is loaded as `attnlab.load(...,
quantize=...)` does, B rows are put in the slots from one prompt's caches, and `LMDecoder.feed_slots`
is timed --steps times each way, the two ways alternating step by step so that a neighbour's burst
falls on both; the median is printed with the ratio. The first compiled step builds (or loads) the
library and is not timed.

    .venv/bin/python benchmarks/batched_step.py --shape 6x384 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from common import cpu_named
from random_run import SHAPES, random_run

import attnlab
from attnlab.decoding.adapters import LMDecoder


def filled(decoder: LMDecoder, model, rows: int, prompt: int):
    """decoder's slots with `rows` copies of one prompt's caches."""
    slots = decoder.slots(rows)
    caches = decoder.start(None)
    model(torch.arange(prompt)[None] % model.cfg.vocab_size, caches=caches, offset=0)
    for b in range(rows):
        slots.put(b, caches)
    return slots


def timed(decoder: LMDecoder, slots, ids: torch.Tensor) -> float:
    offsets = slots.table.begin(ids.shape[0])
    t0 = time.perf_counter()
    decoder.feed_slots(slots, ids, offsets)
    seconds = time.perf_counter() - t0
    slots.table.end()
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="6x384", choices=list(SHAPES))
    p.add_argument("--precisions", default="float32,bf16,int8,int4")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=20, help="positions each row holds before the first step")
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", default="/tmp/attnlab-speed", help="folder of the random runs")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = random_run(Path(args.runs), args.shape)
    print(f"{cpu_named()}; {args.shape}, {args.rows} rows, {args.threads} thread(s)")
    for precision in args.precisions.split(","):
        quantize = None if precision == "float32" else precision
        model = attnlab.load(run, device="cpu", quantize=quantize, compiled=True).model
        ways = {"eager": LMDecoder(model, "float32"), "compiled": LMDecoder(model, "float32", compiled=True)}
        ids = torch.full((args.rows, 1), 7)
        with torch.inference_mode():
            slots = {name: filled(d, model, args.rows, args.prompt) for name, d in ways.items()}
            timed(ways["compiled"], slots["compiled"], ids)  # builds or loads the library
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.steps):
                for name, d in ways.items():
                    times[name].append(timed(d, slots[name], ids))
        eager, compiled = (statistics.median(times[n]) * 1e3 for n in ("eager", "compiled"))
        print(f"{precision:8} eager {eager:6.2f} ms  compiled {compiled:6.2f} ms  x{eager / compiled:.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
