"""Checks for lesson 10 (reward models, PPO and GRPO): group advantages, the clipped surrogate, GAE."""

from __future__ import annotations

import torch

from attnlab.nn.policy import PolicyLoss, group_advantages, policy_loss
from attnlab.nn.ppo import gae
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


@exercise
def check_group_advantages(my_group_advantages) -> None:
    """my_group_advantages(rewards (N * G,), G) -> (N * G,): (r - group mean) / (group std + 1e-6)."""
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0.5, 2.0, 1, 1, 1, 1])  # 3 groups of 4, the last all equal
    got = as_tensor(my_group_advantages(rewards, 4), "my_group_advantages(rewards, 4)")
    want = group_advantages(rewards, 4)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-4):
        r = rewards.view(-1, 4)
        if torch.allclose(got, (rewards - rewards.mean()) / (rewards.std() + 1e-6), atol=1e-4):
            raise WrongAnswer("the mean and std are the whole batch's: take them per group (rewards.view(-1, G))")
        if torch.allclose(got, (r - r.mean(1, keepdim=True)).view(-1), atol=1e-4):
            raise WrongAnswer("not divided by the group's std: (r - mean) / (std + 1e-6)")
        population = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + 1e-6)
        if torch.allclose(got, population.view(-1), atol=1e-4):
            raise WrongAnswer("the std divides by G (population std): torch's std divides by G - 1")
    compare("my_group_advantages(rewards, 4)", got, want, atol=1e-4)
    correct("each answer against its own group: a group whose rewards are all equal gets 0")


def _token_losses(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, eps: float) -> torch.Tensor:
    """attnlab's policy_loss on each token alone (an answer of one token): the per-token losses (B,)."""
    mask, cfg = torch.ones(1, 1, dtype=torch.bool), PolicyLoss("grpo", eps_low=eps)
    return torch.stack(
        [policy_loss(lp.view(1, 1), o.view(1, 1), a.view(1), mask, cfg).loss for lp, o, a in zip(logp, old, advantages)]
    )


@exercise
def check_clipped_loss(my_clipped_loss) -> None:
    """my_clipped_loss(logp (B,), old (B,), advantages (B,), eps) -> the token losses (B,)."""
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5, 0.2, 0.2]))
    # ratios 1.5, 0.5, 1.1, 0.7, 3.0, 0.5 with advantages of both signs: clipped and unclipped tokens
    logp = old + torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7, 3.0, 0.5]))
    advantages = torch.tensor([1.0, -1.0, 2.0, 1.0, -0.5, 0.5])
    got = as_tensor(my_clipped_loss(logp, old, advantages, 0.2), "my_clipped_loss(logp, old, A, 0.2)")
    want = _token_losses(logp, old, advantages, 0.2)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        ratio = torch.exp(logp - old)
        if torch.allclose(got, -ratio * advantages, atol=1e-5):
            raise WrongAnswer("nothing is clipped: take the min of rho A and clip(rho, 1 - eps, 1 + eps) A")
        clipped = torch.clamp(ratio, 0.8, 1.2) * advantages
        if torch.allclose(got, -torch.maximum(ratio * advantages, clipped), atol=1e-5):
            raise WrongAnswer("max instead of min: the loss is -min(rho A, clip(rho) A), the pessimistic side")
        if torch.allclose(got, -clipped, atol=1e-5):
            raise WrongAnswer("always the clipped side: take the min of it and the unclipped rho A")
        if torch.allclose(got, torch.minimum(ratio * advantages, clipped), atol=1e-5):
            raise WrongAnswer("the sign: the loss is minus the surrogate (minimising it raises rho A)")
    compare("my_clipped_loss(logp, old, A, 0.2)", got, want)
    correct("-min(rho A, clip(rho, 1 - eps, 1 + eps) A): zero gradient once the ratio is past the clip")


@exercise
def check_gae(my_gae) -> None:
    """my_gae(rewards (3,), values (3,), gamma, lam) -> the advantages (3,) of one 3-token answer."""
    rewards, values = torch.tensor([-0.02, 0.02, 0.95]), torch.tensor([0.4, 0.7, 0.9])
    gamma, lam = 0.9, 0.8
    got = as_tensor(my_gae(rewards, values, gamma, lam), f"my_gae(rewards, values, {gamma}, {lam})")
    want = gae(rewards[None], values[None], torch.ones(1, 3, dtype=torch.bool), gamma, lam)[0][0]
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        following = torch.cat([values[1:], values[-1:]])  # V after the last token taken as V(s_T), not 0
        delta = rewards + gamma * torch.cat([values[1:], torch.zeros(1)]) - values
        if torch.allclose(got, _discounted(rewards + gamma * following - values, gamma * lam), atol=1e-5):
            raise WrongAnswer("the value after the last token is 0: the episode ends there")
        if torch.allclose(got, delta, atol=1e-5):
            raise WrongAnswer("one TD error per token (lambda = 0): sum the later ones too, decayed by gamma lambda")
        if torch.allclose(got, _discounted(delta, gamma), atol=1e-5):
            raise WrongAnswer("decayed by gamma alone: the later TD errors weigh (gamma lambda)^l")
        if torch.allclose(got, _discounted(rewards, gamma) - values, atol=1e-5):
            raise WrongAnswer("that is lambda = 1 (the return minus V): decay the TD errors by gamma lambda")
    compare(f"my_gae(rewards, values, {gamma}, {lam})", got, want)
    correct("A_t = delta_t + gamma lambda A_(t+1), from the end, with V = 0 after the last token")


def _discounted(x: torch.Tensor, decay: float) -> torch.Tensor:
    """sum over l >= 0 of decay^l x_(t+l), for each t."""
    out, running = torch.zeros_like(x), torch.zeros(())
    for t in reversed(range(len(x))):
        running = x[t] + decay * running
        out[t] = running
    return out
