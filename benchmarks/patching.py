"""How well attribution patching (AtP) ranks sites as activation patching does, on induction, and how
long `attnlab patch` takes on a 4-layer model.

    .venv/bin/python benchmarks/patching.py [--run runs/ih] [--prompts 8] [--repeats 3]

1. The induction run of docs/inside.md (benchmarks/induction_heads.py's settings; trained here when
   --run does not exist yet). Each prompt is n random tokens, then the same tokens but the last:
   the model can only predict that last one by finding it after its predecessor in the first half
   (induction). Two corruptions: the answer's first occurrence replaced by another token (induction
   then copies that one), or the whole first half redrawn (nothing to copy). Metric: the logit
   difference of the right token over the wrong one (the replacement; the corrupted run's top answer).
   For every prompt, activation patching and AtP of every site (residual stream by layer x position,
   heads, components), and Spearman's rank correlation between the two: over all sites, and over the
   sites where either is nonzero (sites whose clean and corrupted values agree are 0 in both, which
   would flatter the correlation).
2. `attnlab patch` on a 4-layer GPT (gpt-nano: 4 x 128, 4 heads) with a 64-token text, activation
   and attribution interleaved, median wall time of --repeats runs each (the command as a user runs
   it: process start, imports, loading the run, patching, printing), then the patching alone in
   this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import cpu_name
from induction_heads import TRAIN
from scipy.stats import spearmanr

import attnlab
from attnlab.cli.main import main as cli
from attnlab.interpret.attribution import attribution_patching
from attnlab.interpret.detectors import repeated_tokens
from attnlab.interpret.patching import activation_patching
from attnlab.interpret.patching_inputs import AnswerMetric
from attnlab.interpret.patching_run import patch

N = 20  # tokens of each half


def induction_prompts(vocab: int, count: int, design: str) -> list[tuple[torch.Tensor, torch.Tensor, int | None]]:
    """(clean (1, 2N-1), corrupted (1, 2N-1), the wrong answer or None) per prompt; the right answer is
    the clean prompt's token N - 1 (what follows the last token's first occurrence).
    design "half": the first half redrawn (nothing to copy; wrong: the corrupted run's top answer);
    "answer": only the answer's first occurrence replaced (induction copies the replacement: wrong)."""
    clean, _ = repeated_tokens(vocab, N, count, seed=1)
    other, _ = repeated_tokens(vocab, N, count, seed=2)
    out = []
    for a, b in zip(clean, other):
        c = a[: 2 * N - 1][None]
        if design == "half":
            out.append((c, torch.cat([b[:N], a[N : 2 * N - 1]])[None], None))
        else:
            x = next(int(t) for t in b if int(t) not in a.tolist())  # a token the clean prompt lacks
            bad = c.clone()
            bad[0, N - 1] = x
            out.append((c, bad, x))
    return out


def compare(run, prompts: int, design: str) -> None:
    model = run.model.eval()
    rows = []
    for clean, corrupted, wrong in induction_prompts(run.tokenizer.vocab_size, prompts, design):
        answer = int(clean[0, N - 1])
        with torch.no_grad():
            wrong = int(model(corrupted)[0, -1].argmax()) if wrong is None else wrong
        if wrong == answer:
            continue
        metric = AnswerMetric("logit-diff", answer, wrong, position=clean.shape[1] - 1)
        t0 = time.perf_counter()
        act = activation_patching(model, (clean,), (corrupted,), metric)
        t1 = time.perf_counter()
        atp = attribution_patching(model, (clean,), (corrupted,), metric)
        t2 = time.perf_counter()
        a, b = act.changes.numpy(), atp.changes.numpy()
        moving = (a != 0) | (b != 0)
        heads = [i for i, s in enumerate(act.sites) if s.granularity == "heads"]
        rows.append(
            (
                spearmanr(a, b).statistic,
                spearmanr(a[moving], b[moving]).statistic,
                spearmanr(a[heads], b[heads]).statistic,
                len(a),
                int(moving.sum()),
                t1 - t0,
                t2 - t1,
                act.clean,
                act.corrupted,
            )
        )
    print(f"corruption: {DESIGNS[design]}")
    print(
        f"{'all sites':>10} {'moving':>8} {'heads':>7} {'sites':>6} {'moving':>7} {'act s':>7} {'AtP s':>7} "
        f"{'m_clean':>8} {'m_corr':>8}"
    )
    for r in rows:
        print(
            f"{r[0]:>10.3f} {r[1]:>8.3f} {r[2]:>7.3f} {r[3]:>6} {r[4]:>7} {r[5]:>7.2f} {r[6]:>7.2f} {r[7]:>8.2f} "
            f"{r[8]:>8.2f}"
        )
    for i, name in enumerate(("all sites", "moving sites", "heads")):
        print(
            f"Spearman, {name}: median {statistics.median(r[i] for r in rows):.3f}, min "
            f"{min(r[i] for r in rows):.3f} over {len(rows)} prompts"
        )
    print(
        f"time per prompt: activation patching median {statistics.median(r[5] for r in rows):.2f} s, AtP "
        f"{statistics.median(r[6] for r in rows):.2f} s"
    )


DESIGNS = {
    "answer": "the answer's first occurrence replaced by a token the prompt lacks (wrong: that token)",
    "half": "the whole first half redrawn (wrong: the corrupted run's top answer)",
}


def cli_times(root: Path, repeats: int) -> None:
    corpus = root / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n" * 200)
    run = root / "nano4"
    if not run.exists():
        assert (
            cli(
                [
                    "train",
                    "lm",
                    "--data",
                    str(corpus),
                    "--out",
                    str(run),
                    "--preset",
                    "gpt-nano",
                    "--tokenizer",
                    "char",
                    "--max-steps",
                    "20",
                    "--eval-interval",
                    "20",
                    "--eval-batches",
                    "1",
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
    text = ("def add(a, b):\n    return a + b\n" * 3)[:64]
    bad = text.replace("a, b", "b, b", 1)
    exe = str(Path(sys.executable).with_name("attnlab"))
    times: dict[str, list[float]] = {"activation": [], "attribution": []}
    for _ in range(repeats):
        for method in times:
            t = time.perf_counter()
            subprocess.run(
                [
                    exe,
                    "patch",
                    str(run),
                    "--clean",
                    text,
                    "--corrupted",
                    bad,
                    "--wrong",
                    "b",
                    "--method",
                    method,
                    "--json",
                ],
                check=True,
                capture_output=True,
            )
            times[method].append(time.perf_counter() - t)
    m = attnlab.load(run, device="cpu").model
    print(
        f"attnlab patch on {run.name} ({m.cfg.n_layer} layers x {m.cfg.d_model}, {m.cfg.n_head} heads), "
        f"{len(text)} tokens:"
    )
    for method, ts in times.items():
        print(f"  --method {method}: median {statistics.median(ts):.2f} s of {', '.join(f'{t:.2f}' for t in ts)}")
    loaded = attnlab.load(run, device="cpu")  # the patching alone, in this process (imports and loading paid)
    inside: dict[str, list[float]] = {"activation": [], "attribution": []}
    for _ in range(repeats):
        for method in inside:
            t = time.perf_counter()
            patch(loaded, text, bad, wrong="b", method=method)
            inside[method].append(time.perf_counter() - t)
    for method, ts in inside.items():
        print(
            f"  patch(..., method={method!r}) in process: median {statistics.median(ts):.3f} s of "
            f"{', '.join(f'{t:.3f}' for t in ts)}"
        )


def run_benchmark() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/ih", help="the induction run (trained here if missing)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scratch", default="runs/patching-bench", help="where the 4-layer timing run is written")
    args = p.parse_args()
    print(
        f"CPU: {cpu_name()}, torch threads {torch.get_num_threads()}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    if not Path(args.run).exists():
        assert cli(["train", "lm", "--out", args.run, *TRAIN]) == 0
    run = attnlab.load(args.run, device="cpu")
    for design in DESIGNS:
        compare(run, args.prompts, design)
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    cli_times(Path(args.scratch), args.repeats)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    run_benchmark()
