"""A reward model: a GPT whose head gives one number per sequence, how good the answer it ends with is
(the sequence classifier RLHF trains on human preferences, Ouyang et al. 2022).

Legend: B batch, T time, C width.

It is a GPT (so a language model's weights load into it, all but the new `reward_head`) and reads a
whole conversation; the score of a sequence is the head applied to the final hidden state of its last
token, the one position that has seen every token (causal attention).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.gpt import GPT, GPTConfig


class RewardModel(GPT):
    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.reward_head = nn.Linear(cfg.d_model, 1)
        nn.init.zeros_(self.reward_head.weight)  # every answer starts at the same score
        nn.init.zeros_(self.reward_head.bias)

    def score(self, idx: Tensor, last: Tensor | None = None) -> Tensor:
        """idx (B, T) -> one score per row (B,), read at position `last` (B,) of each row (padding after
        it is never seen by it); None: the final position."""
        x, _ = self.hidden(idx)  # (B, T, C)
        if last is None:
            last = torch.full((idx.shape[0],), idx.shape[1] - 1, device=idx.device)
        h = x[torch.arange(idx.shape[0], device=idx.device), last]  # (B, C)
        return self.reward_head(h).squeeze(-1).float()  # (B,)
