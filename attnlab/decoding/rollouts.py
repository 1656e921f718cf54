"""Rollouts for reinforcement learning: G sampled answers to each prompt, drawn together by the one
decoding engine (engine.py), each token with its log-probability under the distribution it was
drawn from; and the same log-probabilities recomputed by the policy in one teacher-forced forward.

Legend: N prompts, G answers per prompt, B = N * G rows, A the longest answer, L prompt + answer
padded, V vocabulary.

    r = rollouts(model, [tok.encode(p) for p in prompts], group=4, max_new_tokens=32, stops=[end])
    b = r.batch(device)                           # ids (B, L), the answers' places, old (B, A), mask (B, A)
    logp = answer_token_logprobs(model, b)        # (B, A), with gradient: equal to b.old before a step

The rows are submitted to the model's engine in float32 and read in turn, so they share its
batched, cached steps. They are drawn at temperature 1 with no top-k or top-p: there the engine's
log-probability of a token (the log-softmax of the logits it drew from, Step.logprob) is that of
the distribution it was drawn from, and the policy's recomputed one equals it (within 1e-5 in
float32, tests/test_grpo_rollouts.py: the batched step's logits differ from a whole forward's by
about 1e-6). A temperature or a filter would draw from another distribution than Step.logprob
describes, and the ratio pi / pi_old would be off by that difference from the first step: they
are refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import engine_for
from attnlab.decoding.rows import Step
from attnlab.decoding.sampling import read_in_turn
from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM

MAX_BATCH = 64  # rows the engine decodes in one pass (more wait for a free slot)


@dataclass
class RolloutBatch:
    ids: Tensor  # (B, L) each row's prompt and answer, padded with 0 at the right
    places: Tensor  # (B, A) where answer token j of a row sits in ids (0 where padding)
    old: Tensor  # (B, A) the rollout's log-probabilities of the answer tokens (0 where padding)
    mask: Tensor  # (B, A) bool: a real answer token


@dataclass
class Rollouts:
    """B = N * G rows, a prompt's G answers side by side."""

    prompts: list[list[int]]
    answers: list[list[int]]  # each row's drawn tokens, its stop sequence included when it stopped
    logprobs: list[list[float]]  # each token's log-probability under the distribution it was drawn from
    stopped: list[bool]  # ended by a stop (else by max_new_tokens)

    def batch(self, device: torch.device | str = "cpu") -> RolloutBatch:
        """The rows as tensors for a teacher-forced forward (answer_token_logprobs) and the loss."""
        b = len(self.answers)
        width = max((len(p) + len(a) for p, a in zip(self.prompts, self.answers)), default=1)
        longest = max((len(a) for a in self.answers), default=0) or 1
        ids = torch.zeros(b, width, dtype=torch.long)
        places = torch.zeros(b, longest, dtype=torch.long)
        old = torch.zeros(b, longest)
        for i, (p, a, lp) in enumerate(zip(self.prompts, self.answers, self.logprobs)):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            places[i, : len(a)] = torch.arange(len(p), len(p) + len(a))
            old[i, : len(a)] = torch.tensor(lp, dtype=torch.float32)
        mask = torch.arange(longest)[None] < torch.tensor([len(a) for a in self.answers])[:, None]
        return RolloutBatch(ids.to(device), places.to(device), old.to(device), mask.to(device))


def rollouts(
    model: CausalLM,
    prompts: Sequence[list[int]],
    group: int,
    max_new_tokens: int,
    seed: int = 0,
    stops: Sequence[list[int]] = (),
    draw: Draw | None = None,
) -> Rollouts:
    """`group` answers to each prompt (ids), sampled as one batch; row k draws with seed + k. A row ends
    after max_new_tokens or when its tokens end with one of `stops` (kept: the policy learns to stop).
    draw: temperature 1 without top-k/top-p (the default), the one distribution rollouts draw from."""
    draw = draw or Draw(temperature=1.0)
    if draw.temperature != 1.0 or draw.top_k is not None or draw.top_p is not None:
        raise AttnlabError(
            "rollouts draw at temperature 1 without top-k/top-p, so that their log-probabilities "
            "are the policy's own (see decoding/rollouts.py)"
        )
    rows = [list(p) for p in prompts for _ in range(group)]
    longest = max((len(p) for p in rows), default=0)
    if longest + max_new_tokens > model.cfg.context:
        raise AttnlabError(
            f"a prompt of {longest} tokens and {max_new_tokens} new ones do not fit the model's "
            f"context of {model.cfg.context}: give fewer new tokens"
        )
    stops = [list(s) for s in stops if s]
    training = model.training
    model.eval()  # no dropout while sampling: the draws are from the policy itself
    try:
        engine = engine_for(model, "float32", max_batch=min(max(len(rows), 1), MAX_BATCH))
        streams = [
            _until_stop(engine.generate(p, Draw(1.0, seed=seed + k), max_new_tokens, logprobs=0), stops)
            for k, p in enumerate(rows)
        ]
        steps = read_in_turn(streams)
    finally:
        model.train(training)
    answers = [[step.token for step in row] for row in steps]
    stopped = [any(a[-len(stop) :] == stop for stop in stops) for a in answers]
    return Rollouts(rows, answers, [[step.logprob for step in row] for row in steps], stopped)


def _until_stop(stream: Iterator[Step], stops: list[list[int]]) -> Iterator[Step]:
    """The stream's steps until its tokens end with one of `stops` (that step included); the stream is
    closed before that last step is handed on, which cancels the row in the engine at once."""
    tokens: list[int] = []
    for step in stream:
        tokens.append(step.token)
        if any(tokens[-len(stop) :] == stop for stop in stops):
            stream.close()
            yield step
            return
        yield step


def answer_token_logprobs(model: CausalLM, batch: RolloutBatch) -> Tensor:
    """The model's log-probability of each answer token (B, A), from one teacher-forced forward over the
    prompts and answers (with gradient when enabled; 0 where padding)."""
    logits = model(batch.ids[:, :-1])  # (B, L - 1, V): position t predicts token t + 1
    logp = F.log_softmax(logits.float(), dim=-1)  # float32: the ratio exp(logp - old) needs it
    picked = logp.gather(-1, batch.ids[:, 1:, None])[..., 0]  # (B, L - 1)
    at = (batch.places - 1).clamp(min=0)  # the position that predicts each answer token
    return picked.gather(1, at) * batch.mask
