"""The worked example of docs/inside.md: an induction head forms in a 2-layer attention-only GPT.

    .venv/bin/python benchmarks/induction_heads.py [--out runs/ih] [--docs docs]

Trains on the built-in `repeats` corpus (random letters in which earlier spans recur, see
data/repeats.py) with a weight snapshot every 100 steps, then reads the run the way a user would:
the detectors over training (when the induction and previous-token scores rise, and what the loss
on repeated random tokens does then), the detectors of the final model, and the loss of the
repeated half when each head is zeroed. Draws the three pictures into --docs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from common import cpu_name

import attnlab
from attnlab.cli.main import main as cli
from attnlab.interpret.over_training import over_training, plot_over_training
from attnlab.interpret.report import detector_tables, repeated_ablation
from attnlab.viz.heads import plot_head_tables

TRAIN = [
    "--data",
    "repeats",
    "--n-layer",
    "2",
    "--n-head",
    "4",
    "--d-model",
    "64",
    "--feedforward",
    "none",
    "--positions",
    "rope",
    "--context",
    "64",
    "--block-size",
    "64",
    "--batch-size",
    "64",
    "--lr",
    "1e-3",
    "--weight-decay",
    "0",
    "--schedule",
    "wsd",
    "--max-steps",
    "3000",
    "--snapshot-every",
    "100",
    "--eval-interval",
    "100",
    "--eval-batches",
    "4",
    "--device",
    "cpu",
]


def formed_at(steps: list[int], best: torch.Tensor, level: float = 0.5) -> int | None:
    """The first snapshot step at which the score is above `level`."""
    return next((s for s, v in zip(steps, best.tolist()) if v > level), None)


def report(run, docs: Path) -> None:
    result = over_training(run)
    steps, scores, loss = result["steps"], result["scores"], result["repeat_loss"]
    plot_over_training(result, docs / "induction_over_training.png")
    for name in ("previous-token", "induction"):
        s = scores[name]  # (S, L, H)
        layer, head = divmod(int(s[-1].argmax()), s.shape[-1])
        step = formed_at(steps, s[:, layer, head])
        print(
            f"{name:>15}: best head at the end layer {layer + 1} head {head + 1}, score {float(s[-1].max()):.3f}; "
            f"above 0.5 from step {step}"
        )
    induction = scores["induction"].flatten(1).max(-1).values  # (S,)
    at = formed_at(steps, induction)
    if at is not None:
        i = steps.index(at)
        b = max(0, i - 2)  # two snapshots before
        print(
            f"loss on the repeated half: {loss[0]:.3f} at step 0, {loss[b]:.3f} at step {steps[b]}, {loss[i]:.3f} "
            f"at step {at}, {loss[-1]:.3f} at step {steps[-1]} (chance {result['chance']:.3f})"
        )
    ids = torch.tensor([run.tokenizer.encode("abcdefgh")])
    tables = {k: v for k, v in detector_tables(run, ids).items() if k in ("previous-token", "induction")}
    plot_head_tables(tables, docs / "induction_heads.png", "previous-token and induction scores of every head")
    for name, t in tables.items():
        print(f"{name} (layer x head):", [[round(v, 3) for v in row] for row in t.tolist()])
    ablation = repeated_ablation(run)
    table = torch.tensor(ablation["tables"]["loss change when zeroed"])
    plot_head_tables({"loss change when zeroed": table}, docs / "induction_ablation.png", ablation["title"], True)
    layer, head = divmod(int(tables["induction"].argmax()), table.shape[1])
    print(
        f"repeated-half loss {ablation['loss']:.3f}; zeroing each head adds (layer x head):",
        [[round(v, 3) for v in row] for row in table.tolist()],
    )
    print(
        f"zeroing the best induction head (layer {layer + 1} head {head + 1}) adds {float(table[layer, head]):.3f} "
        "nats to it"
    )


def run_example() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/ih")
    p.add_argument("--docs", default="docs")
    args = p.parse_args()
    print(f"CPU: {cpu_name()}, torch threads {torch.get_num_threads()}")
    start = time.perf_counter()
    assert cli(["train", "lm", "--out", args.out, "--force", *TRAIN]) == 0
    print(f"trained in {time.perf_counter() - start:.0f} s")
    Path(args.docs).mkdir(exist_ok=True)
    report(attnlab.load(args.out, device="cpu"), Path(args.docs))


if __name__ == "__main__":
    run_example()
