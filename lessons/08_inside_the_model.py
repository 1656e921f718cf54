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
# # Lesson 8: inside the model
#
# A trained Transformer is a pile of matrices, but some of what it computes can be read. This lesson
# trains the smallest model in which a well-known circuit appears, the **induction head** (Elhage et al.
# 2021, Olsson et al. 2022), watches it form during training, and then looks inside with attnlab's
# interpretability tools: **head detectors** that score each head for a known job, the **logit lens**
# that reads the prediction after each layer, and **ablation** that removes one head and measures what
# the loss loses.
#
# An induction head completes patterns: having seen "... A B ... A", it predicts "B". It needs two
# heads in two layers: a *previous-token* head in layer 1 writes into each position which token came
# before it, and the induction head in layer 2 looks for the position whose previous token is the
# current token (so it lands on the B after the earlier A) and copies what is there.
#
# `SCALE = 1` trains for 600 steps, a little past the moment the heads form (around step 400-450 on
# our machine; when exactly varies with the random seed and the CPU's arithmetic). If your curves below
# have not risen by the end, the model is still on its plateau: run with `SCALE = 2`.

# %%
SCALE = 1
STEPS = 600 * SCALE  # training steps
EVERY = 25 * SCALE  # measure the heads every EVERY steps
VOCAB, CONTEXT = 32, 32  # random tokens; sequences of up to CONTEXT tokens
WIDTH, HEADS = 64, 4
HEAD_LABELS = range(1, HEADS + 1)  # heads counted from 1 in pictures, as attnlab's own

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from pictures import show, show_file

import attnlab
from attnlab.interpret.detectors import head_scores, repeated_tokens

torch.set_num_threads(1 if SCALE == 1 else os.cpu_count())  # a tiny model: one thread is fastest
torch.manual_seed(0)
PICTURES = Path(tempfile.mkdtemp())  # attnlab's own pictures are files; we show them from here


# %% [markdown]
# ## The model and its data
#
# A GPT with 2 layers and **no feed-forward** (`feedforward="none"`): attention is all it has, so
# whatever it learns is in its heads. Rotary positions, so that heads can look a fixed distance back.
#
# The data are random tokens written twice: $n$ tokens, then the same $n$ again. The first half cannot be
# predicted at all (loss $\ln 32 = 3.47$); the second half can, perfectly, by copying. The length $n$ changes
# from batch to batch (6 to 16), so "look $n - 1$ positions back" is not a rule the model can learn; it has
# to find the earlier copy of the current token by its content, which is the induction mechanism.
# `repeated_tokens` (from attnlab's detectors) makes such sequences.

# %%
cfg = attnlab.GPTConfig(
    n_layer=2,
    n_head=HEADS,
    d_model=WIDTH,
    context=CONTEXT,
    vocab_size=VOCAB,
    feedforward="none",
    positions="rope",
    dropout=0.0,
)
model = attnlab.GPT(cfg)
print(f"{model.num_params():,} parameters")
probe, half = repeated_tokens(VOCAB, 11, batch=16, seed=123)  # fixed sequences to measure the heads on
print("a probe sequence:", probe[0].tolist(), f"(the repeat starts at position {half})")


def repeat_loss(logits, ids, half):
    """Cross-entropy of the predictions of the repeated half (the tokens after the first repeated one)."""
    return F.cross_entropy(logits[:, half:-1].flatten(0, 1), ids[:, half + 1 :].flatten()).item()


# %% [markdown]
# ## Training, with the heads measured along the way
#
# Every `EVERY` steps we run the model once on the probe sequences with `attnlab.trace`, which records
# every named activation, among them each layer's attention pattern (`t.patterns()`: B, L, H, T, T).
# `head_scores` turns the patterns into one number per head and job: how much attention the head puts,
# on average, where that job points (previous-token: key $t - 1$; induction: the key just after the
# earlier copy of the current token, $t - n + 1$).

# %%
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
generator = torch.Generator().manual_seed(1)
history = {"steps": [], "scores": {"previous-token": [], "induction": []}, "repeat_loss": [], "val_loss": []}
for step in range(1, STEPS + 1):
    n = int(torch.randint(6, 17, (1,), generator=generator))  # this batch's copy length
    ids, _ = repeated_tokens(VOCAB, n, batch=32, seed=step)
    _, loss = model(ids[:, :-1], ids[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % EVERY == 0:
        t = attnlab.trace(model, probe)
        found = head_scores(t.patterns(), probe, half)
        history["steps"].append(step)
        for name in history["scores"]:
            history["scores"][name].append(found[name])
        history["repeat_loss"].append(repeat_loss(t.output, probe, half))
        history["val_loss"].append(
            (step, F.cross_entropy(t.output[:, :-1].flatten(0, 1), probe[:, 1:].flatten()).item())
        )
        model.train()
history["scores"] = {k: torch.stack(v) for k, v in history["scores"].items()}  # (S, L, H) each
history["chance"] = float(torch.log(torch.tensor(float(VOCAB))))
print(
    f"loss on the repeated half: {history['repeat_loss'][0]:.2f} at step {EVERY} -> {history['repeat_loss'][-1]:.2f} "
    f"at step {STEPS} (chance {history['chance']:.2f})"
)

# %% [markdown]
# attnlab's `plot_over_training` draws such a history (it is what `attnlab inspect RUN --what
# over-training` shows for a run trained with `--snapshot-every`): on top, each layer's best head for
# each job; below, the loss on the repeated half. Look for the moment the layer-1 previous-token score
# and the layer-2 induction score rise **together**, and the repeated half's loss falls at the same
# step: the two heads only help as a pair. Before it, a long plateau where the model knows nothing
# better than chance.

# %%
from attnlab.interpret.over_training import plot_over_training

path = PICTURES / "over_training.png"
plot_over_training(history, path)
show_file(path)

# %% [markdown]
# ## Head detectors on the trained model
#
# The scores of every head at the end, as layers x heads tables. The duplicate-token detector (attention
# on earlier copies of the same token) and the first-token detector (attention parked on position 0, a
# "sink") are computed too.

# %%
t = attnlab.trace(model, probe)
scores = head_scores(t.patterns(), probe, half)
fig, axes = plt.subplots(1, len(scores), figsize=(3.3 * len(scores), 2.6))
for ax, (name, table) in zip(axes, scores.items()):
    ax.imshow(table, vmin=0, vmax=1, cmap="viridis")
    for (layer, head), v in zip(torch.cartesian_prod(torch.arange(2), torch.arange(HEADS)).tolist(), table.flatten()):
        ax.text(head, layer, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black")
    ax.set(
        title=name,
        xlabel="head",
        ylabel="layer",
        xticks=range(HEADS),
        xticklabels=HEAD_LABELS,
        yticks=[0, 1],
        yticklabels=[1, 2],
    )
show(fig)
prev_head = int(scores["previous-token"][0].argmax())
ind_head = int(scores["induction"][1].argmax())
print(
    f"best previous-token head: layer 1 head {prev_head + 1}; best induction head: layer 2 head {ind_head + 1} "
    "(counted from 1, as attnlab's pictures and --remove count them; the tensors count from 0)"
)

# %% [markdown]
# Their patterns on one probe sequence make the jobs visible: the previous-token head is a line just
# below the diagonal; the induction head, in the second half, a line $n - 1$ positions back from the
# diagonal, landing on the token after the earlier copy.

# %%
patterns = t["blocks.0.attn.hook_pattern"][0, prev_head], t["blocks.1.attn.hook_pattern"][0, ind_head]
fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
for ax, pattern, title in zip(
    axes, patterns, (f"layer 1 head {prev_head + 1}: previous token", f"layer 2 head {ind_head + 1}: induction")
):
    ax.imshow(pattern, cmap="Blues")
    ax.axvline(half - 0.5, color="red", lw=0.6)
    ax.axhline(half - 0.5, color="red", lw=0.6)
    ax.set(title=title, xlabel="key position", ylabel="query position")
show(fig)

# %% [markdown]
# ## The logit lens
#
# The residual stream after each layer can be read as if it were the last: pass it through the final
# norm and the output head (nostalgebraist 2020). `logit_lens` does that for every layer and position and
# reports the top next token and its probability, and the probability given to the true next token. In
# our model the answer on the repeated half should appear only after layer 2, where the induction head
# writes it; after the embedding and after layer 1 nothing predicts it. (The embedding row confidently
# "predicts" the input token itself: the output head is the embedding matrix, tied, and a token's vector
# scores highest against itself. Layer 1 has moved each position toward its previous token.)

# %%
from attnlab.interpret.lens import logit_lens, plot_lens

lens = logit_lens(model, probe[:1])
path = PICTURES / "lens.png"
plot_lens(lens, path)
show_file(path)
target = lens.target_prob  # (layers + 1, T - 1): probability of the token that actually came next
for name, row in zip(lens.layers, target):
    print(
        f"{name:8}: mean p(next token) first half {row[: half - 1].mean():.3f}, repeated half {row[half:].mean():.3f}"
    )

# %% [markdown]
# ## Ablation: take a head out
#
# The detectors say what a head attends to; ablation says whether the model needs it. attnlab's hook
# points let us replace any activation during a forward pass: `attnlab.hooks(model, {name: fn})` and
# `attnlab.zero_head(h)`, which zeroes head $h$'s output before the output projection, removing exactly its
# contribution. `head_ablation` does that for every head in turn and returns the rise of the loss.

# %%
from attnlab.interpret.ablation import head_ablation


def probe_loss():
    return torch.tensor(repeat_loss(model(probe), probe, half))


with torch.no_grad(), attnlab.hooks(model, {"blocks.1.attn.hook_head_out": attnlab.zero_head(ind_head)}):
    print(
        f"repeated-half loss {probe_loss():.3f} with layer 2 head {ind_head + 1} zeroed, against "
        f"{history['repeat_loss'][-1]:.3f} with every head"
    )

rise = head_ablation(model, probe_loss)  # (L, H): loss with the head zeroed minus the loss with all heads
mean_rise = head_ablation(model, probe_loss, inputs=(probe,), mode="mean")  # replaced by its mean instead
fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
for ax, table, title in zip(axes, (rise, mean_rise), ("zero-ablation", "mean-ablation")):
    bound = float(table.abs().max())
    ax.imshow(table, cmap="RdBu_r", vmin=-bound, vmax=bound)
    for layer in range(2):
        for head in range(HEADS):
            ax.text(head, layer, f"{table[layer, head]:+.2f}", ha="center", va="center")
    ax.set(
        title=f"{title}: loss rise (nats)",
        xlabel="head",
        ylabel="layer",
        xticks=range(HEADS),
        xticklabels=HEAD_LABELS,
        yticks=[0, 1],
        yticklabels=[1, 2],
    )
show(fig)

# %% [markdown]
# The previous-token head usually costs the most when removed: every induction head reads what it
# wrote. (README's longer run on attnlab's `repeats` corpus, `python benchmarks/induction_heads.py`,
# shows the same circuit in a model trained for 3,000 steps: `attnlab inspect RUN --what ablate`.)
#
# ## Exercises
#
# **1.** Write the previous-token detector: patterns (L, H, T, T) -> (L, H), the weight each query $t$
# puts on key $t - 1$, averaged over the queries $t = 1, \dots, T-1$.

# %%
from checks.inside import check_induction, check_previous_token, check_zero_head


def my_previous_token(patterns):
    raise NotImplementedError  # your code


check_previous_token(my_previous_token)

# %% [markdown]
# **2.** Write the induction detector: on a sequence whose second half (from position `half`) repeats the
# first, the weight each query $t \ge \text{half}$ puts on key $t - \text{half} + 1$, averaged over those queries.


# %%
def my_induction(patterns, half):
    raise NotImplementedError  # your code


check_induction(my_induction)

# %% [markdown]
# **3.** Write a hook that zeroes one head: `my_zero_head(h)` returns a function of the heads' outputs
# (B, H, T, Dh) that returns them with head $h$ set to 0. Use it with `attnlab.hooks` on
# `"blocks.0.attn.hook_head_out"` and `prev_head`: how much does the repeated half's loss rise?


# %%
def my_zero_head(head):
    raise NotImplementedError  # your code


check_zero_head(my_zero_head)

# %% [markdown]
# **4.** (open) Train with a fixed copy length (`n = 11` every batch) and run the detectors again. The
# induction score may be just as high, yet test the model on repeats of length 8: does it still copy?
# A head can pass a detector by looking a fixed distance back, which is why attnlab's `repeats` corpus
# moves its copies around.
