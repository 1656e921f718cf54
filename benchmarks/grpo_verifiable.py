"""A verifiable task learned from scratch: held-out pass@1 after a brief sft alone, and after sft + grpo.

The chat demo's sft run never saw the task (two-digit sums, `--data add --level 2`, by default). One
brief sft on it leaves room; grpo then trains on the same task's training questions, rewarded by its
checker (--reward exact), once per seed, beside one control run rewarded by a coin (--reward random).
pass@1 is the share of the task's held-out test questions (disjoint from training) answered right by
the greedy answer, judged by the task's checker. Every stage is an `attnlab train` command, printed
as it runs (the recipe); the sft run is one run, the seeds vary only the grpo step. Runs already
trained under --out are kept (rerun to finish), and the table is printed again at the end:

    .venv/bin/python benchmarks/grpo_verifiable.py --init runs/chat/sft --out runs/grpo_verifiable --jobs 2

Measured (2-core AMD EPYC, one thread a run, two at once, 2026-11-28): sft 250 steps 36.0%; + grpo
500 steps of 32 prompts x 8 at lr 1e-4: 63.0%, 65.8%, 63.0% (seeds 1-3, +27.0 to +29.8 points,
2,501-2,674 s each); the coin 0.8%. docs/rlhf.md has the table and the settings tried before.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def command(task: str, out: Path, init: Path, a: argparse.Namespace, *more: str) -> list[str]:
    data = ["--data", a.data, "--level", str(a.level), "--test-examples", str(a.test)]
    return ["attnlab", "--threads", str(a.threads), "train", task, "--init", str(init), "--out", str(out), *data, *more]


def trained(cmd: list[str], out: Path) -> float:
    """Run one `attnlab train` command (unless its run is done); its wall seconds."""
    done = out / "wall.json"
    if done.is_file():
        return json.loads(done.read_text())["seconds"]
    sys.stdout.write(f"$ {shlex.join(cmd)}\n")  # one write: jobs print from threads side by side
    sys.stdout.flush()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnlab", *cmd[1:], "--force"], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    done.write_text(json.dumps({"seconds": seconds}))
    return seconds


def row(name: str, reward: str, seed: str, out: Path, seconds: float, sft: float | None) -> str:
    exact = json.loads((out / "eval.json").read_text())["exact"]
    gain = "" if sft is None else f"{100 * (exact - sft):+.1f}"
    return f"| {name} | {reward} | {seed} | {exact:.1%} | {gain} | {seconds:.0f} s |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", default="/tmp/journey/runs/chat/sft", help="the run sft starts from (copied first)")
    ap.add_argument("--out", default="runs/grpo_verifiable")
    ap.add_argument("--data", default="add", help="the verifiable task: add, multiply or countdown")
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--test", type=int, default=500, help="held-out test questions scored")
    ap.add_argument("--sft-steps", type=int, default=250)
    ap.add_argument("--steps", type=int, default=500, help="grpo steps")
    ap.add_argument("--lr", type=float, default=1e-4, help="grpo's learning rate")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32, help="grpo's prompts a step")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--control-seeds", type=int, nargs="*", default=[1], help="seeds of the --reward random run")
    ap.add_argument("--jobs", type=int, default=1, help="grpo runs at once (their wall times then overlap)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="PyTorch threads a run (on a 2-core machine busy with "
        "other jobs, two threads made a grpo step 20x slower than one)",
    )
    a = ap.parse_args()
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    init = root / "init"
    if not init.is_dir():
        shutil.copytree(a.init, init)  # never train from (or write into) the original
    sft = root / "sft"
    more = ["--max-steps", str(a.sft_steps), "--eval-interval", str(a.sft_steps), "--warmup-steps", "10"]
    rows = [row("sft", "-", "1337", sft, trained(command("sft", sft, init, a, *more), sft), None)]
    base = json.loads((sft / "eval.json").read_text())["exact"]
    rl = [
        "--max-steps",
        str(a.steps),
        "--eval-interval",
        str(a.steps),
        "--lr",
        str(a.lr),
        "--group",
        str(a.group),
        "--batch-size",
        str(a.batch_size),
        "--max-new-tokens",
        str(a.max_new_tokens),
    ]
    runs = [("exact", s) for s in a.seeds] + [("random", s) for s in a.control_seeds]

    def one(run: tuple[str, int]) -> str:
        reward, seed = run
        out = root / f"grpo_{reward}_{seed}"
        cmd = command("grpo", out, sft, a, *rl, "--reward", reward, "--seed", str(seed))
        done = row("sft + grpo", reward, str(seed), out, trained(cmd, out), base)
        sys.stdout.write(done + "\n")
        sys.stdout.flush()
        return done

    with ThreadPoolExecutor(a.jobs) as pool:  # each job a process of its own; threads only wait on them
        rows += list(pool.map(one, runs))
    print(f"\n{a.data} level {a.level}, {a.test} held-out questions, greedy pass@1 (the task's checker)\n")
    print("| run | reward | seed | pass@1 | points over sft | wall |\n|---|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
