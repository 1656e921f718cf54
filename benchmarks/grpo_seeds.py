"""GRPO on the built-in instructions, several seeds, beside its random-reward control: held-out exact
answers (greedy) by kind after sft, after grpo (--reward exact) and after the control (--reward random).

Each run starts from the same sft run and differs only in its seed (rollouts, prompts drawn); the
held-out set is larger than the chain's 200 (default 1000 test instructions) so that a kind's share
moves by less than a point per question. Runs already trained under --out are kept (rerun to finish).

    .venv/bin/python benchmarks/grpo_seeds.py runs/chat/sft --out runs/grpo_seeds --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnlab.data.finetune import TEST_SEED
from attnlab.data.instructions import instructions
from attnlab.engine.config import TrainConfig
from attnlab.runs.report import by_kind, kind_of
from attnlab.runs.run import load
from attnlab.tasks import train
from attnlab.tasks.grpo import GRPO_TRAIN


def trained(out: Path, sft: str, reward: str, seed: int, a: argparse.Namespace) -> float:
    """Train one grpo run (unless done); its wall seconds (None: kept from before)."""
    if (out / "eval.json").is_file():
        return json.loads((out / "seconds.json").read_text())["seconds"] if (out / "seconds.json").is_file() else 0.0
    cfg = TrainConfig(
        **dict(GRPO_TRAIN, lr=a.lr, max_steps=a.steps, eval_interval=a.steps, seed=seed, batch_size=a.batch_size)
    )
    t0 = time.perf_counter()
    train(out, None, cfg, task="grpo", init=sft, reward=reward, beta=a.beta, group=a.group, progress=False)
    seconds = time.perf_counter() - t0
    (out / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sft", help="the sft run every grpo run starts from")
    ap.add_argument("--out", default="runs/grpo_seeds")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-5, help="from the chain's sft: 5e-5 kept every kind within a point")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=GRPO_TRAIN["batch_size"], help="prompts a step")
    ap.add_argument("--test", type=int, default=1000, help="held-out instructions scored")
    ap.add_argument("--rewards", nargs="+", default=["exact", "random"])
    a = ap.parse_args()
    test = instructions("test", a.test, TEST_SEED)
    rows = [("sft", by_kind(load(a.sft), test), None)]
    print(json.dumps({"run": "sft", "by_kind": rows[0][1]}), flush=True)
    for seed in a.seeds:
        for reward in a.rewards:
            out = Path(a.out) / f"{reward}_{seed}"
            seconds = trained(out, a.sft, reward, seed, a)
            rows.append((out.name, by_kind(load(out), test), seconds))
            print(json.dumps({"run": out.name, "seconds": seconds, "by_kind": rows[-1][1]}), flush=True)
    table(rows, test)


def table(rows: list, test: list) -> None:
    kinds = sorted(rows[0][1])
    print(f"\n| run | all ({len(test)}) | " + " | ".join(kinds) + " | wall |")
    print("|---" * (len(kinds) + 3) + "|")
    sft = rows[0][1]
    for name, kinds_of, seconds in rows:
        wall = "" if seconds is None else f"{seconds / 60:.1f} min"
        print(
            f"| {name} | {overall(kinds_of, test):.1%} | "
            + " | ".join(
                f"{kinds_of[k]:.1%}" + ("" if name == "sft" else f" ({100 * (kinds_of[k] - sft[k]):+.1f})")
                for k in kinds
            )
            + f" | {wall} |"
        )


def overall(kinds_of: dict[str, float], test: list) -> float:
    """The share right over all questions, from the shares by kind weighted by their questions."""
    counts: dict[str, int] = {}
    for c in test:
        counts[kind_of(c)] = counts.get(kind_of(c), 0) + 1
    return sum(kinds_of[k] * n for k, n in counts.items()) / len(test)


if __name__ == "__main__":
    main()
