"""reward: a reward model, the GPT that scores an answer, trained on preference pairs (Bradley-Terry).

attnlab train reward --init runs/sft --data preferences --out runs/rm
attnlab sample runs/dpo --chat "What is 2 + 3?" --best-of 8 --reward runs/rm

attnlab train reward --init runs/sft --out runs/rm --sampled-negatives 2   # the policy's own mistakes rejected

The model is the --init GPT with a new head giving one number for the conversation it reads
(models/reward.py: --head mean, the default, averages a per-token score over the answer that starts as
the --init model's log-probability of it; --head answer sums it; --head last reads the last token
alone, as runs before them did); it learns -log sigmoid(r_chosen - r_rejected). eval.json holds how
often it ranks the chosen answer of a held-out pair first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attnlab.config import option
from attnlab.data.conversations import Conversation, Message, Preference
from attnlab.data.finetune import PreferenceData, splits
from attnlab.data.supervised import Example, Pairs, encode, padded, trained_mask
from attnlab.decoding.chat import answer_room, answers
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPTConfig
from attnlab.models.reward import HEADS
from attnlab.nn.objective import inner
from attnlab.nn.preference import RewardObjective
from attnlab.progress import tqdm
from attnlab.runs.adapted import run_template
from attnlab.runs.run import load
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import Adapting, AdaptOptions, Encoded, check_split, encoded_rows
from attnlab.tasks.base import ModelChoice

SCORE_BATCH = 32
SAMPLE_CHUNK = 256  # conversations sampled together (sampled_negatives)


@torch.no_grad()
def scores(model: nn.Module, examples: list[Example], progress: str | None = None) -> torch.Tensor:
    """The reward model's score of each example (a whole conversation): (N,); progress: a bar's name."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in tqdm(range(0, len(examples), SCORE_BATCH), desc=progress, disable=progress is None, leave=False):
        rows = examples[i : i + SCORE_BATCH]
        (x, last), answer = padded(rows), trained_mask(rows)
        out.append(model.score(x.to(device), last.to(device), answer.to(device)).cpu())
    return torch.cat(out)


def pair_accuracy(model: nn.Module, pairs: list[tuple[Example, Example]], progress: str | None = None) -> dict:
    r = scores(model, [e for pair in pairs for e in pair], progress).view(-1, 2)  # (N, 2) chosen, rejected
    return {"pair_accuracy": float((r[:, 0] > r[:, 1]).float().mean()), "pairs": len(pairs)}


def check_reward_run(run) -> None:
    """A one-line error unless `run` is a reward model's run."""
    if not isinstance(run.task, RewardModelling):
        raise AttnlabError(f"--reward {run.path} is {run.task.noun} run: give a reward run (attnlab train reward)")


def reward_scores(run, prompts: Sequence[Sequence[Message]], answers: Sequence[str]) -> torch.Tensor:
    """The reward run's score of answer i to the conversation prompts[i] (each rendered with the reward
    run's own template): (N,) float32. The one way every caller (best-of-N, grpo, ppo) asks a reward
    model; a conversation longer than its context keeps its end, where the score is read."""
    check_reward_run(run)
    template, context = run_template(run.path), run.model.cfg.context
    # encoded as the training pairs are: the final answer marked (the answer head reads its tokens)
    examples = [
        encode(Conversation((*m, Message("assistant", a))), template, run.tokenizer, "last")
        for m, a in zip(prompts, answers, strict=True)
    ]
    examples = [Example(e.ids[-context:], e.trained[-context:]) for e in examples]
    return scores(run.model, examples)


def score_answers(run, messages: list[Message], answers: list[str]) -> list[float]:
    """The reward run's score of each answer to the one conversation `messages`."""
    return reward_scores(run, [messages] * len(answers), answers).tolist()


def best_of(
    policy, reward, messages: list[Message], n: int, seed: int | None = None, **kw: Any
) -> list[tuple[float, str]]:
    """Best-of-N: n answers of the run `policy` to the conversation, each scored by the reward run;
    (score, answer) best first. Keyword arguments as in decoding.chat.answers (temperature, top_p, ...)."""
    check_reward_run(reward)
    drawn = answers(policy.model, policy.tokenizer, run_template(policy.path), [messages] * n, seed=seed, **kw)
    scored = zip(score_answers(reward, messages, drawn), drawn, strict=True)
    return sorted(scored, key=lambda pair: -pair[0])


@dataclass
class RewardOptions(AdaptOptions):
    head: str = option(
        "mean",
        "what the score reads: every answer token's hidden state and log-probability, "
        "averaged (mean: no length term) or summed (answer), or the last token's hidden state "
        "alone (last: the classic head)",
        HEADS,
    )
    sampled_negatives: int = option(
        0,
        "built-in pairs: answers the --init model samples to each training question "
        "(temperature 1); its first wrong one is the rejected answer in place of the "
        "near miss (0: near misses only)",
        at_least=0,
    )


def sampled_negatives(
    policy, pairs: list[Preference], k: int, seed: int, progress: str | None = None
) -> list[Preference]:
    """Each pair with, as its rejected answer, the first of k answers the run `policy` samples (temperature
    1, answer j of pair i seeded seed + i * k + j) that is not the chosen one; a pair whose k answers are
    all right keeps its own. The policy's mistakes are what best-of-N asks a reward model to rank below
    the right answer, and they are not the synthetic near misses."""
    template, tok = run_template(policy.path), policy.tokenizer
    room = answer_room(tok, [p.chosen[-1].content for p in pairs])  # as greedy answers are scored
    prompts = [p.prompt for p in pairs for _ in range(k)]
    drawn = []  # in chunks: a bar that moves, and thousands of streams never open at once
    for i in tqdm(range(0, len(prompts), SAMPLE_CHUNK), desc=progress, disable=progress is None, leave=False):
        drawn += answers(
            policy.model,
            tok,
            template,
            prompts[i : i + SAMPLE_CHUNK],
            seed=seed + i,
            temperature=1.0,
            max_new_tokens=room,
        )
    out = []
    for i, p in enumerate(pairs):
        wrong = [a for a in drawn[i * k : (i + 1) * k] if a != p.chosen[-1].content.strip()]
        out.append(replace(p, rejected=(Message("assistant", wrong[0]),)) if wrong else p)
    return out


class RewardModelling(Adapting):
    name = "reward"
    help = "a reward model: a GPT scoring answers, trained on chosen/rejected pairs (Bradley-Terry)"
    description = (
        "Train a reward model from a GPT run (--init) on preference pairs: the built-in pairs or a "
        "JSON/JSONL file of {prompt, chosen, rejected} rows. Use it for best-of-N sampling."
    )
    noun = "a reward-model"
    data_config = PreferenceData
    options = RewardOptions
    fixed_options = {
        "sampled_negatives": "the run's pairs stay as they were",
        "head": "the score reads what it was trained to read",
    }
    models = {"reward": ModelChoice("reward", GPTConfig)}
    default_model = "reward"
    family = "reward"
    new_weights = ("reward_head.weight", "reward_head.bias")
    generates = False
    reads_whole_rows = True
    endpoint = "/api/predict"

    def model_of(self, config: dict[str, Any]) -> str:
        return "reward"

    def older_options(self, saved: dict[str, Any]) -> dict[str, Any]:
        return {"head": saved["model"].get("head", "last")}  # its model's head (a run before heads: the last token)

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        e = self.encoded(req)
        k = req.options.sampled_negatives  # a resumed run's own (tasks/request.py)
        if k:
            e.parts["train"] = self.on_policy(req, e, k)
        if not req.resume:  # a resumed run keeps its model's head (the option checked equal to it)
            e.model["head"] = req.options.head
        build = self.builder(req, e.model)
        config = self.run_config(req, e.model)
        config["task"]["sampled_negatives"] = k
        batches = Pairs(e.parts, batch=req.train.batch_size)
        return Prepared(batches, lambda: RewardObjective(build()), config, state=e.parts["test"])

    def on_policy(self, req: TrainRequest, e: Encoded, k: int) -> list[tuple[Example, Example]]:
        """The training pairs with the --init model's own wrong answers rejected (sampled_negatives)."""
        if req.data.data != "preferences":
            raise AttnlabError(
                "--sampled-negatives checks sampled answers against the one right answer of the "
                "built-in pairs: use --data preferences, or leave it out"
            )
        show = "sampling negatives" if req.progress else None
        rows = sampled_negatives(
            load(self.init_run(req.init)), splits(req.data, self.builtin)["train"], k, req.train.seed, show
        )
        encode = lambda row: self.encode_row(row, e.tok, e.template, req.data)  # noqa: E731
        return encoded_rows(rows, encode, e.model["context"] - self.reads_whole_rows, self.unit)

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        show = "scoring the held-out pairs" if req.progress and s.dist.main else None
        return pair_accuracy(inner(s.raw), prepared.state, show) if prepared.state else None

    # ---- a trained run --------------------------------------------------------------------------
    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        pairs, held, source = self.held_out_pairs(run, data)
        check_split(split, held)
        return {"data": source, "split": held, **pair_accuracy(run.model, pairs)}

    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        """The score of `text` as an answer (options["prompt"]: the question it answers)."""
        prompt = [Message("user", options["prompt"])] if options.get("prompt") else []
        return {"kind": self.name, "text": text, "score": score_answers(run, prompt, [text])[0]}

    def show_prediction(self, r: dict[str, Any]) -> str:
        return f"reward {r['score']:+.4f}"

    def show_evaluation(self, r: dict[str, Any]) -> str:
        first = f"{r['pair_accuracy']:.1%} of {r['pairs']} pairs"
        return f"{r['data']} ({r['split']}): the chosen answer ranked first in {first}"

    def test_line(self, test: dict[str, Any]) -> str:
        return f"chosen answer ranked first in {test['pair_accuracy']:.1%} of {test['pairs']} held-out pairs"

    def next_step(self, out: str) -> str:
        return f". Try: attnlab sample RUN --chat QUESTION --best-of 8 --reward {out}"
