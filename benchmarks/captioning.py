"""Captioning digits-strips: the Transformer and Show-Attend-Tell's RNN, trained and scored.

    .venv/bin/python benchmarks/captioning.py [--out runs/captions] [--docs docs]

Trains each model with the task's tuned settings (attnlab train caption), then reads the test
split (1,000 strips of digit images never seen in training): exact match of the caption, BLEU,
chrF, and how often each word's most attended patch lies on a digit the word depends on. Draws
where each word of one test strip looked, for both models, into --docs.
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


def run_models(out: Path, docs: Path) -> None:
    strip = strips.strips("test", 3)[2]
    image = docs / "caption_strip.png"
    Image.fromarray((strip.image * 255).astype("uint8")).save(image)
    print(f"CPU: {cpu_name()}")
    for model in MODELS:
        run = out / model
        start = time.perf_counter()
        assert cli(["train", "caption", "--model", model, "--out", str(run), "--force", "--device", "cpu"]) == 0
        seconds = time.perf_counter() - start
        test = json.loads((run / "eval.json").read_text())
        print(f"{model:>13}: {seconds:.0f} s to train and test; exact match {test['exact_match']:.2%}, "
              f"BLEU {test['bleu']:.1f}, chrF {test['chrf']:.1f}; attention on the word's digit "
              f"{test['attention_on_digit']:.2%} of {test['attention_words']} digit words, "
              f"{test['attention_other_words']:.2%} of {test['attention_others']} others")  # fmt: skip
        picture = docs / f"caption_attention_{model}.png"
        assert cli(["predict", str(run), str(image), "--attention", str(picture)]) == 0
    print(f"the strip drawn: digits {strip.digits}, caption {strip.caption!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/captions")
    p.add_argument("--docs", default="docs")
    args = p.parse_args()
    Path(args.docs).mkdir(exist_ok=True)
    run_models(Path(args.out), Path(args.docs))


if __name__ == "__main__":
    main()
