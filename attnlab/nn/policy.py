"""Policy-gradient losses over sampled answers: GRPO and its cousins Dr. GRPO and DAPO.

Legend: B answers in a batch (N prompts x G answers each, a prompt's G answers side by side), T the
longest answer's tokens; a mask (B, T) marks each answer's real tokens (the rest is padding).

GRPO (Shao et al. 2024, "DeepSeekMath") samples a group of G answers to each prompt and scores
each with a reward r. The group is its own baseline: the advantage of answer i is

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)     (std scaling optional; std as torch's, n - 1)

and every token of the answer shares it. With ratio_t = pi(o_t) / pi_old(o_t), the probability of the
token under the policy being trained over the one the rollout drew it from, each token's loss is
PPO's clipped surrogate, plus beta times the k3 estimate of KL(pi || ref) (Schulman's unbiased,
always >= 0 estimator: ref/pi - log(ref/pi) - 1):

    l_t = -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A) + beta k3_t

The variants differ in how the token losses of a batch become one number:
    grpo     mean over each answer's tokens, then mean over the answers (a long answer's tokens
             weigh less: the length bias "Understanding R1-Zero-Like Training" points out)
    dr_grpo  sum over every token divided by a constant (B x max_tokens), and no std scaling
             (Liu et al. 2025: both biases removed)
    dapo     sum over every token of the batch divided by the batch's tokens (Yu et al. 2025, DAPO's
             token-level loss; it also decouples the clip range: eps_high 0.28 above eps_low 0.2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.errors import AttnlabError


def group_advantages(rewards: Tensor, group: int, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Each answer's advantage within its group: rewards (N * G,), a prompt's G answers side by side
    -> (N * G,). A group whose rewards are all equal has advantage 0 (it teaches nothing)."""
    if group < 2:
        raise AttnlabError(f"a group needs at least 2 answers per prompt to compare them (got G={group})")
    if rewards.numel() % group:
        raise AttnlabError(f"{rewards.numel()} rewards do not make groups of {group}")
    r = rewards.float().view(-1, group)  # (N, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


@dataclass(frozen=True)
class PolicyLoss:
    """How token losses are clipped, regularised and aggregated (see the module's docstring)."""

    kind: str = "grpo"
    eps_low: float = 0.2
    eps_high: float | None = None  # None: eps_low (dapo's paper used 0.28)
    beta: float = 0.0  # weight of the KL to the reference; 0: no reference needed
    max_tokens: int | None = None  # dr_grpo's constant; None: the batch's width T

    def __post_init__(self):
        if self.kind not in AGGREGATES:
            raise AttnlabError(f"unknown policy loss {self.kind!r}: choose one of {', '.join(AGGREGATES)}")

    @property
    def scale(self) -> bool:
        """Whether advantages are divided by the group's std (Dr. GRPO drops it)."""
        return AGGREGATES[self.kind].scale

    @property
    def high(self) -> float:
        return self.eps_low if self.eps_high is None else self.eps_high


@dataclass
class PolicyResult:
    loss: Tensor  # () what the optimizer minimises
    clip_frac: float  # share of the answers' tokens whose clipped side is taken (zero gradient there)
    kl: float  # mean k3 estimate of KL(pi || ref) per token (0 without a reference)


def policy_loss(
    logp: Tensor, old: Tensor, advantages: Tensor, mask: Tensor, cfg: PolicyLoss, ref: Tensor | None = None
) -> PolicyResult:
    """The loss of a batch of answers: logp (B, T) the policy's log-probabilities of the answers' tokens
    (with gradient), old (B, T) the rollout's, advantages (B,) or per token (B, T: PPO's), mask (B, T)
    the real tokens, ref (B, T) the reference's (needed when cfg.beta > 0)."""
    mask = mask.float()
    ratio = torch.exp(logp - old)  # (B, T)
    # (B, 1): every token of an answer shares its advantage; or PPO's own per token (B, T)
    a = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logp.dtype)
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.high)
    token = -torch.minimum(ratio * a, clipped * a)  # (B, T)
    kl = torch.zeros_like(logp)
    if cfg.beta > 0:
        if ref is None:
            raise AttnlabError("a KL term (beta > 0) needs the reference model's log-probabilities")
        d = ref - logp
        kl = torch.exp(d) - d - 1  # k3: >= 0, unbiased for KL(pi || ref) under pi's samples
        token = token + cfg.beta * kl
    # where the clipped side is the smaller one, the ratio has left the range in the direction that the
    # advantage pushes it: the gradient of that token is zero
    cut = ((ratio > 1 + cfg.high) & (a > 0)) | ((ratio < 1 - cfg.eps_low) & (a < 0))
    tokens = mask.sum().clamp(min=1)
    return PolicyResult(
        aggregate(token, mask, cfg), float((cut * mask).sum() / tokens), float((kl.detach() * mask).sum() / tokens)
    )


def aggregate(token: Tensor, mask: Tensor, cfg: PolicyLoss) -> Tensor:
    """One number from the token losses (B, T) of the real tokens (mask), as cfg.kind says."""
    return AGGREGATES[cfg.kind].reduce(token * mask, mask, cfg)


def _per_answer(total: Tensor, mask: Tensor, cfg: PolicyLoss) -> Tensor:
    return (total.sum(1) / mask.sum(1).clamp(min=1)).mean()


def _over_a_constant(total: Tensor, mask: Tensor, cfg: PolicyLoss) -> Tensor:
    return total.sum() / (total.shape[0] * (cfg.max_tokens or total.shape[1]))


def _per_token(total: Tensor, mask: Tensor, cfg: PolicyLoss) -> Tensor:
    return total.sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class Aggregation:
    reduce: Callable[[Tensor, Tensor, PolicyLoss], Tensor]  # (token losses x mask, mask, cfg) -> ()
    scale: bool  # advantages divided by the group's std


# The loss variants by name (see the module's docstring).
AGGREGATES = {
    "grpo": Aggregation(_per_answer, True),
    "dr_grpo": Aggregation(_over_a_constant, False),
    "dapo": Aggregation(_per_token, True),
}
LOSSES = tuple(AGGREGATES)
