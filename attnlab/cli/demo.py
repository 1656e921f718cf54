"""`attnlab demo`: the whole journey in one command, on the built-in `stdlib` corpus.

Trains gpt-nano on the running Python's standard library for about two minutes on a
2-core CPU, prints the validation loss as it falls, then samples from the model.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.data import DataConfig
from attnlab.engine.config import TrainConfig
from attnlab.models.gpt import GPTConfig

# Chosen by a sweep on a 2-core CPU (README, "The demo"): for a two-minute budget, short
# sequences, a high learning rate and many steps beat longer contexts, larger batches or
# other shapes of the same size.
DEMO_TRAIN = dict(max_steps=900, batch_size=32, lr=6e-3, warmup_steps=50, eval_interval=150, eval_batches=20)
PROMPTS = ["def ", "class ", "import "]


def free_dir(path: str | Path) -> Path:
    """path, or path-2, path-3, ... : the first that does not exist yet (never overwrite)."""
    p = Path(path)
    n = 2
    while p.exists():
        p = Path(f"{path}-{n}")
        n += 1
    return p


def run_demo(out: str | Path = "runs/demo", max_steps: int | None = None) -> dict:
    from attnlab.run import load
    from attnlab.tasks import train
    from attnlab.tasks.lm_eval import evaluate

    out = free_dir(out)
    train_kw = {**DEMO_TRAIN, **({"max_steps": max_steps} if max_steps else {})}
    print(f"attnlab demo: training gpt-nano on Python's standard library into {out}")
    result = train(out, GPTConfig.from_preset("gpt-nano"), TrainConfig(**train_kw), DataConfig("stdlib"))
    run = load(out)
    print("\nSamples (temperature 0.8):")
    for i, prompt in enumerate(PROMPTS):
        print("-" * 60)
        print(run.generate(prompt, max_new_tokens=160, temperature=0.8, seed=i))
    print("-" * 60)
    metrics = evaluate(run, "stdlib", progress=False)  # the whole held-out split
    print(
        f"validation: {metrics['loss']:.4f} nats/char, perplexity {metrics['perplexity']:.2f}, "
        f"{metrics['bits_per_char']:.3f} bits/char over {metrics['tokens']:,} held-out characters"
    )
    print(f"run saved in {out}: loss curve {out}/loss.png. Next: attnlab sample {out} --prompt 'def '")
    return {**result, **metrics, "out": str(out)}
