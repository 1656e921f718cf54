"""The reward-hacking alarm of an RL run against a reward model (tasks/ppo.py).

A reward model is a proxy: a policy tuned against it can learn what the proxy likes and the task does
not (longer answers, a format, a near miss it ranks high). Every few steps the policy answers the same
held-out prompts greedily; the reward model scores those answers and the checker grades them. When the
score is above the first evaluation's (the policy RL started from) while exact answers are below it,
`patience` evaluations in a row, `reward_hacking` rings, once per such streak. Against the start, not
the evaluation before: a hack that lands in one step and stays (an answer cut short, a near miss the
reward model prefers) is a rise and a fall once, then flat, which a step-to-step rule never sees twice.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.chat import greedy_answers
from attnlab.errors import AttnlabError
from attnlab.io import read_metrics
from attnlab.runs.folder import METRICS
from attnlab.tasks.rewards import Asked, Reward


@dataclass(frozen=True)
class Hacking:
    step: int
    score: tuple[float, float]  # the reward model's held-out score: at the run's first evaluation, now
    exact: tuple[float, float]  # held-out exact answers: at the run's first evaluation, now
    evaluations: int

    def line(self) -> str:
        return (
            f"reward hacking? at step {self.step} the reward model's held-out score rose {self.score[0]:+.3f} -> "
            f"{self.score[1]:+.3f} (+{self.score[1] - self.score[0]:.3f}) while held-out exact answers fell "
            f"{self.exact[0]:.1%} -> {self.exact[1]:.1%} ({(self.exact[1] - self.exact[0]) * 100:+.1f} points), "
            f"{self.evaluations} evaluations in a row"
        )


def reward_hacking(evals: list[tuple[int, float, float]], patience: int) -> Hacking | None:
    """The alarm, on the evaluations so far [(step, score, exact), ...]: it rings at the evaluation
    that makes `patience` in a row with the score above the first's and exact below it (once per
    such streak)."""
    if not evals:
        return None
    (_, s0, e0), streak = evals[0], 0
    for _, s, e in evals[1:]:
        streak = streak + 1 if s > s0 and e < e0 else 0
    if streak != patience:
        return None
    step, s1, e1 = evals[-1]
    return Hacking(step, (s0, s1), (e0, e1), patience)


class HackingStopped(AttnlabError):
    """--stop-on-hacking: the alarm rang."""


@dataclass
class Watch:
    """What the alarm reads: the held-out conversations it answers, and the evaluations so far."""

    convs: list[Conversation]
    chat: tuple[Tokenizer, ChatTemplate]
    rm: Reward  # the reward model
    every: int  # steps between evaluations (--eval-interval)
    patience: int
    stop: bool
    evals: list[tuple[int, float, float]]  # (step, score, exact)
    metrics: Path  # the run's metrics.jsonl: a stopping alarm writes its row itself

    def look(self, model: nn.Module, step: int) -> dict[str, float]:
        """The evaluation of the policy as it is before update `step` + 1: the metrics of its row."""
        if not self.convs:  # a file without held-out rows: nothing to watch
            return {}
        m = held_out(model, *self.chat, self.convs, self.rm)
        self.evals.append((step, m["reward_score"], m["exact"]))
        row = {"heldout_score": m["reward_score"], "heldout_exact": m["exact"]}
        alarm = reward_hacking(self.evals, self.patience)
        if alarm is None:
            return row
        row["hacking"] = 1.0
        if not self.stop:
            print(alarm.line(), file=sys.stderr)
            return row
        with open(self.metrics, "a", encoding="utf-8") as f:  # the loop logs no row for a step that raised
            f.write(json.dumps({"step": step + 1, **row}) + "\n")
        raise HackingStopped(f"{alarm.line()}: stopped (--stop-on-hacking); the run's checkpoint is that policy")


def held_out(
    model: nn.Module, tok: Tokenizer, template: ChatTemplate, convs: list[Conversation], rm: Reward
) -> dict[str, Any]:
    """The share of greedy answers that are right (graded as decoding.chat.right_answers grades) and
    the reward's mean of them, from one decoding of the conversations (all but their last message)."""
    asked = [Asked(tuple(c.messages[:-1]), c.messages[-1].content.strip()) for c in convs]
    got = greedy_answers(model, tok, template, convs)
    right = [q.right(g) for q, g in zip(asked, got, strict=True)]
    return {"exact": sum(right) / len(convs), "reward_score": rm(asked, got, 0).mean().item(), "examples": len(convs)}


def past_evaluations(run: Path, step: int) -> list[tuple[int, float, float]]:
    """The alarm's evaluations a resumed run made before `step` (each logged in the row after it)."""
    rows = read_metrics(run / METRICS) if (run / METRICS).is_file() else []
    return [
        (r["step"] - 1, r["heldout_score"], r["heldout_exact"])
        for r in rows
        if "heldout_score" in r and r["step"] <= step
    ]
