"""grpo: reinforcement learning of a fine-tuned GPT against a verifiable reward (GRPO, Dr. GRPO, DAPO).

attnlab train grpo --init runs/sft --out runs/grpo [--group 8 --loss grpo --beta 0 --reward exact]
attnlab train grpo --init runs/sft_add --data add --level 2 --epochs 4 --out runs/grpo_add
attnlab train grpo --init runs/sft --reward runs/rm --out runs/grpo_rm
attnlab.train("runs/grpo_f", init="runs/sft", task="grpo", reward=lambda question, answer: ...)

Each step draws --batch-size prompts of the data (the built-in instructions, a verifiable task or a
file's conversations), samples --group answers to each on the one decoding engine
(decoding/rollouts.py: float32, temperature 1), scores them (tasks/rewards.py: --reward exact, 1
for a right answer by the task's checker or the stored answer; random, a coin, the control run that
says how much of a gain is the reward's; a reward run's scores; or a Python callable's), and takes
--epochs gradient steps on the policy loss (nn/policy.py) with the group's advantages (the paper's
mu, "GRPO iterations"). The first step is on the rollouts' own policy, so its ratio is 1 and nothing
is clipped; the later ones are off it by the steps taken, and the clip holds them near it. Sampling
is most of a step's time on a CPU, so --epochs 4 takes four updates for about the price of one
(the rollout is kept in grpo_rollout.safetensors: a run resumed between them goes on). The loss's
forward runs in float32 whatever --dtype says, so that the policy's log-probabilities equal the
rollout's. metrics.jsonl holds, per step: reward, exact (the share of right answers, whatever the
reward), kl (to the --init model, with --beta > 0), answer_length (tokens), clip_frac and
generate_s (the seconds spent sampling: 0 on a step that reuses its rollout). At the end eval.json
holds the held-out exact answers, as sft's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import option
from attnlab.data.finetune import ChatData, splits, test_split
from attnlab.data.tokenizers import load_tokenizer
from attnlab.decoding.rollouts import RolloutBatch, answer_token_logprobs
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.nn.objective import inner
from attnlab.nn.policy import LOSSES, PolicyLoss, group_advantages, policy_loss
from attnlab.runs.adapted import run_template
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import TUNED, AdaptOptions
from attnlab.tasks.rewards import CALLABLE, Reward, as_kept, reward_source
from attnlab.tasks.sampled import HeldRollout, Prompt, Prompts, SampledAnswers, Sampling, as_rolled, stop_ids
from attnlab.tasks.sft import EXACT

SETTINGS = ("group", "loss", "beta", "reward", "max_new_tokens", "clip", "clip_high", "epochs")  # config.json's task
# An RL step moves a tuned model: a far smaller learning rate than sft's, few prompts a step (each G answers).
GRPO_TRAIN = dict(TUNED, lr=2e-5, batch_size=8, max_steps=100, warmup_steps=5, eval_interval=50, eval_batches=1)


@dataclass
class GRPOOptions(AdaptOptions):
    group: int = option(8, "answers sampled per prompt (G, at least 2): the group is each answer's baseline")
    loss: str = option(
        "grpo",
        "how token losses add up: grpo (mean per answer, then over answers), dr_grpo (sum "
        "/ (answers x max-new-tokens), no std scaling) or dapo (sum / all tokens)",
        LOSSES,
    )
    beta: float = option(0.0, "weight of the KL to the --init model (k3 estimator); 0: none, no reference kept")
    reward: str = option(
        "exact",
        "exact: 1 for a right answer (a verifiable task's checker says so, or it is "
        "the stored one), else 0; random: a fair coin (the control run); or a reward run's "
        "folder (attnlab train reward): its score. The Python API also takes a function "
        "f(question, answer) -> float",
        metavar="exact|random|RUN",
    )
    max_new_tokens: int = option(48, "the longest answer sampled, in tokens", at_least=1)
    clip: float = option(0.2, "the ratio's clip range below 1 (and above, unless --clip-high)")
    clip_high: float | None = option(None, "the clip range above 1 (DAPO's decoupled clip: 0.28)")
    epochs: int = option(
        1,
        "updates taken from each rollout before the next is sampled (GRPO's mu): each a "
        "training step, so --max-steps counts updates",
        at_least=1,
    )


@dataclass
class Held:
    """A scored rollout as its updates read it."""

    batch: RolloutBatch
    advantages: Tensor  # (B,) each answer's, from its group
    ref: Tensor | None  # (B, A) the reference's log-probabilities, with --beta > 0
    rewards: Tensor  # (B,)
    logged: dict[str, float]  # the rollout's metrics

    def save(self, held: HeldRollout, step: int) -> None:
        more = {} if self.ref is None else {"ref": self.ref}
        held.save(step, self.batch, {"advantages": self.advantages, "rewards": self.rewards, **more}, self.logged)

    @staticmethod
    def read(held: HeldRollout, step: int, device: torch.device) -> Held:
        batch, t, logged = held.read(step, device)
        return Held(batch, t["advantages"], t.get("ref"), t["rewards"], logged)


class GRPOObjective(Sampling):
    """Rollouts, rewards and group advantages every --epochs steps; each step one policy-loss update."""

    def __init__(
        self,
        model: nn.Module,
        prompts: list[Prompt],
        opts: dict[str, Any],
        chat: tuple,
        reward: Reward,
        reference: nn.Module | None,
        kept: HeldRollout,
    ):
        super().__init__(model, prompts, chat, kept, reference)
        self.reward, self.held = reward, None
        self.group, self.max_new, self.epochs = opts["group"], opts["max_new_tokens"], opts["epochs"]
        self.loss = PolicyLoss(opts["loss"], opts["clip"], opts["clip_high"], opts["beta"], self.max_new)

    def forward(self, rows: Tensor, seed: Tensor) -> tuple[Tensor, Tensor]:
        step, into = self.kept.advance(self.epochs)  # one call per step (grad_accum 1 when --epochs > 1)
        device = next(self.model.parameters()).device
        generate_s = 0.0
        if into == 0:
            self.held, generate_s = self.rollout(rows, int(seed[0]), device)
            if self.epochs > 1:
                self.held.save(self.kept, step)
        elif self.held is None:  # resumed between a rollout's updates
            self.held = Held.read(self.kept, step - into, device)
        result = self.scored(self.held)
        self.last = {**self.held.logged, "kl": result.kl, "clip_frac": result.clip_frac, "generate_s": generate_s}
        return self.held.rewards, result.loss

    def rollout(self, rows: Tensor, seed: int, device: torch.device) -> tuple[Held, float]:
        """G answers to each prompt of the batch, scored, with their group advantages; the seconds
        spent sampling them."""
        d = self.sample(rows, self.group, self.max_new, seed)
        r, right = d.rollout, torch.tensor(d.right).float()
        rewards = self.reward.to(device)(d.asked, d.texts, seed)
        advantages = group_advantages(rewards, self.group, self.loss.scale).to(device)
        b, ref = r.batch(device), None
        if self.reference is not None:
            with torch.no_grad(), as_rolled(self.model, device):
                ref = answer_token_logprobs(self.reference.model.to(device), b)
        logged = {
            "reward": rewards.mean().item(),
            "exact": right.mean().item(),
            "answer_length": float(np.mean([len(a) for a in r.answers])),
        }
        return Held(b, advantages, ref, rewards, logged), d.seconds

    def scored(self, h: Held):
        """The policy loss of a held rollout: one teacher-forced forward, float32 and without dropout,
        so that on the rollout's own policy its log-probabilities are the rollout's (autocast off: the
        loop's may be bf16)."""
        with as_rolled(self.model, h.batch.ids.device):
            logp = answer_token_logprobs(self.model, h.batch)  # (B, A)
        return policy_loss(logp, h.batch.old, h.advantages, h.batch.mask, self.loss, h.ref)


class GroupRelative(SampledAnswers):
    name = "grpo"
    help = "reinforcement learning (GRPO, Dr. GRPO, DAPO) of a fine-tuned GPT against a reward"
    description = (
        "Tune a GPT run (an sft run, --init) by sampling a group of answers to each prompt (built-in "
        "instructions, a verifiable task: --data add|multiply|countdown, or a file) and rewarding "
        "the right ones (--reward exact), a reward model's favourites (--reward RUN), or a coin "
        "(--reward random)."
    )
    noun = "an RL-tuned (grpo)"
    data_config = ChatData
    options = GRPOOptions
    fixed_options = {
        "reward": "it is what the run learns to raise",
        "epochs": "a rollout's updates are counted from the run's first step",
        "max_new_tokens": "it decides which prompts leave room for an answer",
    }

    def train_defaults(self, model: str) -> dict[str, Any]:
        return dict(GRPO_TRAIN)

    def check_settings(self, req: TrainRequest) -> None:
        self.reward_of(req, self.settings(req))

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        opts = self.settings(req)
        if d.enabled and opts["epochs"] > 1:  # each process would keep its own rollout in the one file
            raise AttnlabError("grpo --epochs above 1 runs in one process: start it without torchrun")
        tok, template = load_tokenizer(req.out), run_template(req.out)
        model = self.model_config(req)
        rows = splits(req.data, self.builtin)["train"]
        prompts = self.prompts(rows, tok, template, req, model["context"], opts["max_new_tokens"])
        stops = stop_ids(tok, template)
        build = self.builder(req, model)
        config = self.run_config(req, model)
        reward = self.reward_of(req, opts)
        config["task"].update(opts, reward=reward.spec)  # a callable: its name (config.json holds no code)
        kept = self.held_rollout(req, d.main)

        def objective() -> GRPOObjective:
            reference = build() if opts["beta"] > 0 else None
            return GRPOObjective(build(), prompts, opts, (tok, stops), reward, reference, kept)

        return Prepared(
            Prompts(prompts, opts["group"], opts["max_new_tokens"]),
            objective,
            config,
            state=(tok, template, test_split(req.data, self.builtin)),
        )

    def settings(self, req: TrainRequest) -> dict[str, Any]:
        """The run's RL settings (a resumed run's own under the flags: tasks/request.py), checked."""
        opts = {k: getattr(req.options, k) for k in SETTINGS}
        if opts["group"] < 2:
            raise AttnlabError(f"--group {opts['group']}: a group needs at least 2 answers per prompt to compare them")
        PolicyLoss(opts["loss"])  # an unknown loss is one line here, before the run's folder fills
        if opts["epochs"] > 1 and req.train.grad_accum != 1:
            raise AttnlabError("--epochs takes whole steps from one rollout: leave --grad-accum at 1")
        return opts

    def reward_of(self, req: TrainRequest, opts: dict[str, Any]) -> Reward:
        """The run's source of rewards: the option's (a resumed run's own "callable:NAME" needs the
        function given again)."""
        return reward_source(opts["reward"])

    def older_options(self, saved: dict[str, Any]) -> dict[str, Any]:
        return {"epochs": 1}  # a run stored before --epochs took one update a rollout

    def normal_options(self, options: GRPOOptions) -> GRPOOptions:
        return replace(options, reward=as_kept(options.reward))

    def check_options_resumed(self, saved: dict[str, Any], options: Any) -> None:
        """A reward function given again on --resume stands for the run's own, which config.json names."""
        if callable(options.reward):
            if not str(saved.get("reward")).startswith(CALLABLE):
                raise AttnlabError(f"this run's reward is {saved.get('reward')}: resume it without a reward function")
            options = replace(options, reward=saved["reward"])
        super().check_options_resumed(saved, options)

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        tok, template, test = prepared.state
        show = EXACT if req.progress and s.dist.main else None
        return self.exact(inner(s.raw).eval(), tok, template, test, show) if test else None
