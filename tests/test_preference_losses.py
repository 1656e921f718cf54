"""DPO's loss and the reward model's, against the formulas written out by hand on a fixed batch."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.preference import bradley_terry_loss, dpo_loss, preference_accuracy, sequence_logprobs


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sequence_logprobs_sum_the_trained_tokens_log_probabilities():
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    trained = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    by_hand = []
    for b in range(2):
        total = 0.0
        for t in range(5):
            if trained[b, t]:
                probs = [math.exp(v) for v in logits[b, t].tolist()]
                total += math.log(probs[targets[b, t]] / sum(probs))
        by_hand.append(total)
    assert sequence_logprobs(logits, targets, trained).tolist() == pytest.approx(by_hand, abs=1e-5)


def test_dpo_loss_is_the_papers_formula():
    pc, pr = torch.tensor([-3.0, -10.0, -4.0]), torch.tensor([-5.0, -8.0, -4.5])
    rc, rr = torch.tensor([-4.0, -9.0, -4.2]), torch.tensor([-4.5, -9.5, -4.1])
    beta = 0.5
    out = dpo_loss(pc, pr, rc, rr, beta)
    terms = [
        -math.log(sigmoid(beta * ((a - c) - (b - d))))
        for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())
    ]
    assert out.loss.item() == pytest.approx(sum(terms) / 3, rel=1e-6)
    assert out.chosen_rewards.tolist() == pytest.approx([0.5, -0.5, 0.1]) and out.accuracy == pytest.approx(2 / 3)
    assert out.margin == pytest.approx(((0.5 - -0.25) + (-0.5 - 0.75) + (0.1 - -0.2)) / 3)


def test_dpo_loss_stays_finite_where_the_log_of_a_sigmoid_would_not():
    big = torch.tensor([-1000.0])
    assert math.isfinite(dpo_loss(big, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), 1.0).loss.item())


def test_a_reward_models_loss_is_minus_log_sigmoid_of_the_score_gap():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.3]), torch.tensor([1.0, 0.5, 0.3])
    by_hand = sum(-math.log(sigmoid(c - r)) for c, r in zip(chosen.tolist(), rejected.tolist())) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(by_hand, rel=1e-6)
    assert preference_accuracy(chosen, rejected) == pytest.approx(1 / 3)


def test_dpo_pulls_the_chosen_answer_up_and_the_rejected_down():
    policy = torch.tensor([-5.0, -5.0], requires_grad=True)  # log pi(chosen), log pi(rejected)
    dpo_loss(policy[:1], policy[1:], torch.tensor([-5.0]), torch.tensor([-5.0]), 0.1).loss.backward()
    assert policy.grad[0] < 0 < policy.grad[1]  # gradient descent raises the chosen, lowers the rejected
