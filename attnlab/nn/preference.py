"""Losses that learn from preferences: a pair of answers to one prompt, one chosen over the other.

DPO (Rafailov et al. 2023, "Direct Preference Optimization") trains the policy itself, with a frozen
reference (the model before), on

    loss = -log sigmoid(beta * [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))])

where log pi(y) is the sum of the log-probabilities of the answer's tokens given the prompt. Its
implicit reward of an answer is beta * (log pi(y) - log ref(y)); the reward accuracy is how often the
chosen answer's is the larger.

A reward model scores a whole answer with one number r and learns from the same pairs by the
Bradley-Terry model of a preference, P(y_w over y_l) = sigmoid(r_w - r_l): loss = -log sigmoid(r_w - r_l).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.objective import Objective


def sequence_logprobs(logits: Tensor, targets: Tensor, trained: Tensor) -> Tensor:
    """Sum over each row of log p(target) where `trained`: (B, T, V), (B, T), (B, T) bool -> (B,).
    logits[:, t] predicts targets[:, t] (the targets are the inputs shifted by one)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V); float32: sums of many small numbers
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return (picked * trained).sum(-1)


@dataclass
class DPOResult:
    loss: Tensor  # () mean over the batch
    chosen_rewards: Tensor  # (B,) beta * (log pi - log ref) of the chosen answers
    rejected_rewards: Tensor  # (B,)

    @property
    def accuracy(self) -> float:
        """Share of pairs whose chosen answer has the larger implicit reward."""
        return (self.chosen_rewards > self.rejected_rewards).float().mean().item()

    @property
    def margin(self) -> float:
        return (self.chosen_rewards - self.rejected_rewards).mean().item()


def dpo_loss(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float = 0.1
) -> DPOResult:
    """DPO's loss from the four sequence log-probabilities of a batch of pairs, each (B,)."""
    chosen = beta * (policy_chosen - ref_chosen)  # (B,)
    rejected = beta * (policy_rejected - ref_rejected)  # (B,)
    # -log sigmoid(x) = softplus(-x): exact for large |x| where log(sigmoid(x)) would underflow
    loss = F.softplus(-(chosen - rejected)).mean()
    return DPOResult(loss, chosen.detach(), rejected.detach())


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """A reward model's loss on pairs of scores, each (B,): mean of -log sigmoid(r_chosen - r_rejected)."""
    return F.softplus(-(chosen - rejected)).mean()


def preference_accuracy(chosen: Tensor, rejected: Tensor) -> float:
    return (chosen > rejected).float().mean().item()


def answer_logprobs(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Each row's log-probability of its trained targets: x (B, T) ids, y (B, T) targets, -1 where a
    position is not part of the answer (the prompt, the padding) -> (B,)."""
    logits = model(x)  # (B, T, V)
    return sequence_logprobs(logits, y.clamp(min=0), y >= 0)


class DPOObjective(Objective):
    """DPO on a language model: a batch of pairs, chosen rows then rejected rows padded alike, with the
    reference model's log-probabilities of each answer (computed once, before training)."""

    def __init__(self, model: nn.Module, beta: float = 0.1):
        super().__init__(model)
        self.beta = beta

    def forward(self, x: Tensor, y: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
        # x, y (2B, T): the B chosen answers, then their B rejected ones; ref (2B,)
        logp = answer_logprobs(self.model, x, y)  # (2B,): one forward for both halves
        b = x.shape[0] // 2
        r = dpo_loss(logp[:b], logp[b:], ref[:b], ref[b:], self.beta)
        self.last = {"reward_acc": r.accuracy, "margin": r.margin}
        return r.chosen_rewards - r.rejected_rewards, r.loss


class RewardObjective(Objective):
    """A reward model's training: the score of each answer (as its head reads it), chosen against rejected."""

    def forward(self, x: Tensor, last: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
        # x (2B, T): chosen rows then rejected rows; last (2B,): the index of each row's last token;
        # answer (2B, T) bool: each row's answer tokens
        scores = self.model.score(x, last, answer)  # (2B,)
        b = x.shape[0] // 2
        self.last = {"pair_acc": preference_accuracy(scores[:b], scores[b:])}
        return scores, bradley_terry_loss(scores[:b], scores[b:])
