"""Worked answers to lesson 10's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch


def group_advantages(rewards, group):
    r = rewards.float().view(-1, group)  # (N, G): one row per prompt
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-6)).view(-1)


def batch_advantages(rewards, group):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-6)  # the whole batch as one group


def clipped_loss(logp, old, advantages, eps):
    ratio = torch.exp(logp - old)
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)


def unclipped_loss(logp, old, advantages, eps):
    return -torch.exp(logp - old) * advantages


def gae(rewards, values, gamma, lam):
    advantages, running = torch.zeros_like(values), 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0  # the episode ends after the last token
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def gae_without_lambda(rewards, values, gamma, lam):
    return gae(rewards, values, gamma, 1.0)  # the TD errors decayed by gamma alone


ANSWERS = {
    "rlhf.check_group_advantages": (group_advantages, batch_advantages, "per group"),
    "rlhf.check_clipped_loss": (clipped_loss, unclipped_loss, "clipped"),
    "rlhf.check_gae": (gae, gae_without_lambda, "gamma lambda"),
}
