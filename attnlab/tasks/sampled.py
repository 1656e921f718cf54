"""What the RL tasks (grpo, ppo) share: they train on answers they sample to prompts of the data.

A Prompt is a conversation up to its answer's start (ids, as the run's template renders it) and what
was asked (tasks/rewards.Asked: the messages and the stored answer the rewards read). Prompts is the
training "data": a batch is which prompts and the seed of their rollouts. SampledAnswers is the
tasks' common base: the prompts that leave room for an answer, the ids that end one, the text of an
answer, and the refusal of options that show or split examples they do not have. Both tasks may take
several updates from one rollout; HeldRollout keeps it in the run's folder so that a run resumed
between them goes on with the same answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.data.batches import rank_slice
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.rollouts import RolloutBatch, Rollouts, rollouts
from attnlab.engine.resume import saved_progress
from attnlab.engine.train import TrainRequest
from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors, write_safetensors
from attnlab.nn.objective import Objective
from attnlab.runs.marker import record
from attnlab.tasks.adapt import Adapting
from attnlab.tasks.rewards import Asked


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the conversation up to the answer's start, as the template renders it
    asked: Asked  # its messages and stored answer, as the rewards read them


@dataclass
class Drawn:
    """A rollout's answers as the rewards read them: N prompts x G answers, a prompt's side by side."""

    rollout: Rollouts
    asked: list[Asked]  # each answer's prompt (N * G)
    texts: list[str]  # each answer's text, without its end of turn
    seconds: float  # spent sampling

    @property
    def right(self) -> list[bool]:
        """Whether each answer is right (the checker's verdict, or equality with the stored answer)."""
        return [q.right(t) for q, t in zip(self.asked, self.texts, strict=True)]


def draw(
    model: nn.Module, chosen: list[Prompt], group: int, max_new: int, seed: int, chat: tuple[Tokenizer, list]
) -> Drawn:
    """`group` answers to each chosen prompt, sampled together on the one decoding engine
    (decoding/rollouts.py); chat: the tokenizer and the stop ids."""
    tok, stops = chat
    t0 = time.perf_counter()
    r = rollouts(model, [p.ids for p in chosen], group, max_new, seed, stops)
    seconds = time.perf_counter() - t0
    asked = [p.asked for p in chosen for _ in range(group)]
    return Drawn(r, asked, [answer_text(tok, stops, a) for a in r.answers], seconds)


class Prompts:
    """The training prompts; a batch is which prompts (n,) and the seed of their rollouts (1,)."""

    def __init__(self, prompts: list[Prompt], group: int, max_new_tokens: int):
        self.prompts = prompts
        mean = round(float(np.mean([len(p.ids) for p in prompts])))
        self.per_example = (group * (mean + max_new_tokens), "tokens")  # at most, for the memory check

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, ...]:
        rows = rank_slice(rng.integers(len(self.prompts), size=n), part)
        seed = int(rng.integers(2**62))  # from the run's generator: a resumed run samples the same
        return torch.from_numpy(rows), torch.tensor([seed + part[0]])

    def has(self, split: str) -> bool:
        return split == "train"  # no validation loss: the held-out score is exact answers

    def describe(self) -> str:
        return f"{len(self.prompts):,} prompts"


class Frozen:
    """The reference model, out of the policy's parameters (not trained, not saved)."""

    def __init__(self, model: nn.Module):
        self.model = model.eval().requires_grad_(False)


class Sampling(Objective):
    """What grpo's and ppo's objectives share: the policy samples answers to the prompts (chat: the
    tokenizer and the ids that end an answer), the rollout between its updates is kept in the run
    (`kept`), and a frozen reference, where the objective has one, is scored against."""

    def __init__(
        self, model: nn.Module, prompts: list[Prompt], chat: tuple, kept: HeldRollout, reference: nn.Module | None
    ):
        super().__init__(model)
        self.prompts, (self.tok, self.stops), self.kept = prompts, chat, kept
        self.reference = None if reference is None else Frozen(reference)

    def sample(self, rows: Tensor, group: int, max_new: int, seed: int) -> Drawn:
        """`group` answers to each prompt of the batch (`rows`: which prompts)."""
        return draw(self.model, [self.prompts[i] for i in rows.tolist()], group, max_new, seed, (self.tok, self.stops))


class HeldRollout:
    """The rollout the next updates learn from, in the run's folder (tensors, and notes as JSON), saved
    when it is sampled: a run resumed before its last update reads it instead of sampling anew. It
    counts the steps from where the run starts (a resumed run's checkpoint), so that each step knows
    its place in its rollout's cycle of updates."""

    def __init__(self, path: Path, step: int = 0):
        self.path, self.step = path, step

    def advance(self, cycle: int) -> tuple[int, int]:
        """This step and its place among its rollout's `cycle` updates (0: sample anew); once a step."""
        step, self.step = self.step, self.step + 1
        return step, step % cycle

    def save(self, step: int, batch: RolloutBatch, more: dict[str, Tensor], notes: dict[str, Any]) -> None:
        """The rollout sampled at `step`: its batch, the task's tensors of it (advantages, ...) and notes."""
        tensors = {**{f.name: getattr(batch, f.name) for f in fields(RolloutBatch)}, **more}
        meta = {"step": str(step), "notes": json.dumps(notes)}
        write_safetensors(self.path, {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, meta)

    def read(self, step: int, device: torch.device) -> tuple[RolloutBatch, dict[str, Tensor], dict[str, Any]]:
        """The batch, the task's tensors (on device) and notes of the rollout sampled at `step`."""
        if not self.path.is_file():
            raise AttnlabError(f"{self.path} is missing: this run cannot go on mid-rollout; train it again")
        t, meta = read_safetensors(self.path)
        if int(meta["step"]) != step:
            raise AttnlabError(f"{self.path} holds the rollout of step {meta['step']}, not {step}: train the run again")
        t = {k: v.to(device) for k, v in t.items()}
        batch = RolloutBatch(**{f.name: t.pop(f.name) for f in fields(RolloutBatch)})
        return batch, t, json.loads(meta["notes"])


@contextmanager
def as_rolled(model: nn.Module, device: torch.device) -> Iterator[None]:
    """The model in float32 and without dropout (autocast off: the training loop's may be bf16), so
    that a teacher-forced forward's log-probabilities are the ones its rollout sampled from."""
    training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, enabled=False):
            yield
    finally:
        model.train(training)


def stop_ids(tok: Tokenizer, template: ChatTemplate) -> list[list[int]]:
    """The id sequences that end an answer: the template's end of turn, and the tokenizer's own."""
    return [tok.encode(template.end_of_turn())] + ([[tok.eot_id]] if tok.eot_id is not None else [])


def answer_text(tok: Tokenizer, stops: list[list[int]], answer: list[int]) -> str:
    """An answer's text, without its end of turn."""
    for stop in stops:
        if answer[-len(stop) :] == stop:
            answer = answer[: -len(stop)]
            break
    return tok.decode(answer).strip()


class SampledAnswers(Adapting):
    """The base of the tasks that train on answers they sample (grpo, ppo)."""

    unit = "conversation"
    builtin = "instructions"

    def check_settings(self, req: TrainRequest) -> None:
        """A new run's settings checked, so that a wrong one is one line before its folder is made."""

    def setup(self, req: TrainRequest) -> dict[str, str]:
        if not req.resume:
            self.check_settings(req)
        if req.options.show_masks:
            raise AttnlabError(
                f"--show-masks shows sft's and dpo's examples: {self.name} trains on the answers it samples"
            )
        return super().setup(req)

    def held_rollout(self, req: TrainRequest, main: bool) -> HeldRollout:
        """Where the run keeps the rollout being learned from (--force removes it with the run), from
        the step its checkpoint is at when resumed (unreadable: loading the checkpoint says why)."""
        out = Path(req.out)
        path = out / f"{self.name}_rollout.safetensors"
        if main:
            record(out, path.name)
        return HeldRollout(path, (saved_progress(out) or (0,))[0] if req.resume else 0)

    def encode_row(self, row: Conversation, tok: Tokenizer, template: ChatTemplate, data: Any) -> Prompt:
        asked = Asked(tuple(row.messages[:-1]), row.messages[-1].content.strip())
        return Prompt(tok.encode(template.prompt(asked.messages)), asked)

    def prompts(
        self,
        rows: list[Conversation],
        tok: Tokenizer,
        template: ChatTemplate,
        req: TrainRequest,
        context: int,
        max_new_tokens: int,
    ) -> list[Prompt]:
        """The rows as prompts, those that leave room for max_new_tokens in the model's context."""
        room = context - max_new_tokens
        prompts = [p for p in (self.encode_row(c, tok, template, req.data) for c in rows) if len(p.ids) <= room]
        if not prompts:
            raise AttnlabError(
                f"no prompt leaves room for {max_new_tokens} new tokens in the model's context of "
                f"{context}: lower --max-new-tokens"
            )
        return prompts
