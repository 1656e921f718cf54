"""PPO from an sft run against a reward model: held-out exact answers and the reward model's score
before and after, the KL to the sft run, the wall time per step and the share spent sampling, and
whether the reward-hacking alarm rang.

    .venv/bin/python benchmarks/ppo.py runs/chat/sft runs/chat/reward --out runs/ppo_bench --steps 100
    .venv/bin/python benchmarks/ppo.py runs/chat/sft runs/rm --out runs/ppo_seeds --seeds 1 2 3 --test 1000

"before" is the sft run answering the held-out instructions greedily (the sft run's own test split,
or with --test N that many test instructions, as benchmarks/grpo_seeds.py draws them); "after" is the ppo run's
eval.json (the same answers' grading and scoring). kl is the mean over the last five rollouts of
sum_t (log pi - log ref) per answer. A run already trained under --out is read again, not retrained.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnlab.data.finetune import TEST_SEED, ChatData, test_split
from attnlab.data.instructions import instructions
from attnlab.engine.config import TrainConfig
from attnlab.io import read_metrics
from attnlab.runs.adapted import run_template
from attnlab.runs.run import load
from attnlab.tasks import train
from attnlab.tasks.hacking import held_out
from attnlab.tasks.ppo import PPO_TRAIN, PPOOptions
from attnlab.tasks.rewards import RewardRun


def trained(out: Path, a: argparse.Namespace, seed: int) -> float:
    """Train the ppo run (unless done); its wall seconds."""
    if not (out / "eval.json").is_file():
        cfg = TrainConfig(
            **dict(
                PPO_TRAIN,
                lr=a.lr,
                max_steps=a.steps,
                eval_interval=a.eval_interval,
                seed=seed,
                batch_size=a.batch_size or PPO_TRAIN["batch_size"],
            )
        )
        t0 = time.perf_counter()
        train(out, None, cfg, task="ppo", init=a.sft, reward=a.reward, beta=a.beta, group=a.group, progress=False)
        (out / "seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    return json.loads((out / "seconds.json").read_text())["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sft", help="the sft run ppo starts from")
    ap.add_argument("reward", help="the reward run that scores the answers")
    ap.add_argument("--out", default="runs/ppo_bench")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-interval", type=int, default=20)
    ap.add_argument("--lr", type=float, default=PPO_TRAIN["lr"])
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--group", type=int, default=PPOOptions.group, help="answers per prompt (ppo --group)")
    ap.add_argument("--batch-size", type=int, default=0, help="prompts per rollout (0: ppo's default)")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[1337], help="one run each, under --out/seed_N when more than one"
    )
    ap.add_argument("--test", type=int, default=0, help="held-out instructions scored (0: the sft run's test split)")
    a = ap.parse_args()
    sft, rm = load(a.sft), RewardRun(a.reward)
    test = (
        instructions("test", a.test, TEST_SEED)
        if a.test
        else test_split(ChatData(**sft.config["data"]), "instructions")
    )
    before = held_out(sft.model, sft.tokenizer, run_template(sft.path), test, rm)
    print(json.dumps({"run": "sft", "exact": before["exact"], "score": before["reward_score"]}), flush=True)
    for seed in a.seeds:
        out = Path(a.out) / f"seed_{seed}" if len(a.seeds) > 1 else Path(a.out)
        seconds = trained(out, a, seed)
        print(json.dumps(summary(out, a, seed, seconds, before, held_out_of(out, test, rm, a.test))), flush=True)


def held_out_of(out: Path, test: list, rm: RewardRun, n: int) -> dict:
    """The ppo run's grading and scoring of the held-out answers: its eval.json, or of --test N."""
    if not n:
        return json.loads((out / "eval.json").read_text())
    run = load(out)
    return held_out(run.model.eval(), run.tokenizer, run_template(out), test, rm)


def summary(out: Path, a: argparse.Namespace, seed: int, seconds: float, before: dict, after: dict) -> dict:
    rows = read_metrics(out / "metrics.jsonl")
    sampled = [r for r in rows if r.get("generate_s", 0) > 0]
    kl = [r["kl"] for r in sampled[-5:]]
    return {
        "steps": a.steps,
        "lr": a.lr,
        "beta": a.beta,
        "seed": seed,
        "group": a.group,
        "exact_before": before["exact"],
        "exact_after": after["exact"],
        "examples": after["examples"],
        "score_before": before["reward_score"],
        "score_after": after["reward_score"],
        "kl_last_rollouts": sum(kl) / max(1, len(kl)),
        "seconds": seconds,
        "seconds_per_step": seconds / a.steps,
        "generate_share": sum(r["generate_s"] for r in sampled) / seconds,
        "alarm": [r["step"] for r in rows if r.get("hacking")],
        "watched": [
            (r["step"], round(r["heldout_score"], 3), r["heldout_exact"]) for r in rows if "heldout_score" in r
        ],
    }


if __name__ == "__main__":
    main()
