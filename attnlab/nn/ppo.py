"""PPO's pieces beside the clipped policy surrogate (nn/policy.py): rewards shaped by the KL to the
reference, generalised advantage estimation and the clipped value loss (InstructGPT's RL step).

Legend: B answers, T the longest answer's tokens; a mask (B, T) marks each answer's real tokens,
left-aligned (an answer's tokens come first, then padding).

An answer is an episode: state s_t is the prompt and the answer's first t tokens, action a_t its
token t. The reward model scores the whole answer once, so the reward of a token is the KL penalty
alone, and the last real token also gets the score (Ziegler et al. 2019; Ouyang et al. 2022):

    r_t = -beta (log pi(a_t | s_t) - log ref(a_t | s_t))  +  [t is the last token] score

A value V(s_t) estimates what is still to come; with V after the last token 0 (the episode ends),

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma lam A_{t+1}          (GAE, Schulman et al. 2016; A after the end: 0)
    R_t     = A_t + V(s_t)                          (the value's target)

The value loss is clipped like the policy's ratio, around the value the rollout measured:

    V_clip  = V_old + clip(V - V_old, -eps, eps)
    L_V     = 1/2 mean_t max((V - R)^2, (V_clip - R)^2)     over the real tokens
"""

from __future__ import annotations

import torch
from torch import Tensor


def kl_shaped_rewards(scores: Tensor, logp: Tensor, ref: Tensor, mask: Tensor, beta: float) -> Tensor:
    """Each token's reward (B, T): -beta (logp - ref) on every real token, the reward model's score
    (B,) added at each answer's last real token; 0 where mask is False."""
    m = mask.float()
    rewards = -beta * (logp - ref) * m  # (B, T)
    last = (mask.sum(1) - 1).clamp(min=0)  # (B,) each answer's last real token
    has = mask.any(1).float()  # an empty answer gets no score (there is no token to give it to)
    rewards[torch.arange(len(last)), last] += scores.to(rewards.dtype) * has
    return rewards


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimates and returns, each (B, T), from rewards and values (B, T) of
    the real tokens (mask, left-aligned); the value after an answer's last token is 0 (the module's
    docstring). 0 where mask is False."""
    m = mask.to(values.dtype)
    b, t = rewards.shape
    advantages = torch.zeros_like(values)
    running = values.new_zeros(b)  # A_{t+1}: 0 past the last column
    for i in reversed(range(t)):
        after = m[:, i + 1] if i + 1 < t else values.new_zeros(b)  # 0 where the answer has ended
        following = values[:, i + 1] * after if i + 1 < t else values.new_zeros(b)  # V(s_{t+1})
        delta = rewards[:, i] + gamma * following - values[:, i]
        running = (delta + gamma * lam * after * running) * m[:, i]
        advantages[:, i] = running
    return advantages, (advantages + values) * m


def value_loss(values: Tensor, old: Tensor, returns: Tensor, mask: Tensor, eps: float) -> tuple[Tensor, float]:
    """PPO's clipped value loss over the real tokens (the module's docstring): values (B, T) with
    gradient, old (B, T) the rollout's, returns (B, T) the targets. Also the share of real tokens
    whose clipped side is taken (its gradient is zero)."""
    m = mask.float()
    clipped = old + torch.clamp(values - old, -eps, eps)
    plain_err, clipped_err = (values - returns) ** 2, (clipped - returns) ** 2
    token = 0.5 * torch.maximum(plain_err, clipped_err)
    tokens = m.sum().clamp(min=1)
    cut = float(((clipped_err > plain_err).float() * m).sum() / tokens)
    return (token * m).sum() / tokens, cut


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """x (B, T) shifted and scaled to mean 0, std 1 over the real tokens (0 elsewhere): the scale of
    the reward model's scores then does not set the size of the policy's step."""
    real = x[mask]
    if real.numel() < 2:
        return x * mask
    return (x - real.mean()) / (real.std() + eps) * mask
