"""How long `attnlab sample` takes to start on the default path: the first use of a model's shape and
precision (its decode step compiled: a cold cache) and every later one (the step loaded from the cache:
warm), beside the eager path (--no-compile), for each --shape.

Each row is one `attnlab sample RUN --prompt ... --max-new-tokens N` process, timed from its start to
its exit (the interpreter, torch, the run's weights, the step, N tokens); the decode step's own share is
what the command prints on stderr ("the decode step is ready (S s)"). Cold: inductor's cache folder
(TORCHINDUCTOR_CACHE_DIR) empty, as on a new machine or after a torch upgrade; attnlab's own cache
(kernels.json, the row operators' library) is left as it is, since it is built once per CPU and torch
and costs the same with or without a compiled step. --samples 16 runs the batched step as well (a
server's first batch, or sample --num-samples), whose library is a second one.

    .venv/bin/python benchmarks/start_up.py                         # both shapes, float32
    .venv/bin/python benchmarks/start_up.py --shape 6x384 --quantize int8
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import columns, cpu_named, format_table
from random_run import SHAPES, random_run

COLUMNS = columns("shape; path; samples; seconds::.1f; step:compiling (s);")


def sample(run: Path, args, env: dict, extra: list[str]) -> tuple[float, str]:
    """(wall seconds, stderr) of one `attnlab sample` process."""
    command = [sys.executable, "-m", "attnlab", "sample", str(run), "--prompt", "def", "--seed", "0"]
    command += ["--max-new-tokens", str(args.tokens), "--num-samples", str(args.samples), *extra]
    if args.quantize:
        command += ["--quantize", args.quantize]
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"attnlab sample failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return seconds, done.stderr


def compiled_seconds(stderr: str) -> str:
    """The seconds the command said its decode steps took to compile or load, summed ('-': none)."""
    found = [int(s) for s in re.findall(r"decode step is ready \((\d+) s\)", stderr)]
    return str(sum(found)) if found else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", default=["6x384", "gpt2-small"], choices=list(SHAPES))
    p.add_argument("--quantize", default=None, help="int8, int4 or bf16 (default: float32)")
    p.add_argument("--tokens", type=int, default=16, help="new tokens each command draws")
    p.add_argument("--samples", type=int, default=1, help="--num-samples (16: the batched step too)")
    p.add_argument("--runs", default=None, help="folder for the random runs (default: a temporary one)")
    args = p.parse_args(argv)
    folder = Path(args.runs or tempfile.mkdtemp(prefix="attnlab-start-"))
    rows = []
    for shape in args.shape:
        run = random_run(folder, shape)
        cold = tempfile.mkdtemp(prefix="attnlab-cold-inductor-")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cold}
        env.pop("ATTNLAB_COMPILE", None)
        for path, extra in (("--no-compile", ["--no-compile"]), ("default, cold cache", []), ("default, warm", [])):
            seconds, stderr = sample(run, args, env, extra)
            step = compiled_seconds(stderr)
            rows.append({"shape": shape, "path": path, "samples": args.samples, "seconds": seconds, "step": step})
            print(f"{shape} {path}: {seconds:.1f} s", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    precision = args.quantize or "float32"
    print(f"{cpu_named()}; {precision}; {args.tokens} new tokens; load average {load:.1f} at the end")
    print(format_table(rows, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
