"""`attnlab demo --chat`: from a pretrained model to an assistant, on a CPU, in about fourteen minutes (quiet 2 cores).

    base    a small GPT pretrained on Python's standard library (or --base RUN, reused)
    sft     fine-tuned on the built-in instructions: exact answers on held-out ones, before and after
    dpo     preference-tuned from the sft run on right answers against near misses
    reward  a reward model from the sft run, and best-of-8 sampling through it against plain sampling
    grpo    reinforcement learning from the sft run: a group of sampled answers per instruction, the
            right ones rewarded (the built-in checker), GRPO's group advantages
Each step is a run folder of its own under --out, made by the same `attnlab train` tasks a user runs.

The chain resumes: OUT/chain.json says the folder is a chat demo's and holds the numbers the demo
measured itself (exact answers before fine-tuning, best-of-8) and the seconds of each stage. Run
again, the demo keeps a stage whose run says it is done (its checkpoint at max_steps and its
eval.json), continues one with a checkpoint short of it (`attnlab train --resume`), and starts the
rest. Ctrl-C anywhere is one line: `attnlab demo --chat --out OUT` continues. --seed N sets every
stage's seed (a chain keeps the seed it started with).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnlab.cli.demo import free_dir
from attnlab.data import DataConfig
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.finetune import TEST_SEED, ChatData, PreferenceData
from attnlab.data.instructions import instructions
from attnlab.decoding.chat import answers
from attnlab.engine.config import TrainConfig
from attnlab.engine.resume import saved_progress
from attnlab.errors import AttnlabError, Interrupted
from attnlab.io import read_json, write_json
from attnlab.models.gpt import FAST_TRAINING, GPTConfig
from attnlab.progress import tqdm
from attnlab.runs.adapted import run_template
from attnlab.runs.folder import STATE, is_run
from attnlab.runs.marker import record
from attnlab.runs.run import Run, load
from attnlab.tasks import TASKS, train
from attnlab.tasks.grpo import GRPO_TRAIN
from attnlab.tasks.reward import best_of
from attnlab.tasks.sft import EXACT

# The base: a small character GPT with Qwen3's block (rotary positions, so that what sft teaches at
# one offset of a conversation holds at every later one; exports to llama.cpp as `qwen3`), its
# context holding a conversation of several turns (a question and its answer in ChatML take about 85
# characters), pretrained briefly with the fast recipe (Muon, warmup-stable-decay).
BASE_MODEL = replace(GPTConfig.from_preset("qwen3-nano-fast"), context=512, dropout=0.0)
# 300 steps of 16 rows of 512: a base the sft run learns far more from than AdamW's 100 steps gave
# (the turns measured in docs/fine-tuning.md).
BASE_TRAIN = dict(FAST_TRAINING, batch_size=16, warmup_steps=20, max_steps=300, eval_interval=100, eval_batches=4)
# SFT: Muon on the blocks' matrices (far more exact answers than AdamW in the same 800 steps:
# reversing and capitalizing unseen strings are what it learns faster; docs/fine-tuning.md), no
# weight decay.
SFT_TRAIN = dict(
    optimizer="muon",
    lr=3e-3,
    muon_lr=0.02,
    batch_size=32,
    warmup_steps=50,
    max_steps=800,
    weight_decay=0.0,
    eval_interval=200,
    eval_batches=4,
)
# DPO and GRPO shortened (150 -> 100 and 60 -> 40 steps) to keep the chain within its time: their
# longer runs did not move held-out exact answers up (docs/fine-tuning.md, the seed-3 rows).
DPO_TRAIN = dict(
    lr=1e-4, batch_size=32, warmup_steps=10, max_steps=100, weight_decay=0.0, eval_interval=50, eval_batches=2
)
# The reward model: the sft model with the mean head (models/reward.py: a per-token score averaged
# over the answer's tokens, starting from the sft log-probability; no length term for RL to find):
# it ranks far more held-out pairs right than the last-token head in the same 250 steps
# (benchmarks/reward_model.py; docs/fine-tuning.md).
REWARD_TRAIN = dict(DPO_TRAIN, lr=1e-3, max_steps=250)
# GRPO from the sft run against exact answers, a KL to it kept (benchmarks/grpo_seeds.py measures
# longer runs over seeds beside the random-reward control).
GRPO_CHAIN = dict(GRPO_TRAIN, lr=1e-4, max_steps=40, eval_interval=40)
GRPO_BETA = 0.04
BETA = 0.1
TEST = 200  # held-out instructions scored at each stage
EXAMPLES, PAIRS = 4000, 2000  # training conversations (sft) and preference pairs (dpo, reward)
# Of the sft conversations, the share that chain 2-4 unrelated instructions: without them a held-out
# question asked after earlier turns is almost never answered right (the turns measured in docs/fine-tuning.md).
CHAINED = 0.3
SAMPLED = 100  # of them, answered by plain sampling and by best-of-8
BEST_OF, TEMPERATURE = 8, 1.0
# Room for the longest right answer and its end of turn ("eight eight six<|im_end|>": 25 characters; 24
# cut it short, and every such answer counted wrong in both columns).
SAMPLE_TOKENS = 40
CHAIN, EVAL = "chain.json", "eval.json"


def exact_share(run: Run, convs: list[Conversation], template: ChatTemplate) -> float:
    return TASKS["sft"].exact(run.model, run.tokenizer, template, convs, EXACT)["exact"]


def sampled_vs_best(policy: Run, reward: Run, convs: list[Conversation], seed: int = 0) -> list[float]:
    """Exact answers of one sample each, and of the reward model's pick of BEST_OF samples."""
    template = run_template(policy.path)
    plain = answers(
        policy.model,
        policy.tokenizer,
        template,
        [c.messages[:-1] for c in convs],
        seed=seed,
        temperature=TEMPERATURE,
        max_new_tokens=SAMPLE_TOKENS,
        progress="one sample each",
    )
    right_plain = sum(a == c.messages[-1].content for a, c in zip(plain, convs, strict=True))
    right_best = 0
    for i, c in enumerate(tqdm(convs, desc=f"best of {BEST_OF}", unit=" questions", leave=False)):
        ranked = best_of(
            policy,
            reward,
            list(c.messages[:-1]),
            BEST_OF,
            seed=seed + 1000 * i,
            temperature=TEMPERATURE,
            max_new_tokens=SAMPLE_TOKENS,
        )
        right_best += ranked[0][1] == c.messages[-1].content
    return [right_plain / len(convs), right_best / len(convs)]


def trained(run: Path, max_steps: int) -> bool:
    """The run's own checkpoint says its training is done (step max_steps; the loop writes that one
    whole before it returns)."""
    progress = saved_progress(run) if (run / STATE).is_file() else None
    return progress is not None and progress[0] >= max_steps


class Chain:
    """The chain's folder: its record (chain.json), the stage in progress, and each stage's seconds."""

    def __init__(self, root: Path, base: str | None, seed: int | None = None) -> None:
        self.root, self.current, self.kept = root, "start", []
        self.record = open_chain(root, base, seed)
        self.base = self.record["base"] or str(root / "base")
        self.seed = self.record.get("seed")  # None: each stage's own default

    def save(self) -> None:
        write_json(self.root / CHAIN, self.record)

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """fn(), its seconds added to the stage's (an interrupted stage's count too)."""
        self.current, t0 = name, time.perf_counter()
        try:
            return fn()
        finally:
            seconds = self.record["seconds"]
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
            self.save()

    def number(self, key: str, title: str, fn: Callable[[], Any]) -> Any:
        """A number the demo measures itself: read back from chain.json, or measured and stored."""
        if key in self.record["numbers"]:
            self.kept.append(title)
            return self.record["numbers"][key]
        value = self.timed(title, fn)
        self.record["numbers"][key] = value
        self.save()
        return value

    def stage(
        self,
        name: str,
        title: str,
        task: str,
        settings: dict,
        model: GPTConfig | None = None,
        tested: bool = True,
        **kw: Any,
    ) -> dict[str, Any]:
        """A run of the chain, kept if done, else resumed or started; its test scores (tested=False: a
        stage with none, the pretrained base). kw: train()'s."""
        seeded = {} if self.seed is None else {"seed": self.seed}
        run, cfg = self.root / name, TrainConfig(**{**settings, **seeded})
        scored = not tested or (run / EVAL).is_file()
        if trained(run, cfg.max_steps) and scored:
            print(f"\n== {title}: kept, {run} is trained", flush=True)
            self.kept.append(name)
            return read_json(run / EVAL) if tested else {}
        print(f"\n== {title}", flush=True)
        if trained(run, cfg.max_steps):  # Ctrl-C came while it was scored
            return self.timed(name, lambda: score(run, task))
        resume = is_run(run) and (run / STATE).is_file()  # a checkpoint: continued from it
        model = None if resume else model  # a resumed run has its own
        result = self.timed(name, lambda: train(run, model, cfg, resume=resume, task=task, **kw))
        return result.get("test", {})


def open_chain(root: Path, base: str | None, seed: int | None = None) -> dict[str, Any]:
    """The record of the chain in `root`: a new one (root free or empty), or the one there. A folder
    that is not a chat demo's is the user's, and refused; so is a --base or --seed other than the
    chain's own."""
    if root.is_dir() and (root / CHAIN).is_file():
        rec = read_json(root / CHAIN)
        if not (isinstance(rec, dict) and rec.get("demo") == "chat"):
            raise AttnlabError(f"{root / CHAIN} is not a chat demo's record: choose another --out")
        theirs = rec.get("base")
        if base is not None and (theirs is None or Path(base).resolve() != Path(theirs).resolve()):
            had = f"--base {theirs}" if theirs else f"its own base ({root / 'base'})"
            raise AttnlabError(f"{root} continues a chain from {had}: leave --base out, or give another --out")
        if seed is not None and seed != rec.get("seed"):
            had = "the stages' own seeds" if rec.get("seed") is None else f"--seed {rec['seed']}"
            raise AttnlabError(f"{root} continues a chain with {had}: leave --seed out, or give another --out")
        return {"numbers": {}, "seconds": {}, **rec}
    if root.exists() and not (root.is_dir() and not any(root.iterdir())):
        raise AttnlabError(
            f"{root} exists and is not a chat demo's folder (no {CHAIN}): choose another --out, "
            f"e.g. --out {free_dir(root)}"
        )
    root.mkdir(parents=True, exist_ok=True)
    rec = {
        "demo": "chat",
        "base": None if base is None else str(Path(base).resolve()),
        "seed": seed,
        "numbers": {},
        "seconds": {},
    }
    write_json(root / CHAIN, rec)
    return rec


def score(run: Path, task: str) -> dict[str, Any]:
    """A trained stage's test scores, as its training would have written them into eval.json."""
    scores = TASKS[task].evaluate(load(run), None, None, {})
    test = {k: v for k, v in scores.items() if k not in ("data", "split")}
    record(run, EVAL)
    write_json(run / EVAL, {"split": "test", **test})
    return test


def run_chat_demo(out: str | Path = "runs/chat", base: str | None = None, seed: int | None = None) -> dict[str, Any]:
    """The chain, continued where it stopped; returns its numbers (exact answers at each stage, DPO's
    and the reward model's preference accuracy, plain vs best-of-8) and the seconds of each stage."""
    chain = Chain(Path(out), base, seed)
    try:
        numbers = stages(chain)
    except (Interrupted, KeyboardInterrupt) as e:
        what = e.what if isinstance(e, Interrupted) else "interrupted"
        raise Interrupted(
            f"{what} in stage {chain.current}; finished stages are kept", f"attnlab demo --chat --out {chain.root}"
        ) from None
    report(numbers, chain)
    return {**numbers, "out": str(chain.root)}


def stages(chain: Chain) -> dict[str, Any]:
    root, base = chain.root, chain.base
    test = instructions("test", TEST, TEST_SEED)
    if chain.record["base"] is None:
        chain.stage(
            "base",
            "base: pretraining on Python's standard library",
            "lm",
            BASE_TRAIN,
            model=BASE_MODEL,
            tested=False,
            data=DataConfig("stdlib"),
        )
    before = chain.number("exact_before", "before", lambda: exact_share(load(base), test, run_template(base)))
    print(f"exact answers before fine-tuning: {before:.1%}")
    pairs = PreferenceData(examples=PAIRS, test_examples=TEST)
    sft = chain.stage(
        "sft",
        "sft: fine-tuning on the built-in instructions",
        "sft",
        SFT_TRAIN,
        data=ChatData(examples=EXAMPLES, test_examples=TEST, chained=CHAINED),
        init=base,
    )
    dpo = chain.stage(
        "dpo",
        "dpo: preferring right answers to near misses",
        "dpo",
        DPO_TRAIN,
        data=pairs,
        init=root / "sft",
        beta=BETA,
    )
    rm = chain.stage(
        "reward", "reward: a reward model on the same pairs", "reward", REWARD_TRAIN, data=pairs, init=root / "sft"
    )
    title = f"best-of-{BEST_OF} through the reward model"
    print(f"\n== {title}", flush=True)
    plain, best = chain.number(
        "sampled_vs_best",
        "best_of",
        lambda: sampled_vs_best(load(root / "sft"), load(root / "reward"), test[:SAMPLED], chain.seed or 0),
    )
    grpo = chain.stage(
        "grpo",
        "grpo: reinforcement learning against exact answers",
        "grpo",
        GRPO_CHAIN,
        data=ChatData(examples=EXAMPLES, test_examples=TEST),
        init=root / "sft",
        beta=GRPO_BETA,
        reward="exact",
    )
    return {
        "exact_before": before,
        "exact_sft": sft["exact"],
        "exact_dpo": dpo["exact"],
        "exact_grpo": grpo["exact"],
        "dpo_preference_accuracy": dpo["preference_accuracy"],
        "reward_pair_accuracy": rm["pair_accuracy"],
        "sampled": plain,
        "best_of": best,
        "seconds": sum(chain.record["seconds"].values()),
    }


def report(n: dict[str, Any], chain: Chain) -> None:
    print(
        f"\nexact answers on {TEST} held-out instructions: before {n['exact_before']:.1%}, after sft "
        f"{n['exact_sft']:.1%}, after dpo {n['exact_dpo']:.1%}, after grpo {n['exact_grpo']:.1%}"
    )
    print(
        f"held-out pairs ranked right: dpo {n['dpo_preference_accuracy']:.1%}, reward model "
        f"{n['reward_pair_accuracy']:.1%}"
    )
    print(
        f"sampling at temperature {TEMPERATURE} ({SAMPLED} questions): one sample {n['sampled']:.1%} exact, "
        f"best of {BEST_OF} by the reward model {n['best_of']:.1%}"
    )
    times = ", ".join(f"{name} {s:.0f} s" for name, s in chain.record["seconds"].items())
    kept = f" (kept from an earlier run: {', '.join(chain.kept)})" if chain.kept else ""
    print(f"time: {times}; {n['seconds'] / 60:.1f} minutes in all{kept}")
    print(f"runs in {chain.root}. Next: attnlab chat {chain.root / 'grpo'}; attnlab report {chain.root}")


__all__ = ["run_chat_demo"]
