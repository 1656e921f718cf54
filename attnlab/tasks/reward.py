"""reward: a reward model, the GPT that scores an answer, trained on preference pairs (Bradley-Terry).

attnlab train reward --init runs/sft --data preferences --out runs/rm
attnlab sample runs/dpo --chat "What is 2 + 3?" --best-of 8 --reward runs/rm

The model is the --init GPT with a new head giving one number for the conversation it reads (its
last token's); it learns -log sigmoid(r_chosen - r_rejected). eval.json holds how often it ranks the
chosen answer of a held-out pair first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnlab.data.conversations import Conversation, Message
from attnlab.data.finetune import PreferenceData
from attnlab.data.supervised import Example, Pairs, encode, padded
from attnlab.decoding.chat import answers
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPTConfig
from attnlab.nn.objective import inner
from attnlab.nn.preference import RewardObjective
from attnlab.progress import tqdm
from attnlab.runs.adapted import run_template
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import Adapting, check_split
from attnlab.tasks.base import ModelChoice

SCORE_BATCH = 32


@torch.no_grad()
def scores(model: nn.Module, examples: list[Example], progress: str | None = None) -> torch.Tensor:
    """The reward model's score of each example (a whole conversation): (N,); progress: a bar's name."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in tqdm(range(0, len(examples), SCORE_BATCH), desc=progress, disable=progress is None, leave=False):
        x, last = padded(examples[i : i + SCORE_BATCH])
        out.append(model.score(x.to(device), last.to(device)).cpu())
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
    examples = [encode(Conversation((*m, Message("assistant", a))), template, run.tokenizer)
                for m, a in zip(prompts, answers, strict=True)]  # fmt: skip
    examples = [Example(e.ids[-context:], e.trained[-context:]) for e in examples]
    return scores(run.model, examples)


def score_answers(run, messages: list[Message], answers: list[str]) -> list[float]:
    """The reward run's score of each answer to the one conversation `messages`."""
    return reward_scores(run, [messages] * len(answers), answers).tolist()


def best_of(policy, reward, messages: list[Message], n: int, seed: int | None = None,
            **kw: Any) -> list[tuple[float, str]]:  # fmt: skip
    """Best-of-N: n answers of the run `policy` to the conversation, each scored by the reward run;
    (score, answer) best first. Keyword arguments as in decoding.chat.answers (temperature, top_p, ...)."""
    check_reward_run(reward)
    drawn = answers(policy.model, policy.tokenizer, run_template(policy.path), [messages] * n, seed=seed, **kw)
    scored = zip(score_answers(reward, messages, drawn), drawn, strict=True)
    return sorted(scored, key=lambda pair: -pair[0])


class RewardModelling(Adapting):
    name = "reward"
    help = "a reward model: a GPT scoring answers, trained on chosen/rejected pairs (Bradley-Terry)"
    description = ("Train a reward model from a GPT run (--init) on preference pairs: the built-in pairs or a "
                   "JSON/JSONL file of {prompt, chosen, rejected} rows. Use it for best-of-N sampling.")  # fmt: skip
    noun = "a reward-model"
    data_config = PreferenceData
    models = {"reward": ModelChoice("reward", GPTConfig)}
    default_model = "reward"
    family = "reward"
    new_weights = ("reward_head.weight", "reward_head.bias")
    generates = False
    reads_whole_rows = True
    endpoint = "/api/predict"

    def model_of(self, config: dict[str, Any]) -> str:
        return "reward"

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        e = self.encoded(req)
        build = self.builder(req, e.model, e.adapter)
        config = self.run_config(req, e.model, e.adapter)
        batches = Pairs(e.parts, batch=req.train.batch_size)
        return Prepared(batches, lambda: RewardObjective(build()), config, state=e.parts["test"])

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
