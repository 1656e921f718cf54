"""GRPO, Dr. GRPO and DAPO's losses against their formulas written out as loops on a fixed batch."""

import math

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn.policy import PolicyLoss, group_advantages, policy_loss

G = 3
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # two prompts, three answers each
LENGTHS = [4, 1, 3, 2, 4, 3]  # answers of different lengths, padded to 4


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, t = len(LENGTHS), max(LENGTHS)
    old = -torch.rand(b, t, generator=g) * 3  # log-probabilities of the rollout
    logp = old + (torch.rand(b, t, generator=g) - 0.5) * 0.8  # ratios from about 0.67 to 1.5
    ref = old + (torch.rand(b, t, generator=g) - 0.5) * 0.4
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in LENGTHS])
    return logp, old, ref, mask


def advantages_by_hand(rewards, group, scale, eps=1e-6):
    out = []
    for start in range(0, len(rewards), group):
        r = rewards[start : start + group]
        mean = sum(r) / group
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (group - 1))
        out += [(x - mean) / (std + eps) if scale else x - mean for x in r]
    return out


def token_loss(lp, o, rf, a, lo, hi, beta):
    ratio = math.exp(lp - o)
    clipped = min(max(ratio, 1 - lo), 1 + hi)
    k3 = math.exp(rf - lp) - (rf - lp) - 1
    return -min(ratio * a, clipped * a) + beta * k3


def loss_by_hand(kind, logp, old, ref, adv, lo, hi, beta, max_tokens=None):
    per_answer, total, count = [], 0.0, 0
    for i, n in enumerate(LENGTHS):
        losses = [
            token_loss(logp[i, t].item(), old[i, t].item(), ref[i, t].item(), adv[i], lo, hi, beta) for t in range(n)
        ]
        per_answer.append(sum(losses) / n)
        total, count = total + sum(losses), count + n
    if kind == "grpo":
        return sum(per_answer) / len(per_answer)
    if kind == "dr_grpo":
        return total / (len(LENGTHS) * max_tokens)
    return total / count


def test_advantages_equal_the_formula():
    for scale in (True, False):
        got = group_advantages(torch.tensor([1.0, 0.0, 0.5, 2.0, 0.0, 1.0]), 3, scale)
        want = advantages_by_hand([1.0, 0.0, 0.5, 2.0, 0.0, 1.0], 3, scale)
        assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_a_group_of_equal_rewards_has_no_advantage():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    assert adv[:3].abs().max().item() == 0.0
    assert adv[3:].abs().min().item() > 0.5


def test_a_group_of_one_is_a_one_line_error():
    with pytest.raises(AttnlabError, match="at least 2 answers") as e:
        group_advantages(torch.tensor([1.0, 0.0]), 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kind", "eps_high", "beta"),
    [
        ("grpo", None, 0.0),
        ("grpo", None, 0.05),
        ("dr_grpo", None, 0.0),
        ("dr_grpo", None, 0.1),
        ("dapo", 0.28, 0.0),
        ("dapo", 0.28, 0.04),
    ],
)
def test_each_loss_equals_its_formula(kind, eps_high, beta):
    logp, old, ref, mask = batch()
    cfg = PolicyLoss(kind, eps_low=0.2, eps_high=eps_high, beta=beta, max_tokens=6)
    adv = advantages_by_hand(REWARDS, G, cfg.scale)
    got = policy_loss(logp, old, torch.tensor(adv), mask, cfg, ref)
    hi = 0.2 if eps_high is None else eps_high
    want = loss_by_hand(kind, logp, old, ref, adv, 0.2, hi, beta, max_tokens=6)
    assert got.loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    d = [(ref[i, t] - logp[i, t]).item() for i, n in enumerate(LENGTHS) for t in range(n)]
    kl = [math.exp(x) - x - 1 for x in d]
    assert got.kl == pytest.approx(sum(kl) / len(kl) if beta else 0.0, rel=1e-5, abs=1e-7)


def test_padding_does_not_count():
    logp, old, ref, mask = batch()
    adv = group_advantages(torch.tensor(REWARDS), G)
    noisy = logp.masked_fill(mask == 0, 7.0)  # nonsense where the padding is
    for kind in ("grpo", "dapo"):
        cfg = PolicyLoss(kind, beta=0.1)
        a = policy_loss(logp, old, adv, mask, cfg, ref).loss
        b = policy_loss(noisy, old, adv, mask, cfg, ref).loss
        assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_clipping_takes_effect_exactly_outside_the_range():
    ratios = torch.tensor([0.7, 0.79, 0.81, 1.0, 1.19, 1.21, 1.5])
    for sign in (1.0, -1.0):
        logp = torch.log(ratios)[None].clone().requires_grad_(True)  # (1, 7), old = 0
        cfg = PolicyLoss("dapo", eps_low=0.2)
        r = policy_loss(logp, torch.zeros_like(logp), torch.tensor([sign]), torch.ones_like(logp), cfg)
        r.loss.backward()
        grad = logp.grad[0]
        outside = ratios > 1.2 if sign > 0 else ratios < 0.8  # the side the advantage pushes towards
        assert torch.equal(grad == 0, outside), (sign, grad)
        # inside (or on the side the clip does not bind) the gradient is the plain -A * ratio / tokens
        assert torch.allclose(grad[~outside], -sign * ratios[~outside] / len(ratios), atol=1e-6)
        assert r.clip_frac == pytest.approx(outside.float().mean().item())


def test_dapo_clips_high_and_low_apart():
    ratios = torch.tensor([0.75, 1.25, 1.3])
    logp = torch.log(ratios)[None].clone().requires_grad_(True)
    cfg = PolicyLoss("dapo", eps_low=0.2, eps_high=0.28)
    policy_loss(logp, torch.zeros_like(logp), torch.tensor([1.0]), torch.ones_like(logp), cfg).loss.backward()
    assert (logp.grad[0] == 0).tolist() == [False, False, True]  # 1.25 is inside [0.8, 1.28]; 1.3 is not


def test_at_the_rollout_the_gradient_is_the_policy_gradient():
    """With logp == old (the first step on fresh rollouts) the ratio is 1: nothing is clipped, the KL is 0."""
    _, old, _, mask = batch()
    logp = old.clone().requires_grad_(True)
    adv = group_advantages(torch.tensor(REWARDS), G)
    r = policy_loss(logp, old, adv, mask, PolicyLoss("grpo", beta=0.1), old)
    r.loss.backward()
    want = -adv[:, None] * mask / mask.sum(1, keepdim=True) / len(LENGTHS)
    assert torch.allclose(logp.grad, want, atol=1e-6)
    assert r.clip_frac == 0.0 and r.kl == 0.0


def test_unknown_loss_and_missing_reference_are_one_line_errors():
    with pytest.raises(AttnlabError, match="grpo, dr_grpo, dapo"):
        PolicyLoss("ppo")
    logp, old, _, mask = batch()
    with pytest.raises(AttnlabError, match="reference"):
        policy_loss(logp, old, torch.zeros(len(LENGTHS)), mask, PolicyLoss(beta=0.1))
