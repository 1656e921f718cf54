"""Captioning digits-strips: the Transformer and Show-Attend-Tell's RNN, trained and scored.

    .venv/bin/python benchmarks/captioning.py [--out runs/captions] [--docs docs]

Trains each model with the task's tuned settings (attnlab train caption), then reads the test
split (1,000 strips of digit images never seen in training): exact match of the caption, BLEU,
chrF, and how often each word's most attended patch lies on a digit the word depends on. Draws
where each word of one test strip looked, for both models, into --docs. With --seeds, the
Transformer is trained once per seed (the first one drawn), and its exact match is summarized.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import cpu_name
from PIL import Image

from attnlab.cli.main import main as cli
from attnlab.data import strips

MODELS = ("transformer", "rnn-attention")


def train(model: str, run: Path, seed: int | None) -> dict:
    """Train and test one model with the task's tuned settings; print and return its test scores."""
    start = time.perf_counter()
    extra = [] if seed is None else ["--seed", str(seed)]
    assert cli(["train", "caption", "--model", model, "--out", str(run), "--force", "--device", "cpu", *extra]) == 0
    seconds = time.perf_counter() - start
    test = json.loads((run / "eval.json").read_text())
    print(
        f"{model:>13}{'' if seed is None else f' (seed {seed})'}: {seconds:.0f} s to train and test; exact match "
        f"{test['exact_match']:.2%}, BLEU {test['bleu']:.1f}, chrF {test['chrf']:.1f}; attention on the word's "
        f"digit {test['attention_on_digit']:.2%} of {test['attention_words']} digit words, "
        f"{test['attention_other_words']:.2%} of {test['attention_others']} others"
    )
    return test


def run_models(out: Path, docs: Path, seeds: list[int]) -> None:
    strip = strips.strips("test", 3)[2]
    image = docs / "caption_strip.png"
    Image.fromarray((strip.image * 255).astype("uint8")).save(image)
    print(f"CPU: {cpu_name()}")
    tests = {}
    for model in MODELS:
        tests[model] = train(model, out / model, None)
        picture = docs / f"caption_attention_{model}.png"
        assert cli(["predict", str(out / model), str(image), "--attention", str(picture)]) == 0
    print(f"the strip drawn: digits {strip.digits}, caption {strip.caption!r}")
    if seeds:
        exact = [tests[MODELS[0]]["exact_match"]]
        exact += [train(MODELS[0], out / f"{MODELS[0]}-seed{seed}", seed)["exact_match"] for seed in seeds]
        print(
            f"{MODELS[0]} exact match over {len(exact)} seeds: min {min(exact):.2%}, "
            f"mean {sum(exact) / len(exact):.2%}, max {max(exact):.2%}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/captions")
    p.add_argument("--docs", default="docs")
    p.add_argument("--seeds", type=int, nargs="*", default=[], help="more Transformer seeds")
    args = p.parse_args()
    Path(args.docs).mkdir(exist_ok=True)
    run_models(Path(args.out), Path(args.docs), args.seeds)


if __name__ == "__main__":
    main()
