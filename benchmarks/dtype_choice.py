"""What --dtype auto chooses on this machine, and whether the choice decodes faster.

1. For each use (train, decode) and width, --measurements fresh measurements exactly as --dtype auto
   makes them (runtime/precision.py: interleaved float32/bf16 timings of the use's workload, medians,
   spreads, the spread check and the bounds): the choice, bf16's speed over float32's, each side's
   median and spread, and whether it would be kept. They go to a temporary cache folder: the user's
   ~/.cache/attnlab/dtype.json is neither read nor changed.
2. Decoding speed of a random GPT (gpt-nano-fast's block at each width: 4 layers, heads of 32, context
   256) through the decoding engine (what `attnlab sample` and `serve` use): --tokens new tokens of one
   row, float32 and bfloat16 alternated call by call, tokens/s as the median of --repeats calls each.

Run from the repository root:

    .venv/bin/python benchmarks/dtype_choice.py
    .venv/bin/python benchmarks/dtype_choice.py --widths 128 --measurements 1 --repeats 2 --tokens 16  # smoke
    .venv/bin/python benchmarks/dtype_choice.py --threads 1  # a thread count is a key of its own

Speeds depend on the machine and on what else runs on it: say which CPU, and how loaded it was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import replace

import torch

from attnlab.decoding import sampling
from attnlab.models.gpt import GPT, PRESETS
from attnlab.runtime import precision

CPU = torch.device("cpu")
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def measurements(widths: list[int], n: int) -> None:
    print(f"{'use':<7}{'width':>6}  {'choice':<9}{'bf16 speed':>11}  {'float32 ms':>18}  {'bf16 ms':>18}  kept")
    for use in precision.USES:
        for width in widths:
            for _ in range(n):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the row says why an answer is not kept
                    d = precision.decide(CPU, use, width, fresh=True)
                m = d.measurement
                if m is None:
                    print(f"{use:<7}{width:>6}  {NAMES[d.dtype]:<9}  {d.note}")
                    continue
                f, b = m.float32, m.bfloat16
                why = "yes" if d.kept else "no: " + d.note.removeprefix("the safe choice: ")
                print(
                    f"{use:<7}{width:>6}  {NAMES[d.dtype]:<9}{m.ratio:>10.2f}x  {f.median * 1e3:>9.2f} "
                    f"±{f.spread:>5.0%}  {b.median * 1e3:>9.2f} ±{b.spread:>5.0%}  {why}"
                )


def decode_speed(width: int, tokens: int, repeats: int) -> dict[str, float]:
    cfg = replace(PRESETS["gpt-nano-fast"], d_model=width, n_head=width // 32, context=256)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    rates: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for dtype in rates:  # warm-up: the engine's thread, kernels
        list(sampling.stream(model, [1, 2, 3], 4, seed=0, dtype=dtype))
    for i in range(repeats):
        for dtype in list(rates) if i % 2 == 0 else list(rates)[::-1]:
            start = time.perf_counter()
            n = len(list(sampling.stream(model, [1, 2, 3], tokens, seed=i, dtype=dtype)))
            rates[dtype].append(n / (time.perf_counter() - start))
    return {dtype: statistics.median(r) for dtype, r in rates.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[128, 384])
    p.add_argument("--measurements", type=int, default=3, help="fresh measurements per use and width")
    p.add_argument("--repeats", type=int, default=5, help="decoding calls per dtype")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per decoding call")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["ATTNLAB_CACHE"] = tempfile.mkdtemp(prefix="attnlab-dtype-")  # the user's cache is untouched
    print(
        f"CPU {precision.cpu_model()}, PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f} (1 min)"
    )
    measurements(args.widths, args.measurements)
    print(f"\ndecoding, 1 row, {args.tokens} new tokens, median tokens/s of {args.repeats} interleaved calls:")
    for width in args.widths:
        speed = decode_speed(width, args.tokens, args.repeats)
        print(
            f"  width {width}: float32 {speed['float32']:.0f} tokens/s, bfloat16 {speed['bfloat16']:.0f} tokens/s "
            f"(bf16 {speed['bfloat16'] / speed['float32']:.2f}x)"
        )
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) at the end")


if __name__ == "__main__":
    main()
