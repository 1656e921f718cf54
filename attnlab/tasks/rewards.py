"""Where an RL step's rewards come from: one small interface over four sources.

    exact     1 for a right answer, else 0: the checker's verdict on a verifiable question (any right
              countdown expression), equality with the stored answer elsewhere (data/verifiable.graded)
    random    a fair coin per answer, from the batch's seed: the control run, which says how much of
              a gain is the reward's and how much the sampling's
    RUN       a reward model's score (a run of attnlab train reward), through tasks.reward.reward_scores
    callable  a Python function f(question: str, answer: str) -> float, called once per answer with
              the prompt's last user message and the sampled answer's text (the Python API only)

    reward = reward_source("exact")                     # or "random", "runs/rm", my_function
    r = reward(asked, answers, seed)                    # (B,) float32, answer i to asked[i]

config.json records a source's `spec` (exact, random, the reward run's folder, or "callable:NAME"); a
callable cannot be saved, so a resumed run must be given it again (tasks/grpo.py checks it is one).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnlab.data.conversations import Message
from attnlab.data.verifiable import graded, question_of
from attnlab.errors import AttnlabError
from attnlab.runs.run import load
from attnlab.tasks.reward import check_reward_run, reward_scores

REWARDS = ("exact", "random")  # the sources a name gives; anything else is a reward run's folder
CALLABLE = "callable:"  # config.json's prefix for a Python callable's name


@dataclass(frozen=True)
class Asked:
    """A prompt as the reward sources read it."""

    messages: tuple[Message, ...]  # the conversation before the answer
    reference: str  # its stored answer (a countdown question's: one of the right ones)

    @property
    def question(self) -> str:
        return question_of(self.messages)

    def right(self, answer: str) -> bool:
        return graded(self.question, answer, self.reference)


class Reward:
    """A source of rewards: `spec` for config.json; called on B answers, (B,) float32."""

    spec: str

    def __call__(self, asked: Sequence[Asked], answers: Sequence[str], seed: int) -> Tensor:
        raise NotImplementedError

    def to(self, device: torch.device) -> Reward:
        return self  # only a reward model has weights to place


class Exact(Reward):
    spec = "exact"

    def __call__(self, asked: Sequence[Asked], answers: Sequence[str], seed: int) -> Tensor:
        return torch.tensor([q.right(a) for q, a in zip(asked, answers, strict=True)], dtype=torch.float32)


class Coin(Reward):
    spec = "random"

    def __call__(self, asked: Sequence[Asked], answers: Sequence[str], seed: int) -> Tensor:
        return torch.randint(0, 2, (len(answers),), generator=torch.Generator().manual_seed(seed)).float()


class RewardRun(Reward):
    """A reward model's scores of the answers, each after its own conversation."""

    def __init__(self, path: str | Path):
        self.run = load(path, device="cpu")  # placed beside the policy by `to`
        check_reward_run(self.run)
        self.spec = str(Path(path).resolve())

    def __call__(self, asked: Sequence[Asked], answers: Sequence[str], seed: int) -> Tensor:
        return reward_scores(self.run, [q.messages for q in asked], answers).float()

    def to(self, device: torch.device) -> Reward:
        self.run.model.to(device)
        return self


class Called(Reward):
    """A Python callable's reward of each answer: its exceptions and non-numbers are one line that
    names it and the question (a user's reward function is the likeliest thing to fail mid-run)."""

    def __init__(self, fn: Callable[[str, str], float]):
        self.fn, self.name = fn, getattr(fn, "__qualname__", type(fn).__name__)
        self.spec = CALLABLE + self.name

    def __call__(self, asked: Sequence[Asked], answers: Sequence[str], seed: int) -> Tensor:
        return torch.tensor([self.one(q.question, a) for q, a in zip(asked, answers, strict=True)], dtype=torch.float32)

    def one(self, question: str, answer: str) -> float:
        try:
            value = self.fn(question, answer)
        except Exception as e:  # noqa: BLE001  (whatever the user's function raises: one line)
            raise AttnlabError(
                f"the reward {self.name} raised {type(e).__name__}: {e} (question {question!r}, answer {answer!r})"
            ) from None
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise AttnlabError(
                f"the reward {self.name} returned {value!r} ({type(value).__name__}) for the "
                f"question {question!r}: return a finite number"
            )
        return float(value)


def as_kept(spec: str | Callable) -> str | Callable:
    """A --reward as a run keeps it: a reward run's folder absolute (so that a resumed run finds it
    from anywhere, and the folder given again, relative, is the same reward)."""
    if callable(spec) or spec in REWARDS or spec.startswith(CALLABLE):
        return spec
    return str(Path(spec).resolve())


def reward_source(spec: str | Callable) -> Reward:
    """The source `spec` names (a name, a reward run's folder, or a callable); a resumed run's spec
    "callable:NAME" is refused: the function has to be given again."""
    if callable(spec):
        return Called(spec)
    if spec == "exact":
        return Exact()
    if spec == "random":
        return Coin()
    if spec.startswith(CALLABLE):
        name = spec.removeprefix(CALLABLE)
        raise AttnlabError(
            f"this run's rewards came from the Python function {name}, which config.json "
            f"cannot hold: resume with attnlab.train(..., resume=True, reward={name})"
        )
    if not Path(spec).is_dir():
        raise AttnlabError(f"--reward {spec}: choose exact, random or a reward run's folder (attnlab train reward)")
    return RewardRun(spec)
