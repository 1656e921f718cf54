# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 10: reward models, PPO and GRPO at small scale
#
# The lectures end on one sentence: today's assistants are a pretrained model plus better data and
# **human feedback (RLHF)**. Lesson 9 fine-tuned on demonstrations (SFT) and on preference pairs (DPO).
# This lesson is the step the sentence names: **reinforcement learning against a reward**. The policy
# (the language model) writes answers, a reward says how good each one is, and the policy moves toward
# the answers that scored above what it usually gets.
#
# - InstructGPT (Ouyang et al. 2022) learns the reward from human preferences (a **reward model**,
#   Bradley-Terry) and optimises against it with **PPO**: a value function, GAE, a clipped ratio, a KL
#   penalty that keeps the policy near where it started.
# - DeepSeekMath (Shao et al. 2024) and DeepSeek-R1 drop the value function: **GRPO** samples a group of answers
#   to each prompt and uses the group as its own baseline, against a **verifiable reward**, a program
#   that checks the answer.
#
# Everything here is tiny (a 27-thousand-parameter GPT, a toy task) so that it runs in about 30 seconds of
# one CPU core (28 s measured on a 2-core AMD EPYC; 80-90 s of wall time while other jobs kept its load
# average near 8), but every piece is attnlab's own: `rollouts` samples on the one decoding engine,
# `group_advantages`, `policy_loss`, `bradley_terry_loss` and `gae` are the functions that
# `attnlab train grpo`, `attnlab train reward` and `attnlab train ppo` use.

# %%
SCALE = 1
WARM_STEPS = 400 * SCALE  # supervised steps on the noisy demonstrations
RM_STEPS = 100 * SCALE  # reward-model steps on preference pairs (each of two heads)
RL_STEPS = 40 * SCALE  # GRPO steps of each run (three runs)
PROMPTS, GROUP = 8, 8  # a GRPO step: PROMPTS prompts, GROUP sampled answers to each
EPOCHS = 4  # optimizer steps on each batch of rollouts (the clipped ratio is what keeps them safe)

import copy
import itertools
import random
import time

import matplotlib.pyplot as plt
import torch
from pictures import show

from attnlab.data.instructions import in_test
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.rollouts import Rollouts, answer_token_logprobs, rollouts
from attnlab.models.gpt import GPT, GPTConfig

torch.set_num_threads(1)  # tiny models: one thread is fastest
torch.manual_seed(0)

# %% [markdown]
# ## The task, and a policy that half knows it
#
# A toy with a checker: "Reverse abc." is answered by "cba". The words are three letters from a to f
# (216 of them); a hash of the question puts one in eight into a held-out test split, as attnlab's
# generated instructions do, so a score on the test words says whether the model learned the rule.
#
# RL does not teach a model from nothing: it moves probability toward answers the model already
# produces sometimes. So we first give the policy that "sometimes": supervised fine-tuning on
# demonstrations that are mostly wrong (seven in ten copy the word instead of reversing it, a common
# mistake in the data). SFT maximises the log-probability of the demonstrated answer,
# $\mathcal{L}_\text{SFT} = -\frac{1}{|y|} \sum_t \log \pi(y_t \mid x, y_{<t})$, and the log-probabilities come
# from `answer_token_logprobs`, the same teacher-forced forward GRPO uses below: SFT weights every
# demonstrated answer by one, policy gradients weight the policy's own answers by their advantage.

# %%
LETTERS = "abcdef"
words = ["".join(w) for w in itertools.product(LETTERS, repeat=3)]
question = "Reverse {}.".format
train_words = [w for w in words if not in_test(question(w))]
test_words = [w for w in words if in_test(question(w))]
tok = CharTokenizer(LETTERS + "Revrs .\n")
END = tok.encode("\n")  # an answer ends at a newline: the rollouts stop there


def prompt(word: str) -> list[int]:
    return tok.encode(question(word) + " ")


def as_batch(prompts: list[list[int]], answers: list[list[int]]):
    """Prompts and given answers as the tensors of a rollout (for a teacher-forced forward)."""
    return Rollouts(prompts, answers, [[0.0] * len(a) for a in answers], [True] * len(answers)).batch()


rng = random.Random(0)
policy = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=24, vocab_size=tok.vocab_size))
optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
for _ in range(WARM_STEPS):
    batch = rng.choices(train_words, k=32)
    shown = [w[::-1] if rng.random() < 0.3 else w for w in batch]  # 30% right, 70% copied
    b = as_batch([prompt(w) for w in batch], [tok.encode(a + "\n") for a in shown])
    loss = -answer_token_logprobs(policy, b).sum() / b.mask.sum()  # mean over the answers' tokens
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
sft_weights = copy.deepcopy(policy.state_dict())
n_params = sum(p.numel() for p in policy.parameters())
print(f"SFT: {n_params:,} parameters, {WARM_STEPS} steps, loss {loss.item():.3f} per answer token")


def text(answer: list[int]) -> str:
    """An answer's text without its newline."""
    return tok.decode(answer[:-1] if answer[-1:] == END else answer)


def right(word: str, answer: str) -> bool:
    """The checker: a verifiable reward needs nothing else."""
    return answer == word[::-1]


def pass_at(model, ws: list[str], k: int = 8, seed: int = 123) -> tuple[float, float]:
    """(pass@1, pass@k) over words `ws`: k answers sampled to each, the share right, the share of words
    with at least one right answer."""
    r = rollouts(model, [prompt(w) for w in ws], k, 6, seed=seed, stops=[END])
    ok = torch.tensor([right(w, text(a)) for w, a in zip([w for w in ws for _ in range(k)], r.answers)])
    ok = ok.float().view(len(ws), k)
    return ok.mean().item(), ok.max(dim=1).values.mean().item()


sft_pass1, sft_pass8 = pass_at(policy, test_words)
print(f"held-out words: pass@1 {sft_pass1:.0%}, pass@8 {sft_pass8:.0%}")
r = rollouts(policy, [prompt(w) for w in test_words[:3]], 4, 6, seed=1, stops=[END])
for w, a in zip([w for w in test_words[:3] for _ in range(4)], r.answers):
    print(f"  {question(w)!r:18} -> {text(a)!r:8} {'right' if right(w, text(a)) else ''}")

# %% [markdown]
# pass@1 is the share of sampled answers that are right; pass@8 the share of words with at least one
# right answer in eight. The gap between them is what RL can harvest: the right answer is in the
# policy, it just is not what it usually says.
#
# ## A reward model from preference pairs
#
# Where no program can check an answer, people compare two: for a prompt $x$, answer $y_c$ is preferred
# to $y_r$. The **Bradley-Terry** model says such a preference happens with probability
# $\sigma(r(x, y_c) - r(x, y_r))$ for some score $r$; a reward model is a network trained to be that
# score, by minimising
#
# $$
# \mathcal{L}_\text{RM} = -\log \sigma\bigl(r(x, y_c) - r(x, y_r)\bigr)
# $$
#
# over the pairs (`attnlab.nn.preference.bradley_terry_loss`). Only differences of scores are learned,
# so the scale and the zero of $r$ mean nothing. attnlab's `RewardModel` is a GPT with a head that gives
# one number, and like InstructGPT's it starts from the SFT policy's weights. Our pairs: the reversal
# chosen; rejected, the copy or a near miss (two letters swapped). We train two heads, from the same
# weights, on the same pairs:
#
# - `last`, the classic sequence classifier: $r = w^\top h_T + b$, the hidden state of the answer's last
#   token; it starts with every answer at the same score (the loss at $\ln 2$);
# - `answer`: $r = \sum_t w^\top [h_t, \log \pi(y_t)] + b$ over the answer's tokens, with the weight of
#   the policy's own log-probability starting at 1: it starts ranking answers as the SFT policy does,
#   and this one prefers the copies its data was full of, so it starts mostly wrong.

# %%
from attnlab.models.reward import RewardConfig, RewardModel
from attnlab.nn.preference import bradley_terry_loss, preference_accuracy


def scores(model, ws: list[str], answers: list[str]) -> torch.Tensor:
    """The reward model's score of each (word, answer)."""
    b = as_batch([prompt(w) for w in ws], [tok.encode(a + "\n") for a in answers])
    last = b.places.gather(1, b.mask.sum(1, keepdim=True) - 1)[:, 0]  # (B,) where each answer ends
    answer = torch.zeros_like(b.ids, dtype=torch.bool).scatter(1, b.places, b.mask)  # (B, L) its tokens
    return model.score(b.ids, last, answer)


def rejected_answer(word: str, i: int) -> str:
    """The copy (i = 2), or the reversal with letters i and i + 1 swapped (a near miss, when it differs)."""
    r = word[::-1]
    swapped = r[:i] + r[i + 1] + r[i] + r[i + 2 :] if i < 2 else word
    return swapped if swapped != r else word


pairs = [(w, rejected_answer(w, i)) for w in train_words for i in range(3) if w != w[::-1]]
held_out = [(w, rejected_answer(w, i)) for w in test_words for i in (0, 2) if w != w[::-1]]
fig, (left, right_ax) = plt.subplots(1, 2, figsize=(10, 3.2))
for head in ("last", "answer"):
    reward_model = RewardModel(RewardConfig(**{**vars(policy.cfg), "head": head}))
    reward_model.load_state_dict(sft_weights, strict=False)  # all but the new reward_head
    optimizer = torch.optim.Adam(reward_model.parameters(), lr=3e-3)
    rm_rng, rm_losses = random.Random(1), []
    for _ in range(RM_STEPS):
        ws, rejected = zip(*rm_rng.choices(pairs, k=32))
        s = scores(reward_model, list(ws) * 2, [w[::-1] for w in ws] + list(rejected))
        loss = bradley_terry_loss(s[:32], s[32:])  # the chosen half, the rejected half
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rm_losses.append(loss.item())
    with torch.no_grad():
        ws, rejected = zip(*held_out)
        chosen_s = scores(reward_model, list(ws), [w[::-1] for w in ws])
        accuracy = preference_accuracy(chosen_s, scores(reward_model, list(ws), list(rejected)))
    print(f"head {head:6}: held-out pairs ranked right {accuracy:.0%} of {len(held_out)}")
    left.plot(rm_losses, label=f"head {head}")
    right_ax.bar(head, accuracy)
left.axhline(0.6931, color="gray", ls=":", label="ln 2: every answer scores the same")
left.set(xlabel="step", ylabel="Bradley-Terry loss (training pairs)", title="two reward models, one set of pairs")
left.legend(loc="upper right")
right_ax.set(ylim=(0, 1), ylabel="held-out pairs ranked right", title="what they learned")
show(fig)

# %% [markdown]
# The head decides what one number can see. The last token must notice a swap of two letters from one
# position, and at this size and these steps it does no better than a coin; the answer head reads
# every token with the policy's own evidence beside it, and ranks the held-out pairs right. (attnlab's
# reward runs offer both: `attnlab train reward --head answer|last`.)
#
# A reward model is a model: it is right on the pairs it was trained to tell apart and can be wrong
# anywhere else, and the policy will look for those places. That is why the rest of this lesson uses
# the checker (a verifiable reward), and why an RL run against a reward model needs a watch on an
# independent score (`attnlab train ppo` raises a reward-hacking alarm when the reward model's score
# rises while held-out exact answers fall).
#
# ## The group is its own baseline
#
# A policy gradient raises the log-probability of an answer in proportion to its **advantage**: how much
# better it did than expected. PPO learns the expectation (a value function, below); GRPO measures it:
# it samples $G$ answers to the same prompt and compares each with the others,
#
# $$
# A_i = \frac{r_i - \operatorname{mean}(r_1, \dots, r_G)}{\operatorname{std}(r_1, \dots, r_G) + \epsilon}
# $$
#
# and every token of answer $i$ shares $A_i$. With a 0/1 reward, the right answers of a group get a
# positive advantage and the wrong ones a negative one; a group that is all right or all wrong teaches
# nothing (advantage 0), whatever its reward. The rarer the right answer, the larger its advantage.
# (Dr. GRPO drops the division by the std: it weighs easy and hard prompts alike.)

# %%
from attnlab.nn.policy import PolicyLoss, group_advantages, policy_loss

rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1])  # 3 groups of 8
for n, a in enumerate(group_advantages(rewards, GROUP).view(-1, GROUP)):
    print(
        f"group {n}: rewards {rewards.view(-1, GROUP)[n].int().tolist()} -> advantages "
        f"{[round(x, 2) for x in a.tolist()]}"
    )

# %% [markdown]
# ## The clipped ratio
#
# The rollouts were sampled from the policy as it was, $\pi_\text{old}$; after one optimizer step the
# policy is $\pi_\theta$, and reusing the same samples for a few more steps (here `EPOCHS`) needs the
# probability ratio of each token, $\rho_t = \pi_\theta(o_t) / \pi_\text{old}(o_t)$. PPO's surrogate
# (Schulman et al. 2017), which GRPO keeps, is per token
#
# $$
# \ell_t = -\min\bigl(\rho_t A,\ \operatorname{clip}(\rho_t, 1 - \epsilon, 1 + \epsilon) A\bigr)
# $$
#
# Once the ratio has left $[1 - \epsilon, 1 + \epsilon]$ in the direction the advantage pushes it, the
# clipped side is the smaller one and the token's gradient is zero: one batch of samples cannot move
# the policy far. In the other direction nothing is clipped, so a step that made a good answer less
# likely is always undone. Here is `policy_loss` on one token, over the ratio:

# %%
ratios = torch.linspace(0.4, 1.6, 121)
mask = torch.ones(1, 1, dtype=torch.bool)
plt.figure(figsize=(6, 3.2))
for adv, colour in ((1.0, "tab:green"), (-1.0, "tab:red")):
    losses = [
        policy_loss(
            torch.log(p).view(1, 1), torch.zeros(1, 1), torch.tensor([adv]), mask, PolicyLoss("grpo", eps_low=0.2)
        ).loss.item()
        for p in ratios
    ]
    plt.plot(ratios, losses, color=colour, label=f"advantage {adv:+.0f}")
plt.axvspan(0.8, 1.2, color="gray", alpha=0.15, label="[1 - eps, 1 + eps], eps = 0.2")
plt.xlabel("ratio new / old probability")
plt.ylabel("token loss")
plt.title("flat where the clip holds: no gradient")
plt.legend()
show()

# %% [markdown]
# ## GRPO, one step written out
#
# One step of `attnlab train grpo` is four calls: sample a group of answers to each of a few prompts on
# the decoding engine (`rollouts`, temperature 1, each token's log-probability recorded), score them,
# turn the scores into group advantages, and minimise the clipped loss with the policy's recomputed
# log-probabilities (`answer_token_logprobs`; before the first optimizer step they equal the rollout's
# within float32 rounding, so the first ratio is 1). `attnlab train grpo` takes one optimizer step per
# batch of rollouts; this tiny policy learns faster with `EPOCHS` of them, which is where the clip
# starts to act. We run it three times from the same SFT policy, each with its own reward:
#
# 1. **the checker**: 1 for the reversal, else 0;
# 2. **a coin**: 0 or 1 at random, whatever the answer. The "Spurious Rewards" study (Shao et al. 2025)
#    found random rewards lifting some pretrained models by many points: a gain means something only
#    beside this control;
# 3. **length**: the number of tokens, a reward that can be gamed (below).


# %%
def grpo(reward, steps: int, seed: int = 0) -> list[dict]:
    """GRPO from the SFT policy with `reward(words, answers) -> (B,)`; the log of each step."""
    policy.load_state_dict(sft_weights)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    loss_cfg = PolicyLoss("grpo", eps_low=0.2)
    draw, log = random.Random(seed), []
    for step in range(steps):
        ws = [draw.choice(train_words) for _ in range(PROMPTS)]
        r = rollouts(policy, [prompt(w) for w in ws], GROUP, 8, seed=1000 * step + seed, stops=[END])
        answers, asked = [text(a) for a in r.answers], [w for w in ws for _ in range(GROUP)]
        rewards = reward(asked, r.answers)
        advantages = group_advantages(rewards, GROUP)
        b = r.batch()
        for _ in range(EPOCHS):  # the same samples, a few steps: the ratio moves away from 1
            result = policy_loss(answer_token_logprobs(policy, b), b.old, advantages, b.mask, loss_cfg)
            opt.zero_grad()
            result.loss.backward()
            opt.step()
        log.append(
            {
                "reward": rewards.mean().item(),
                "right": sum(map(right, asked, answers)) / len(asked),
                "clip_frac": result.clip_frac,
            }
        )
    return log


def checker(asked: list[str], answers: list[list[int]]) -> torch.Tensor:
    return torch.tensor([float(right(w, text(a))) for w, a in zip(asked, answers)])


coins = torch.Generator().manual_seed(0)


def coin(asked: list[str], answers: list[list[int]]) -> torch.Tensor:
    return torch.randint(0, 2, (len(answers),), generator=coins).float()


results = {}
for name, reward in (("checker", checker), ("coin (control)", coin)):
    start = time.perf_counter()
    log = grpo(reward, RL_STEPS)
    results[name] = (log, pass_at(policy, test_words), time.perf_counter() - start)
    print(
        f"{name:15} {RL_STEPS} steps in {results[name][2]:4.1f} s: held-out pass@1 {sft_pass1:.0%} -> "
        f"{results[name][1][0]:.0%} (pass@8 {results[name][1][1]:.0%}); clipped tokens in the last step "
        f"{log[-1]['clip_frac']:.0%}"
    )

plt.figure(figsize=(7, 3.5))
for (name, (log, _, _)), colour in zip(results.items(), ("tab:green", "tab:gray")):
    plt.plot([row["right"] for row in log], color=colour, label=f"GRPO, reward: {name}")
plt.axhline(sft_pass1, color="black", ls=":", label="SFT policy, held-out pass@1")
plt.xlabel("GRPO step")
plt.ylabel("right answers among the samples")
plt.ylim(0, 1)
plt.title("a gain is the reward's only beside a control")
plt.legend()
show()

# %% [markdown]
# The checker's run climbs from the SFT policy's level to nearly every answer right, and the held-out
# words follow: what moved is the rule, not a memorised list. The coin's run does not climb: the
# advantages it hands out are noise, and the policy drifts wherever the noise and the clip take it
# (here, down). At the size of `attnlab demo --chat` the same comparison is
# `attnlab train grpo --reward exact` against `--reward random` (docs/fine-tuning.md).
#
# ## Reward hacking
#
# A reward is a proxy for what we want, and RL optimises the proxy. Suppose a reward model had learned
# that longer answers tend to be preferred (human raters often do prefer them): reward the number of
# tokens. The policy finds quickly that not stopping pays.


# %%
def length(asked: list[str], answers: list[list[int]]) -> torch.Tensor:
    return torch.tensor([float(len(a) - (a[-1:] == END)) for a in answers])


hacked = grpo(length, RL_STEPS)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot([row["reward"] for row in hacked], color="tab:orange", label="the reward: tokens per answer")
ax.set(xlabel="GRPO step", ylabel="tokens per answer (before its newline)")
other = ax.twinx()
other.plot([row["right"] for row in hacked], color="tab:blue", label="right answers")
other.set(ylabel="right answers among the samples", ylim=(0, 1))
fig.legend(loc="center right", bbox_to_anchor=(0.88, 0.5))
ax.set_title("the proxy goes up, the answers go wrong")
show(fig)
print(
    f"tokens per answer {hacked[0]['reward']:.1f} -> {hacked[-1]['reward']:.1f}; right answers "
    f"{hacked[0]['right']:.0%} -> {hacked[-1]['right']:.0%}"
)

# %% [markdown]
# For the first steps nothing happens: every answer of a group has three letters, so every advantage
# is 0. The first answer that does not stop gets a large advantage, and within a few steps no answer
# stops. Two remedies are standard: a KL penalty that keeps the policy near the SFT model (`--beta` in
# `attnlab train grpo` and `attnlab train ppo`), and watching a score the policy is not trained on
# (held-out exact answers), which is what attnlab's reward-hacking alarm does.
#
# ## PPO: a value function and GAE
#
# InstructGPT's step treats an answer as an episode: state $s_t$ is the prompt and the first $t$ tokens,
# action $a_t$ is token $t$. The reward model scores the whole answer once, at its last token; every
# token also pays a KL penalty to the reference (the SFT model):
#
# $$
# r_t = -\beta \bigl(\log \pi(a_t \mid s_t) - \log \pi_\text{ref}(a_t \mid s_t)\bigr) + [t = T]\, \text{score}
# $$
#
# A value model $V(s_t)$ predicts what is still to come. Each token's surprise is the TD error, and
# **generalised advantage estimation** (Schulman et al. 2016) sums the surprises ahead of a token with a
# decay $\gamma \lambda$:
#
# $$
# \delta_t = r_t + \gamma V(s_{t+1}) - V(s_t), \qquad A_t = \sum_{l \ge 0} (\gamma \lambda)^l \delta_{t+l},
# \qquad R_t = A_t + V(s_t)
# $$
#
# with $V = 0$ after the last token (the episode ends). $\lambda = 0$ trusts the value model (one TD
# error: low variance, biased where $V$ is wrong); $\lambda = 1$ ignores it (the reward to come minus
# $V(s_t)$: unbiased, noisy). $R_t$ is the value model's target. GRPO needs none of this: the group's mean
# replaces $V$, and there is no second network to train and hold in memory; the price is $G$ samples of
# each prompt. Here is `attnlab.nn.ppo.gae` on one 3-token answer that the reward model scored 1.0:

# %%
from attnlab.nn.ppo import gae, kl_shaped_rewards

logp = torch.tensor([[-0.3, -1.2, -0.1]])  # the policy's log-probabilities of the 3 tokens
ref = torch.tensor([[-0.5, -1.0, -0.1]])  # the reference's
values = torch.tensor([[0.4, 0.7, 0.9]])  # the value model's V(s_t)
answer = torch.ones(1, 3, dtype=torch.bool)
token_rewards = kl_shaped_rewards(torch.tensor([1.0]), logp, ref, answer, beta=0.1)
print("rewards per token:", [round(x, 3) for x in token_rewards[0].tolist()])
lams = (0.0, 0.95, 1.0)
for lam in lams:
    adv, ret = gae(token_rewards, values, answer, gamma=1.0, lam=lam)
    print(
        f"lambda {lam:4}: advantages {[round(x, 3) for x in adv[0].tolist()]}, "
        f"returns {[round(x, 3) for x in ret[0].tolist()]}"
    )

plt.figure(figsize=(6, 3))
for i, lam in enumerate(lams):
    adv, _ = gae(token_rewards, values, answer, gamma=1.0, lam=lam)
    plt.bar([t + 0.27 * (i - 1) for t in range(3)], adv[0], width=0.27, label=f"lambda = {lam}")
plt.xticks(range(3), ["token 1", "token 2", "token 3"])
plt.ylabel("advantage")
plt.title("GAE: how far ahead each token looks")
plt.legend()
show()

# %% [markdown]
# At size, the same pieces are commands: `attnlab train reward --init SFT --data preferences` (the
# reward model), `attnlab train ppo --init SFT --reward RM` (PPO with a value head, GAE and the KL in
# the reward, and the hacking alarm), `attnlab train grpo --init SFT --reward exact` (or `--reward RUN`,
# `--reward random` for the control; `--loss dr_grpo|dapo`), and `attnlab demo --chat` runs the chain.
#
# ## Exercises
#
# **1.** Compute group advantages by hand: rewards $(N G,)$, a prompt's $G$ answers side by side ->
# $(N G,)$, each reward minus its group's mean, divided by its group's standard deviation (torch's
# `std`, which divides by $G - 1$) plus $\epsilon = 10^{-6}$.

# %%
from checks.rlhf import check_clipped_loss, check_gae, check_group_advantages


def my_group_advantages(rewards, group):
    raise NotImplementedError  # your code


check_group_advantages(my_group_advantages)

# %% [markdown]
# **2.** The clipped surrogate of each token: log-probabilities `logp` and `old` (B,), advantages (B,)
# and $\epsilon$ -> the token losses (B,), $-\min(\rho A, \operatorname{clip}(\rho, 1 - \epsilon, 1 + \epsilon) A)$ with
# $\rho = \exp(\text{logp} - \text{old})$.


# %%
def my_clipped_loss(logp, old, advantages, eps):
    raise NotImplementedError  # your code


check_clipped_loss(my_clipped_loss)

# %% [markdown]
# **3.** GAE by hand for one answer of 3 tokens: rewards (3,), values (3,), $\gamma$, $\lambda$ -> the
# advantages (3,). Go backwards from the last token; the value after it is 0.


# %%
def my_gae(rewards, values, gamma, lam):
    raise NotImplementedError  # your code


check_gae(my_gae)
