"""`attnlab demo`: the whole journey in one command, on the built-in `stdlib` corpus.

Trains qwen3-nano-fast (gpt-nano's shape with the parts of the modern recipe that llama.cpp runs, so
that `attnlab export runs/demo --to gguf` works) on the running Python's standard library for a
budget of two minutes of training, on any machine, prints the validation loss as it falls, then
samples from the model.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.data import DataConfig
from attnlab.engine.config import TrainConfig, budget_seconds
from attnlab.models.gpt import PRESET_TRAINING, GPTConfig
from attnlab.runs.run import load
from attnlab.tasks import train
from attnlab.tasks.lm_eval import evaluate

# gpt-nano-fast without its bigram table and soft-cap, which no GGUF architecture holds: Qwen3's block,
# llama.cpp's qwen3 (docs/gpt.md, "The demo's recipe", measured by benchmarks/demo_recipes.py).
PRESET = "qwen3-nano-fast"
BUDGET = "2m"
# The preset's tuned recipe, for a time budget: training stops when it is spent (max_steps only
# caps it), and the schedule's decay ends with it. Validation every 150 steps, as a progress report.
DEMO_TRAIN = dict(PRESET_TRAINING[PRESET], max_steps=100_000, eval_interval=150, eval_batches=20)
# A floor under the budget: a loaded machine once spent the 2 minutes on 64 steps and ended with
# gibberish, where 300 steps give samples that read as Python (docs/log.md, "The demo").
FLOOR = 300
# What a quiet 2-core CPU with AVX-512 reached in the 2-minute budget from a fresh clone (`make demo`;
# the runs behind it: docs/log.md, "The demo"); the demo prints it beside its own result.
EXPECTED_STEPS, EXPECTED_LOSS = 840, 1.14
PROMPTS = ["def ", "class ", "import "]


def free_dir(path: str | Path) -> Path:
    """path, or path-2, path-3, ... : the first that does not exist yet (never overwrite)."""
    p = Path(path)
    n = 2
    while p.exists():
        p = Path(f"{path}-{n}")
        n += 1
    return p


# Held-out characters the last line is measured on: the split's first 200,000 (a third of it), so
# the demo's budget goes to training (docs/log.md, "The demo"); `attnlab eval` reads all of it.
EVAL_TOKENS = 200_000


def run_demo(out: str | Path = "runs/demo", max_steps: int | None = None, budget: str | None = BUDGET) -> dict:
    """Train, sample, evaluate. max_steps: a step count instead of the time budget (budget=None)."""

    out = free_dir(out)
    train_kw = {
        **DEMO_TRAIN,
        "time_budget": None if max_steps else budget,
        **({"max_steps": max_steps} if max_steps else {"min_steps": FLOOR}),
    }
    what = f"{max_steps} steps" if max_steps else f"a {budget} budget"
    print(f"attnlab demo: training {PRESET} on Python's standard library for {what}, into {out}")
    result = train(out, GPTConfig.from_preset(PRESET), TrainConfig(**train_kw), DataConfig("stdlib"))
    run = load(out)
    print("\nSamples (temperature 0.8):")
    for i, prompt in enumerate(PROMPTS):
        print("-" * 60)
        # eager: these few hundred tokens are written before a first compilation of the step would end
        print(run.generate(prompt, max_new_tokens=160, temperature=0.8, seed=i, compile=False))
    print("-" * 60)
    metrics = evaluate(run, "stdlib", max_tokens=EVAL_TOKENS, progress=False)
    print(
        f"validation: {metrics['loss']:.4f} nats/char, perplexity {metrics['perplexity']:.2f}, "
        f"{metrics['bits_per_char']:.3f} bits/char over {metrics['tokens']:,} held-out characters"
    )
    if not max_steps and budget == BUDGET:
        print(verdict(result["step"], metrics["loss"], result["train_seconds"]))
    print(f"run saved in {out}: loss curve {out}/loss.png. Next: attnlab sample {out} --prompt 'def '")
    return {**result, **metrics, "out": str(out)}


def verdict(steps: int, loss: float, seconds: float) -> str:
    """The steps and loss reached against what a quiet 2-core CPU reaches in the same budget, and this
    machine's pace against it (steps a second: a busy machine trains on past the budget to FLOOR)."""
    budget = budget_seconds(BUDGET)
    line = (
        f"reached {steps} steps and {loss:.2f} nats/char in {seconds / 60:.1f} minutes of training; a quiet "
        f"2-core CPU (AMD EPYC) reaches about {EXPECTED_STEPS} steps and {EXPECTED_LOSS} in {BUDGET}"
    )
    pace = (steps / seconds) / (EXPECTED_STEPS / budget)
    if pace < 0.8:
        line += f". This machine trained at {pace:.0%} of that pace (slower, or busy)"
    return line
