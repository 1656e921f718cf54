"""A reward model: a GPT whose head gives one number per sequence, how good the answer it ends with is
(the sequence classifier RLHF trains on human preferences, Ouyang et al. 2022).

Legend: B batch, T time, C width.

It is a GPT (so a language model's weights load into it, all but the new `reward_head`) and reads a
whole conversation. Two heads (RewardConfig.head):

    mean    r = mean over the answer's tokens t of  w . [h_t, log p(x_t | x_<t)] + b
    answer  r = sum over the answer's tokens t of  w . [h_t, log p(x_t | x_<t)] + b
    last    r = w . h_T + b                        (h_T: the last token's hidden state)

`last` is the classic sequence classifier: one position must notice everything, and a near miss of one
character is one token among ~85 that it has to single out. `answer` scores every token of the answer
and gives the head the language model's own evidence, the log-probability of each answer token: with
w's log-probability weight starting at 1 (the rest at 0) the untrained model ranks answers as the
policy it came from does (98.5% of the chat demo's held-out pairs), and training moves on from there.

`mean` is `answer` without its length term. Preference pairs compare two answers of about the same
length, so whatever a per-token term adds to every token (the bias b, or a direction every h_t
shares) cancels in training and is left where it drifted: summed, it rewards or punishes length, and
PPO against such a head cut "nine three" to "nine thre" (score -19.2 -> -15.2) while exact answers fell.
Averaged, a per-token constant is one constant for every answer; a truncated answer still pays for
its improbable end of turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import option
from attnlab.models.gpt import GPT, GPTConfig

HEADS = ("mean", "answer", "last")
PER_TOKEN = ("mean", "answer")  # the heads that read every answer token


@dataclass
class RewardConfig(GPTConfig):
    # "last" by default: a run written before the answer head existed has no `head` in its config.json
    head: str = option(
        "last",
        "what the score reads: the answer's tokens with their log-probabilities "
        "(answer: summed; mean: averaged) or the last token alone (last)",
        HEADS,
    )

    def __post_init__(self):
        super().__post_init__()
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")


class RewardModel(GPT):
    def __init__(self, cfg: RewardConfig):
        super().__init__(cfg)
        per_token = cfg.head in PER_TOKEN
        self.reward_head = nn.Linear(cfg.d_model + per_token, 1)  # one more input, the log-probability
        nn.init.zeros_(self.reward_head.weight)  # every answer starts at the same score ...
        nn.init.zeros_(self.reward_head.bias)
        if per_token:  # ... but for the policy's own: its tokens' log-probabilities (summed or averaged)
            nn.init.ones_(self.reward_head.weight[:, -1].data)

    def score(self, idx: Tensor, last: Tensor | None = None, answer: Tensor | None = None) -> Tensor:
        """idx (B, T) -> one score per row (B,). last (B,): each row's last position (None: the final
        one), read by the last-token head; answer (B, T) bool: the answer's tokens, read by the answer
        head (None: every token but the first). Padding after a row is never seen by its score (causal
        attention), nor, when left out of `answer`, read."""
        x, _ = self.hidden(idx)  # (B, T, C)
        if self.cfg.head in PER_TOKEN:
            if answer is None:
                answer = torch.ones_like(idx, dtype=torch.bool)
            return self._answer_score(idx, x, answer)
        if last is None:
            last = torch.full((idx.shape[0],), idx.shape[1] - 1, device=idx.device)
        h = x[torch.arange(idx.shape[0], device=idx.device), last]  # (B, C)
        return self.reward_head(h).squeeze(-1).float()  # (B,)

    def _answer_score(self, idx: Tensor, x: Tensor, answer: Tensor) -> Tensor:
        # log p(x_t | x_<t) for t >= 1, read from the logits at t - 1; float32: sums of small numbers
        logp = F.log_softmax(self.logits(x[:, :-1]).float(), dim=-1)  # (B, T-1, V)
        picked = logp.gather(-1, idx[:, 1:, None])  # (B, T-1, 1)
        picked = F.pad(picked, (0, 0, 1, 0))  # (B, T, 1): position 0 has no prediction (0: its hidden state alone)
        per_token = self.reward_head(torch.cat([x.float(), picked], dim=-1)).squeeze(-1)  # (B, T)
        total = (per_token * answer).sum(-1)  # (B,)
        return total / answer.sum(-1).clamp(min=1) if self.cfg.head == "mean" else total
