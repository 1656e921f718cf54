"""Write tests/data/old_runs/: one tiny run of every task, as the attnlab of its commit writes one.

These runs are the fixtures of tests/test_old_runs.py, which loads and resumes each with today's
code: run once, with the code whose runs are to stay readable (they were written before issue 52
changed what config.json records), never again after that change. The run folders' own absolute
paths (an adapter's base, an --init) are written as OLD_RUNS, which the test replaces by its copy.

    PYTHONPATH=. python tests/data/old_runs/make_old_runs.py
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROOT = "OLD_RUNS"  # the placeholder of the folder the runs were written in
# every run: a step or three on the CPU in float32, validated at the end only
STEPS = ["--max-steps", "2", "--batch-size", "4", "--eval-interval", "2", "--eval-batches", "1"]
STEPS += ["--warmup-steps", "1", "--device", "cpu", "--dtype", "float32"]
MLM_BLOCK = ["--block-size", "32"]
TINY = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--d-ff", "32"]
DATA = ("chats.txt", "t.csv", "t.conll")  # the files the runs read their data from, kept beside them


def kept_file(name: str) -> bool:
    """What load and resume read: all but the pictures and the final scores."""
    return not name.endswith(".png") and name != "eval.json"


def table(path: Path) -> Path:
    """A tiny sentiment table: two labels, a handful of words."""
    rows = [("a fine good film", "pos"), ("a bad dull film", "neg")] * 20
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    return path


def conll(path: Path) -> Path:
    """A tiny tagged corpus: a word and its tag per line, sentences apart."""
    path.write_text("the DET\ncat NOUN\nsat VERB\n\na DET\ndog NOUN\nran VERB\n\n" * 20)
    return path


def chats(path: Path) -> Path:
    """The built-in instructions, rendered: the text the base language model learns its characters from."""
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.instructions import instructions

    path.write_text("".join(ChatTemplate().render(c.messages) for c in instructions("train", 300, 5)))
    return path


def commands(work: Path) -> dict[str, list]:
    """Each task's `attnlab train` command (the adapting tasks start from the lm run)."""
    lm = work / "lm"
    few = ["--examples", "24", "--test-examples", "4"]
    lora = ["--lora-rank", "2", "--lora-targets", "q", "v"]
    return {
        "lm": ["lm", "--data", chats(work / "chats.txt"), "--tokenizer", "char", *TINY, "--context", "256"],
        "mlm": ["mlm", "--data", work / "chats.txt", "--vocab-size", "64", *TINY, "--context", "32", *MLM_BLOCK],
        "classify": ["classify", "--data", table(work / "t.csv"), *TINY, "--max-len", "16"],
        "tag": ["tag", "--data", conll(work / "t.conll"), *TINY],
        "translate": ["translate", "--data", "reverse", "--n-train", "40", *TINY],
        "image": ["image", "--data", "digits", "--n-layer", "1", "--n-head", "2", "--d-model", "16"],
        "caption": ["caption", "--n-train", "40", "--n-test", "8", *TINY],
        "sft": ["sft", "--init", lm, *few, *lora, "--quantize-base", "nf4"],
        "dpo": ["dpo", "--init", lm, *few, *lora],
        "reward": ["reward", "--init", lm, *few],
        "grpo": ["grpo", "--init", lm, *few, *lora, "--group", "2", "--max-new-tokens", "4"],
        "ppo": ["ppo", "--init", lm, *few, *lora, "--reward", work / "reward", "--group", "2", "--max-new-tokens", "4"],
    }


def kept(run: Path, into: Path, work: Path) -> None:
    """What load and resume read of `run`, copied into `into`, the work folder's path as OLD_RUNS."""
    into.mkdir(parents=True)
    for f in run.iterdir():
        if kept_file(f.name):
            text = f.name.endswith(".json") and f.read_text().replace(str(work), ROOT)
            (into / f.name).write_text(text) if text else shutil.copyfile(f, into / f.name)


def main() -> None:
    from attnlab.cli.main import main as attnlab

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp).resolve()
        os.environ["ATTNLAB_CACHE"] = str(work / "cache")
        for name, args in commands(work).items():
            code = attnlab([str(a) for a in ["train", *args, "--out", work / name, *STEPS]])
            assert code == 0, name
            shutil.rmtree(HERE / name, ignore_errors=True)
            kept(work / name, HERE / name, work)
        for name in DATA:
            shutil.copyfile(work / name, HERE / name)
    sizes = sum(f.stat().st_size for f in HERE.rglob("*") if f.is_file())
    print(json.dumps({"runs": len(commands(Path("."))), "bytes": sizes}), file=sys.stderr)


if __name__ == "__main__":
    main()
