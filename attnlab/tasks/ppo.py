"""ppo: InstructGPT's RL step. A fine-tuned GPT (an sft run, --init) samples answers, a reward model
(--reward RUN) scores them, and PPO moves the policy toward higher scores with a KL leash to --init.

attnlab train ppo --init runs/sft --reward runs/rm --out runs/ppo [--beta 0.05 --ppo-epochs 2 --minibatches 2]

A rollout: --group answers (4) to each of --batch-size prompts (8), sampled on the one
decoding engine (float32, temperature 1: decoding/rollouts.py); the reward model's score at each
answer's last token (with --group above 1, minus the mean of its prompt's answers), a KL
penalty -beta (log pi - log ref) on every token (nn/ppo.py), values from the policy's value head,
GAE advantages (whitened over the rollout) and returns. A step is one PPO update on one of
--minibatches parts of the rollout; after --ppo-epochs passes over it the next step samples anew.
The clipped surrogate is nn/policy.py's (the mean over the rollout's tokens); the value loss is
clipped too, weighted by --vf-coef. metrics.jsonl holds, per step: reward (the reward model's mean
score of the rollout), exact, kl (sum over an answer's tokens of log pi - log ref, the mean over
answers), answer_length, clip_frac, value_loss, generate_s (seconds sampling: 0 between rollouts).

The reward-hacking alarm: every --eval-interval steps, before that step's update, the policy answers
WATCHED held-out prompts greedily; heldout_score (the reward model's mean score) and heldout_exact go
to metrics.jsonl. When the score is above the first evaluation's while exact is below it,
--hacking-patience evaluations in a row, one line says so and the row records `hacking`;
--stop-on-hacking ends the run there (its checkpoint is the policy evaluated). eval.json holds the
held-out exact answers and score of the final policy.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import option
from attnlab.data.finetune import ChatData, splits
from attnlab.data.tokenizers import load_tokenizer
from attnlab.decoding.rollouts import RolloutBatch, answer_token_logprobs
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.nn.objective import inner
from attnlab.nn.policy import PolicyLoss, group_advantages, policy_loss
from attnlab.nn.ppo import gae, kl_shaped_rewards, value_loss, whiten
from attnlab.runs.adapted import run_template
from attnlab.runs.folder import METRICS
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import TUNED, AdaptOptions
from attnlab.tasks.hacking import Watch, held_out, past_evaluations
from attnlab.tasks.rewards import RewardRun, as_kept
from attnlab.tasks.sampled import HeldRollout, Prompt, Prompts, SampledAnswers, Sampling, as_rolled, stop_ids

SETTINGS = (
    "reward",
    "group",
    "beta",
    "gamma",
    "lam",
    "ppo_epochs",
    "minibatches",
    "clip",
    "value_clip",
    "vf_coef",
    "max_new_tokens",
    "hacking_patience",
    "stop_on_hacking",
)  # config.json's task section
# A rollout of 8 prompts x 4 answers (--group) is 4 updates of 16 (2 epochs x 2 minibatches); the alarm
# looks every 20 steps. lr 3e-5: every answer token carries a whitened advantage, so each AdamW step
# moves every weight by about lr whether the reward model's differences are signal or noise. From a
# 78.9% sft, 300 steps, 1,000 held-out: at 1e-4 exact fell 1.3-2.7 points while the score rose (with
# or without the group); at 3e-5 with the group three seeds gained 0.4-0.9 with the score up, without
# it +0.6 and -0.1 (docs/rlhf.md, benchmarks/ppo.py).
PPO_TRAIN = dict(TUNED, lr=3e-5, batch_size=8, max_steps=100, warmup_steps=5, eval_interval=20, eval_batches=1)
WATCHED = 100  # held-out prompts the alarm answers at each evaluation (a question is a point of exact)
# The value head is a linear read of the policy's last hidden states, detached: at this size (4 layers
# of 128) a value loss pulling the shared trunk would move the language the policy answers with, and a
# second model would double each step's forward and backward on 2 cores. The policy's own features
# already say whether its answer is going right. AdamW moves a weight by about lr a step whatever its
# gradient, so at the policy's small lr the head would take thousands of steps to reach scores of +-5:
# its output is multiplied by VALUE_GAIN, which is a learning rate 100 times the policy's for the head.
VALUE_GAIN = 100.0


@dataclass
class PPOOptions(AdaptOptions):
    reward: str | None = option(
        None, "the reward model that scores each answer: a run of attnlab train reward", metavar="RUN"
    )
    group: int = option(
        4,
        "answers sampled per prompt; above 1 each answer's score counts against the mean of its "
        "prompt's answers (a reward model compares answers to one prompt, not prompts)",
        at_least=1,
    )
    beta: float = option(0.05, "weight of the KL to the --init model inside the reward, per token")
    gamma: float = option(1.0, "discount per token of what comes later in the answer")
    lam: float = option(0.95, "GAE's lambda: 0 trusts the value head alone, 1 the sampled rewards alone")
    ppo_epochs: int = option(2, "passes over each rollout before the next is sampled", at_least=1)
    minibatches: int = option(2, "parts of a rollout, one update (one step) each", at_least=1)
    clip: float = option(0.2, "the policy ratio's clip range around 1")
    value_clip: float = option(0.2, "the value's clip range around the rollout's value")
    vf_coef: float = option(0.1, "weight of the value loss beside the policy loss")
    max_new_tokens: int = option(48, "the longest answer sampled, in tokens", at_least=1)
    hacking_patience: int = option(
        2,
        "the alarm: evaluations in a row where the reward model's score rose while held-out exact answers fell",
        at_least=1,
    )
    stop_on_hacking: bool = option(
        False, "end the run when the alarm rings (its checkpoint is the policy it evaluated)"
    )


# ---- one rollout, and the updates it feeds ------------------------------------------------------
@dataclass
class Buffer:
    """A rollout as the updates read it (B answers); saved so that a run resumed mid-way goes on."""

    batch: RolloutBatch
    values: Tensor  # (B, A) the value head's, at sampling
    advantages: Tensor  # (B, A) whitened GAE
    returns: Tensor  # (B, A) the value's targets
    seed: int  # each epoch's order of the answers: from seed + epoch
    logged: dict[str, float] = field(default_factory=dict)  # the rollout's metrics

    def part(self, rows: Tensor) -> Buffer:
        b = self.batch
        sub = RolloutBatch(b.ids[rows], b.places[rows], b.old[rows], b.mask[rows])
        return Buffer(sub, self.values[rows], self.advantages[rows], self.returns[rows], self.seed, self.logged)

    def save(self, held: HeldRollout, step: int) -> None:
        more = {"values": self.values, "advantages": self.advantages, "returns": self.returns}
        held.save(step, self.batch, more, {"seed": self.seed, "logged": self.logged})

    @staticmethod
    def read(held: HeldRollout, step: int, device: torch.device) -> Buffer:
        batch, t, notes = held.read(step, device)
        return Buffer(batch, t["values"], t["advantages"], t["returns"], notes["seed"], notes["logged"])


def relative_scores(scores: Tensor, group: int) -> Tensor:
    """The reward model's scores (N * G,) as PPO's terminal rewards: as they are for one answer per
    prompt; for G > 1, each minus the mean of its prompt's G answers. A Bradley-Terry reward model
    is trained on differences between answers to one prompt, so its offset per prompt is arbitrary:
    a value head would have to learn it from the prompt alone, and the advantage carries its error."""
    return scores if group == 1 else group_advantages(scores, group, scale=False)


@contextmanager
def last_hidden(model: nn.Module):
    """Catches the final hidden states (B, T, C), the output of the model's last norm, of a forward."""
    seen: list[Tensor] = []
    handle = model.norm.register_forward_hook(lambda m, i, out: seen.append(out))
    try:
        yield seen
    finally:
        handle.remove()


class PPOObjective(Sampling):
    """Rollouts every ppo_epochs x minibatches steps; each step one clipped update on a part of one."""

    def __init__(
        self,
        model: nn.Module,
        prompts: list[Prompt],
        opts: dict[str, Any],
        chat: tuple,
        reference: nn.Module,
        rm: RewardRun,
        watch: Watch,
        kept: HeldRollout,
    ):
        super().__init__(model, prompts, chat, kept, reference)
        self.opts, self.rm, self.watch, self.buffer = opts, rm, watch, None
        self.loss = PolicyLoss("dapo", opts["clip"])  # PPO's mean over every token of the batch
        self.cycle = opts["ppo_epochs"] * opts["minibatches"]

    def forward(self, rows: Tensor, seed: Tensor) -> tuple[Tensor, Tensor]:
        step, into = self.kept.advance(self.cycle)  # one call per step (grad_accum 1)
        self.last = {}
        if step % self.watch.every == 0:
            self.last.update(self.watch.look(self.model, step))
        device = next(self.model.parameters()).device
        if into == 0:
            self.buffer = self.rollout(rows, int(seed[0]), device)
            self.buffer.save(self.kept, step)
        elif self.buffer is None:  # resumed mid-way through a rollout
            self.buffer = Buffer.read(self.kept, step - into, device)
        loss = self.update(into)
        return loss.detach(), loss

    def rollout(self, rows: Tensor, seed: int, device: torch.device) -> Buffer:
        """--group answers to each prompt, scored; their values, rewards, advantages and returns."""
        g = self.opts["group"]
        d = self.sample(rows, g, self.opts["max_new_tokens"], seed)
        r, right, generate_s = d.rollout, d.right, d.seconds
        scores = self.rm.to(device)(d.asked, d.texts, seed)
        graded = relative_scores(scores, g)
        b = r.batch(device)
        with torch.no_grad(), as_rolled(self.model, device):
            _, values = self.policy_and_value(b)
            ref = answer_token_logprobs(self.reference.model.to(device), b)
        o = self.opts
        rewards = kl_shaped_rewards(graded, b.old, ref, b.mask, o["beta"])
        advantages, returns = gae(rewards, values, b.mask, o["gamma"], o["lam"])
        logged = {
            "reward": scores.mean().item(),
            "exact": sum(right) / len(right),
            "kl": ((b.old - ref) * b.mask).sum(1).mean().item(),
            "answer_length": b.mask.sum(1).float().mean().item(),
        }
        self.last["generate_s"] = generate_s
        return Buffer(b, values, whiten(advantages, b.mask), returns, seed, logged)

    def update(self, into: int) -> Tensor:
        """The loss of minibatch `into` of the cycle: its epoch's order of the answers, then its part."""
        epoch, part = divmod(into, self.opts["minibatches"])
        n = self.buffer.batch.ids.shape[0]
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.buffer.seed + epoch))
        size = -(-n // self.opts["minibatches"])
        mb = self.buffer.part(order[part * size : (part + 1) * size].to(self.buffer.batch.ids.device))
        device = mb.batch.ids.device
        with as_rolled(self.model, device):
            logp, values = self.policy_and_value(mb.batch)
        pol = policy_loss(logp, mb.batch.old, mb.advantages, mb.batch.mask, self.loss)
        vl, _ = value_loss(values, mb.values, mb.returns, mb.batch.mask, self.opts["value_clip"])
        self.last = {**self.last, **self.buffer.logged, "clip_frac": pol.clip_frac, "value_loss": vl.item()}
        self.last.setdefault("generate_s", 0.0)
        return pol.loss + self.opts["vf_coef"] * vl

    def policy_and_value(self, b: RolloutBatch) -> tuple[Tensor, Tensor]:
        """The policy's log-probability of each answer token and the value before it, each (B, A),
        from one teacher-forced forward (the value head reads its hidden states, detached)."""
        with last_hidden(self.model) as seen:
            logp = answer_token_logprobs(self.model, b)
        v = VALUE_GAIN * self.model.reward_head(seen[-1].detach()).squeeze(-1).float()  # (B, L - 1)
        at = (b.places - 1).clamp(min=0)  # the position that predicts each answer token
        return logp, v.gather(1, at) * b.mask


class ProximalPolicy(SampledAnswers):
    name = "ppo"
    help = "InstructGPT's RL step (PPO) of a fine-tuned GPT against a reward model, with a reward-hacking alarm"
    description = (
        "Tune a GPT run (an sft run, --init) by PPO against a reward model (--reward RUN): a value head, "
        "GAE, the KL to --init inside the reward, clipped policy and value losses. Every --eval-interval "
        "steps it answers held-out prompts and says when the reward model's score rises while exact "
        "answers fall (--hacking-patience, --stop-on-hacking)."
    )
    noun = "an RL-tuned (ppo)"
    data_config = ChatData
    options = PPOOptions
    fixed_options = {
        "reward": "it is what the run learns to raise",
        "ppo_epochs": "a rollout's updates are counted from the run's first step",
        "minibatches": "a rollout's updates are counted from the run's first step",
        "max_new_tokens": "it decides which prompts leave room for an answer",
    }
    family = "reward"  # the GPT with a scalar head on its trunk (models/reward.py): here, the value head
    new_weights = ("reward_head.weight", "reward_head.bias")  # zero: every value starts at 0

    def train_defaults(self, model: str) -> dict[str, Any]:
        return dict(PPO_TRAIN)

    def check_settings(self, req: TrainRequest) -> None:
        self.reward_run(self.settings(req)["reward"])

    def setup(self, req: TrainRequest) -> dict[str, str]:
        if req.train.grad_accum != 1:
            raise AttnlabError("ppo splits a rollout with --minibatches: leave --grad-accum at 1")
        return super().setup(req)

    @staticmethod
    def reward_run(path: str) -> RewardRun:
        """The reward model, loaded on the CPU (a run of another kind: one line)."""
        return RewardRun(path)

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        if d.enabled:  # each process would sample and keep its own rollout file: not built yet
            raise AttnlabError("attnlab train ppo runs in one process: start it without torchrun")
        opts = self.settings(req)
        out = Path(req.out)
        tok, template = load_tokenizer(out), run_template(out)
        model = self.model_config(req)
        parts = splits(req.data, self.builtin)
        prompts = self.prompts(parts["train"], tok, template, req, model["context"], opts["max_new_tokens"])
        answers = req.train.batch_size * opts["group"]
        if opts["minibatches"] > answers:
            raise AttnlabError(
                f"--minibatches {opts['minibatches']} parts of {answers} answers: give "
                "fewer minibatches or a larger --batch-size"
            )
        stops = stop_ids(tok, template)
        rm = self.reward_run(opts["reward"])
        held = self.held_rollout(req, d.main)
        watch = Watch(
            parts["val"][:WATCHED],
            (tok, template),
            rm,
            req.train.eval_interval,
            opts["hacking_patience"],
            opts["stop_on_hacking"],
            past_evaluations(out, held.step),
            out / METRICS,
        )
        build = self.builder(req, model)
        config = self.run_config(req, model)
        config["task"].update(opts)

        def objective() -> PPOObjective:
            return PPOObjective(build(), prompts, opts, (tok, stops), build(), rm, watch, held)

        return Prepared(
            Prompts(prompts, opts["group"], opts["max_new_tokens"]),
            objective,
            config,
            state=(tok, template, parts["test"], rm),
        )

    def settings(self, req: TrainRequest) -> dict[str, Any]:
        """The run's RL settings (a resumed run's own under the flags: tasks/request.py), checked."""
        opts = {k: getattr(req.options, k) for k in SETTINGS}
        if not opts["reward"]:
            raise AttnlabError("attnlab train ppo needs --reward RUN: a reward model (attnlab train reward)")
        return opts

    def older_options(self, saved: dict[str, Any]) -> dict[str, Any]:
        return {"group": 1}  # a run stored before --group: one answer a prompt

    def normal_options(self, options: PPOOptions) -> PPOOptions:
        """The reward run's folder absolute: a resumed run finds it from anywhere (and --reward given
        again, relative, is the same run)."""
        return replace(options, reward=options.reward and as_kept(options.reward))

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        tok, template, test, rm = prepared.state
        return held_out(inner(s.raw).eval(), tok, template, test, rm) if test else None

    def test_line(self, test: dict[str, Any]) -> str:
        return (
            f"exact answers on the held-out instructions {test['exact']:.1%} ({test['examples']}), "
            f"the reward model's mean score of them {test['reward_score']:+.3f}"
        )
