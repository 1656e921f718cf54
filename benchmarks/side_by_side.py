"""Two trainings side by side on one machine: steps/s of each, with PyTorch's own threads ("before")
and with attnlab's sharing (runtime/threads.py, "after"), against one training alone.

    .venv/bin/python benchmarks/side_by_side.py                        # gpt-nano, 60 steps, 3 rounds
    .venv/bin/python benchmarks/side_by_side.py --steps 200 --rounds 5 --task "train sft --init runs/base"

Each round runs, in turn: one training alone; two started together with ATTNLAB_THREADS=0 (PyTorch's
own choice: a thread per core in each, as attnlab did before it shared); two started together with
the default (each sees the other busy and keeps fewer threads). A training's steps/s is its steps over
its training seconds (train_state.safetensors' "elapsed": the loop alone, not start-up or data). The
table gives the median over the rounds and each side-by-side training's share of the lone one's speed.
The machine must be otherwise quiet: the load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors import safe_open

MODES = ("alone", "together, before (ATTNLAB_THREADS=0)", "together, after (default)")


def command(task: str, out: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "attnlab",
        *shlex.split(task),
        "--out",
        str(out),
        "--max-steps",
        str(steps),
        "--eval-interval",
        str(10 * steps),
        "--warmup-steps",
        "1",
        "--force",
    ]


def environment(before: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNLAB_THREADS", "OMP_NUM_THREADS")}
    return {**env, "ATTNLAB_THREADS": "0"} if before else env


def steps_per_second(run: Path, steps: int) -> float:
    with safe_open(str(run / "train_state.safetensors"), framework="pt") as f:
        return steps / float((f.metadata() or {})["elapsed"])


def train(task: str, folder: Path, steps: int, n: int, before: bool) -> tuple[list[float], list[str]]:
    """Start `n` trainings at once; their steps/s and the threads line each printed (if any)."""
    outs = [folder / f"run{i}" for i in range(n)]
    procs = [
        subprocess.Popen(
            command(task, out, steps),
            env=environment(before),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    lines = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"a training failed ({p.returncode}): {err.strip().splitlines()[-1:]}")
        lines += [line for line in err.splitlines() if "busy here" in line]
    return [steps_per_second(out, steps) for out in outs], lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="train lm --preset gpt-nano --data stdlib", help="what each process trains")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average before: {load()}")
    print(f"each: attnlab {args.task} --max-steps {args.steps}; {args.rounds} rounds, modes interleaved")
    speeds: dict[str, list[float]] = {m: [] for m in MODES}
    said: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                n, before = (1, False) if mode == "alone" else (2, "before" in mode)
                got, lines = train(args.task, Path(tmp) / f"{r}-{MODES.index(mode)}", args.steps, n, before)
                speeds[mode] += got
                said += lines
                print(f"  round {r + 1}, {mode}: " + ", ".join(f"{s:.2f}" for s in got) + " steps/s", flush=True)
    alone = statistics.median(speeds["alone"])
    print(f"\n{'':38}  steps/s (median)  of alone  sum of both")
    for mode in MODES:
        s = statistics.median(speeds[mode])
        both = f"{2 * s:.2f}" if mode != "alone" else ""
        print(f"{mode:38}  {s:16.2f}  {s / alone:7.2f}x  {both:>11}")
    print(f"load average after: {load()}")
    if said:
        print(f"what the trainings said (first of {len(said)}): {said[0]}")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
