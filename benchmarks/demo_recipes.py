"""The demo's recipe against recipes llama.cpp runs: held-out loss at a fixed step count, and steps/s.

Legend: C model width.

Each candidate is gpt-nano's shape (4 x 128, 4 heads, context 64, characters) trained with the
demo's settings (Muon, wsd, batch 32, seed 1337) for --steps optimizer steps on the stdlib corpus,
then measured on the same 200,000 held-out characters the demo prints. A fixed step count makes
the loss independent of the machine's load (a time budget is not). Then steps/s: the candidates
take turns, --rounds times, each a short run of --pace-steps steps, so a busy spell slows them all;
the median of each candidate's rounds is shown, and its ratio to the first candidate's.

    .venv/bin/python benchmarks/demo_recipes.py --out /tmp/recipes                 # about 12 minutes quiet
    .venv/bin/python benchmarks/demo_recipes.py --out /tmp/r --only 1 --threads 1  # one candidate (a process each)
    .venv/bin/python benchmarks/demo_recipes.py --out /tmp/r --pace-only --rounds 3 --pace-steps 40
    .venv/bin/python benchmarks/demo_recipes.py --steps 20 --pace-steps 5 --rounds 1 --out /tmp/r  # smoke

Candidates (what a GGUF architecture llama.cpp implements can hold):
  gpt-nano-fast       the recipe before issue 54: ReLU², soft-cap 15, bigram table 4096 (no GGUF arch)
  qwen3               rope, QK-norm, RMSNorm, SwiGLU, no biases, untied head (llama.cpp's qwen3)
  llama               the same without QK-norm (llama.cpp's llama)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from attnlab.data import DataConfig
from attnlab.engine.config import TrainConfig
from attnlab.models.gpt import PRESET_TRAINING, GPTConfig
from attnlab.runs.run import load
from attnlab.tasks import train
from attnlab.tasks.lm_eval import evaluate

EVAL_TOKENS = 200_000  # the demo's last line (cli/demo.py)
FAST = dict(positions="rope", qk_norm=True, norm_kind="rmsnorm", tie_weights=False, zero_init=True)
CANDIDATES = {
    "gpt-nano-fast (before)": dict(FAST, activation="relu2", logit_softcap=15.0, bigram_vocab=4096),
    "qwen3 (SwiGLU, QK-norm)": dict(FAST, feedforward="swiglu", bias=False),
    "llama (SwiGLU)": dict(FAST, feedforward="swiglu", bias=False, qk_norm=False),
}


def config(parts: dict) -> GPTConfig:
    return GPTConfig(n_layer=4, n_head=4, d_model=128, context=64, vocab_size=256, **parts)


def run(out: Path, parts: dict, steps: int, eval_interval: int) -> dict:
    """Train one candidate for `steps` steps with the demo's settings; its result and the run's params."""
    settings = dict(PRESET_TRAINING["gpt-nano-fast"], max_steps=steps, eval_interval=eval_interval, eval_batches=20)
    result = train(out, config(parts), TrainConfig(**settings), DataConfig("stdlib"), progress=False)
    result["params"] = load(out, device="cpu").model.num_params()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="a folder for the runs (one per candidate)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--pace-steps", type=int, default=60, help="steps of each timed turn")
    p.add_argument("--rounds", type=int, default=3, help="turns of each candidate for steps/s")
    p.add_argument("--only", type=int, help="train candidate N (0..) alone, for a process of its own")
    p.add_argument("--threads", type=int, help="torch threads (several processes side by side: 1 each)")
    p.add_argument("--pace-only", action="store_true", help="only the steps/s turns")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    rows = {}
    for i, (name, parts) in enumerate(CANDIDATES.items()):
        if args.pace_only or (args.only is not None and i != args.only):
            continue
        result = run(out / slug(name), parts, args.steps, args.steps)
        metrics = evaluate(load(out / slug(name)), "stdlib", max_tokens=EVAL_TOKENS, progress=False)
        rows[name] = {"loss": metrics["loss"], "params": result["params"], "steps": result["step"]}
        print(
            f"{name}: {metrics['loss']:.4f} nats/char after {result['step']} steps ({result['params']:,} params)",
            flush=True,
        )
        (out / f"{slug(name)}.json").write_text(json.dumps(rows[name]))
    if args.only is not None:
        return
    pace = {name: [] for name in CANDIDATES}
    for _ in range(args.rounds):
        for name, parts in CANDIDATES.items():
            with tempfile.TemporaryDirectory() as tmp:
                result = run(Path(tmp) / "r", parts, args.pace_steps, args.pace_steps)
            pace[name].append(result["step"] / result["train_seconds"])
    first = statistics.median(next(iter(pace.values())))
    if args.pace_only:
        for name, speeds in pace.items():
            print(
                f"{name}: {statistics.median(speeds):.2f} steps/s ({statistics.median(speeds) / first:.2f}x), "
                f"turns {', '.join(f'{v:.2f}' for v in speeds)}"
            )
        return
    print(f"\n| recipe | held-out nats/char after {args.steps} steps | vs before | steps/s | vs before | params |")
    print("|---|---|---|---|---|---|")
    base = next(iter(rows.values()))["loss"]
    for name, row in rows.items():
        speed = statistics.median(pace[name])
        row["steps_per_s"] = speed
        print(
            f"| {name} | {row['loss']:.4f} | {row['loss'] - base:+.4f} | {speed:.2f} | {speed / first:.2f} | "
            f"{row['params']:,} |"
        )
    (out / "recipes.json").write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=1))


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.split(" (")[0]).strip("-")


if __name__ == "__main__":
    main()
