"""What each change to the reward model buys: held-out pair accuracy, and best-of-8 sampling through it
against one sample, for reward runs trained from one sft run (the chat demo's) in several variants.

The samples are drawn once (the demo's way: temperature 1, questions 0..99 of the 200 held-out ones,
one sample each seeded 0.., eight per question seeded 1000 i..) and every variant ranks the same
ones, so rows differ only by their reward model. `pass@8` (a right answer among the eight) is the
ceiling of any best-of-8. The sft model's own log-probability of the answer is the baseline a trained
reward model has to beat (the answer head before its first step: `--variants policy`).

    .venv/bin/python benchmarks/reward_model.py runs/chat/sft --out runs/reward_bench
    .venv/bin/python benchmarks/reward_model.py runs/chat/sft --variants last answer answer+sampled
    .venv/bin/python benchmarks/reward_model.py runs/chat/sft --variants policy-mean mean mean+sampled
    .venv/bin/python benchmarks/reward_model.py runs/sft350 --ranked-by runs/rm --questions 200

--ranked-by RUN...: rank with reward runs already trained (no variant is trained); the policy whose
samples are ranked is then the positional run, whichever sft the reward runs started from.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnlab.data.finetune import TEST_SEED, PreferenceData
from attnlab.data.instructions import instructions
from attnlab.decoding.chat import answers
from attnlab.engine.config import TrainConfig
from attnlab.runs.adapted import run_template
from attnlab.runs.run import load
from attnlab.tasks import train
from attnlab.tasks.reward import reward_scores

QUESTIONS, BEST_OF = 100, 8
TRAIN = dict(batch_size=32, warmup_steps=10, weight_decay=0.0, eval_interval=50, eval_batches=2)
# name -> (head, training steps, learning rate, sampled negatives per training question)
VARIANTS = {
    "last": ("last", 250, 1e-3, 0),  # the reward model as it was: last token, near misses (the demo's settings)
    "policy": ("answer", 0, 1e-3, 0),  # the answer head untrained: the sft model's log-probability
    "answer": ("answer", 250, 1e-3, 0),
    "answer-100": ("answer", 100, 1e-3, 0),
    "answer+sampled": ("answer", 250, 1e-3, 2),
    "answer+sampled-100": ("answer", 100, 3e-4, 2),
    "policy-mean": ("mean", 0, 1e-3, 0),  # the mean head untrained: the sft model's mean log-probability
    "mean": ("mean", 250, 1e-3, 0),  # the default head: the answer head's per-token score averaged
    "mean+sampled": ("mean", 250, 1e-3, 2),
}


def drawn(sft, max_new: int, cache: Path, questions: int = QUESTIONS) -> dict:
    """One sample and BEST_OF samples of each question, drawn once (cached in `cache`)."""
    convs, template = instructions("test", max(200, questions), TEST_SEED)[:questions], run_template(sft.path)
    prompts = [list(c.messages[:-1]) for c in convs]
    if cache.is_file():
        return {**json.loads(cache.read_text()), "prompts": prompts}
    kw = dict(temperature=1.0, max_new_tokens=max_new)
    one = answers(sft.model, sft.tokenizer, template, prompts, seed=0, **kw)
    groups = [
        answers(sft.model, sft.tokenizer, template, [p] * BEST_OF, seed=1000 * i, **kw) for i, p in enumerate(prompts)
    ]
    out = {"one": one, "groups": groups, "right": [c.messages[-1].content for c in convs]}
    cache.write_text(json.dumps(out))
    return {**out, "prompts": prompts}


def best_of_share(rm, d: dict) -> float:
    prompts = [p for p in d["prompts"] for _ in range(BEST_OF)]
    picked = reward_scores(rm, prompts, [a for g in d["groups"] for a in g]).view(-1, BEST_OF).argmax(1)
    return sum(g[k] == r for g, k, r in zip(d["groups"], picked.tolist(), d["right"], strict=True)) / len(d["right"])


def variant(name: str, sft: str, out: Path, pairs: PreferenceData, seed: int) -> tuple[float, float]:
    """Train one reward run (kept if done); its held-out pair accuracy and wall seconds."""
    run = out / name
    if not (run / "bench.json").is_file():
        head, steps, lr, sampled = VARIANTS[name]
        t0 = time.perf_counter()
        res = train(
            run,
            None,
            TrainConfig(**TRAIN, lr=lr, max_steps=steps, seed=seed),
            task="reward",
            data=pairs,
            init=sft,
            head=head,
            sampled_negatives=sampled,
            progress=False,
        )
        bench = {"pair_accuracy": res["test"]["pair_accuracy"], "seconds": time.perf_counter() - t0}
        (run / "bench.json").write_text(json.dumps(bench))
    bench = json.loads((run / "bench.json").read_text())
    return bench["pair_accuracy"], bench["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sft", help="the sft run the reward models start from (and the policy sampled)")
    ap.add_argument("--out", default="runs/reward_bench", help="where the reward runs and samples go")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        nargs="+",
        default=[24, 40],
        help="answer lengths sampled (the demo used 24: too few for 3 digits in words)",
    )
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--questions", type=int, default=QUESTIONS, help="held-out questions sampled")
    ap.add_argument("--ranked-by", nargs="+", default=[], metavar="RUN", help="reward runs already trained")
    a = ap.parse_args()
    out, sft = Path(a.out), load(a.sft)
    out.mkdir(parents=True, exist_ok=True)
    samples = {n: drawn(sft, n, out / f"samples_{n}_{a.questions}.json", a.questions) for n in a.max_new_tokens}
    pairs = PreferenceData(examples=2000, test_examples=200)
    head = "| variant | pair acc | train s |" + "".join(f" one@{n} | best-of-8@{n} | pass@8@{n} |" for n in samples)
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name in a.ranked_by or a.variants:
        acc, seconds = variant(name, a.sft, out, pairs, a.seed) if not a.ranked_by else (float("nan"), 0.0)
        rm, cells = load(name if a.ranked_by else out / name), []
        for d in samples.values():
            one = sum(x == r for x, r in zip(d["one"], d["right"], strict=True)) / len(d["right"])
            ceiling = sum(r in g for g, r in zip(d["groups"], d["right"], strict=True)) / len(d["right"])
            cells.append(f" {one:.0%} | {best_of_share(rm, d):.0%} | {ceiling:.0%} |")
        print(f"| {name} | {acc:.1%} | {seconds:.0f} |" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
