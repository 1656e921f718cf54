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
# # Lesson 11: finding the mechanism
#
# Lesson 8 looked inside a model: attention pictures, head detectors, ablation. Pictures say where the
# model looks; they do not say which activations *carry* an answer, nor what a layer's activations
# *mean*. This lesson takes four steps that interpretability research takes today:
#
# 1. **Superposition**: a layer can hold more features than it has dimensions, if they are sparse.
# 2. **A sparse autoencoder (SAE)** splits activations back into those features, without labels; a
#    linear probe, which needs labels, is the baseline beside it.
# 3. **Patching** copies one activation from a clean run into a corrupted one and measures what comes
#    back: it finds the induction circuit of lesson 8 causally, and attribution patching (AtP)
#    estimates the same from one backward pass.
# 4. **An attribution graph** freezes attention on one prompt and splits the answer's logit into
#    exact contributions of each input position (and, in a model with MLPs, of transcoder features).
#
# Everything runs in about 20 seconds of one CPU core (a 2-core AMD EPYC), with attnlab's own
# `sae`, `patching`, `attribution` and `circuits` modules: the ones `attnlab sae`, `attnlab patch` and
# `attnlab circuits` use on real runs.

# %%
SCALE = 1
SAE_TOKENS = 200_000 * SCALE  # synthetic activations the SAE trains on
STEPS = 600 * SCALE  # training steps of the induction model (lesson 8's recipe)
MAP_STEPS = 300 * SCALE  # training steps of the MLPs added in section 4
VOCAB, CONTEXT, WIDTH, HEADS = 32, 32, 64, 4

import dataclasses

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from pictures import show
from sklearn.linear_model import LogisticRegression

import attnlab
from attnlab.interpret.attribution import attribution_patching
from attnlab.interpret.circuits import attribute
from attnlab.interpret.circuits_check import intervention_check, total_effects
from attnlab.interpret.circuits_graph import normalised, scores
from attnlab.interpret.detectors import head_scores, repeated_tokens
from attnlab.interpret.patching import activation_patching
from attnlab.interpret.sae import SAEConfig, SparseAutoencoder
from attnlab.interpret.sae_synthetic import SyntheticConfig, SyntheticFeatures, mcc
from attnlab.interpret.sae_train import fit
from attnlab.interpret.transcoder import Transcoder, mlp_blocks
from attnlab.nn.hooks import hooks

torch.set_num_threads(1)  # tiny models: one thread is fastest
torch.manual_seed(0)

# %% [markdown]
# ## 1. Superposition
#
# Take 32 features (directions) in a 16-dimensional space. 32 directions cannot all be orthogonal in
# 16 dimensions, so they interfere: reading one feature's direction picks up a little of the others.
# If features are **sparse** (each fires in 1 sample of 16, so about 2 at a time), the interference
# rarely matters, and a network can afford to pack more features than dimensions. That is the
# superposition hypothesis (Elhage et al. 2022, "Toy Models of Superposition").
#
# `SyntheticFeatures` draws such activations: each sample is the sum of the features that fire, each
# with a magnitude between 0.5 and 1.5. We know the true features, so we can check what an SAE finds.

# %%
world = SyntheticConfig(features=32, dim=16, p=1 / 16, seed=1)
data = SyntheticFeatures(world)
true = data.features  # (F, D) = (32, 16), unit rows
cos = true @ true.t()  # (F, F)
off = cos - torch.eye(len(cos))
print(
    f"{len(true)} features in {true.shape[1]} dimensions; the largest |cos| between two: {off.abs().max():.2f}, "
    f"mean {off.abs().sum() / (len(cos) ** 2 - len(cos)):.2f}"
)

fig, ax = plt.subplots(figsize=(4.2, 3.6))
im = ax.imshow(cos, cmap="RdBu_r", vmin=-1, vmax=1)
ax.set_title("cosines between the 32 true features")
ax.set_xlabel("feature")
ax.set_ylabel("feature")
fig.colorbar(im, ax=ax)
show(fig)

# %% [markdown]
# ## 2. A sparse autoencoder finds them, and a probe beside it
#
# An SAE with $N$ latents (here 64, more than the 32 features) encodes an activation $x$ into codes
# $z = \mathrm{TopK}(x W_{enc} + b_{enc})$, at most $k$ of them non-zero, and decodes
# $\hat x = z W_{dec} + b_{dec}$, each decoder row a unit direction. Trained to reconstruct $x$ with
# $k = 2$, its decoder rows should line up with the true features. `mcc` pairs each true feature with
# one decoder row (Hungarian matching) and averages their cosines: 1 is perfect.

# %%
sae = SparseAutoencoder(
    world.dim, SAEConfig(latents=64, k=2, tokens=SAE_TOKENS, batch=1024, lr=1e-2, aux_k=8, dead_after=50_000)
)
info = fit(sae, data.batches(1024), progress=False)
learned = sae.W_dec.detach()  # (N, D)
print(f"mcc {mcc(true, learned):.3f} after {info['steps']} steps of 1,024 samples")


def with_labels(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples (n, D) and which features fire in each (n, F) bool."""
    rows, cols = data.active(n)
    x = torch.zeros(n, world.dim).index_add_(0, rows, (0.5 + torch.rand(len(rows), 1)) * true[cols])
    on = torch.zeros(n, world.features, dtype=torch.bool)
    on[rows, cols] = True
    return x, on


x_train, on_train = with_labels(4000)
x_test, on_test = with_labels(4000)
with torch.no_grad():
    z = sae.encode(x_test)  # (n, N) codes
latent = int((learned @ true[0]).argmax())  # the decoder row closest to feature 0


def balanced_accuracy(predicted: torch.Tensor, truth: torch.Tensor) -> float:
    return 0.5 * (float(predicted[truth].float().mean()) + float((~predicted[~truth]).float().mean()))


probe = LogisticRegression(class_weight="balanced", max_iter=1000).fit(x_train.numpy(), on_train[:, 0].numpy())
probe_dir = torch.tensor(probe.coef_[0], dtype=torch.float32)
print(
    f"feature 0: SAE latent {latent} (cos with the true direction {float(learned[latent] @ true[0]):.3f}), "
    f"balanced accuracy {balanced_accuracy(z[:, latent] > 0, on_test[:, 0]):.3f}, no labels used"
)
print(
    f"feature 0: linear probe (cos {float(F.cosine_similarity(probe_dir, true[0], dim=0)):.3f}), balanced "
    f"accuracy {balanced_accuracy(torch.tensor(probe.predict(x_test.numpy())), on_test[:, 0]):.3f}, "
    f"{int(on_train[:, 0].sum())} labelled positives used"
)

# %% [markdown]
# The probe is a strong baseline for one feature you already know to look for: give it labels and it
# finds a direction that separates them, usually classifying better than the SAE's latent. But its
# direction is not the feature's: it leans on whatever else separates the labels (the other features
# that interfere), while the SAE's decoder row is the feature itself. And the SAE had no labels and
# found all 32 at once, which is what makes it a tool for discovery. On real models the proxy metrics
# (reconstruction, sparsity) are measured as `explained_variance` and `ce_loss_recovered` (exercises 1
# and 2); `attnlab sae train` reports them.
#
# ## 3. Patching finds the induction circuit
#
# Lesson 8's recipe: a 2-layer attention-only GPT trained on random tokens written twice learns an
# **induction head** (layer 2) that reads a **previous-token head** (layer 1): at the second "... A",
# predict what followed the first "A". We train it again (about 6 s).

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


def train(net: attnlab.GPT, steps: int, answers=None, seed: int = 0) -> float:
    """AdamW on random tokens written twice; answers(next tokens (B, T), n) -> targets, -1 where unscored."""
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1 + seed)
    for step in range(1, steps + 1):
        n = int(torch.randint(6, 17, (1,), generator=generator))
        ids, _ = repeated_tokens(VOCAB, n, batch=32, seed=step + seed)
        _, loss = net(ids[:, :-1], ids[:, 1:] if answers is None else answers(ids[:, 1:], n))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


model = attnlab.GPT(cfg)
train(model, STEPS)
model.eval()
probe_ids, half = repeated_tokens(VOCAB, 11, batch=16, seed=123)
found = head_scores(attnlab.trace(model, probe_ids).patterns(), probe_ids, half)
print("induction score of each head (rows: layers):\n", found["induction"].numpy().round(2))

# %% [markdown]
# The clean prompt: 11 random tokens, then the same again up to (and including) the 6th; the answer is
# the 7th, which only induction predicts. The corrupted prompt changes one token: the 6th token's
# **first** occurrence, so the induction head finds no earlier copy of it. The metric is the answer's
# log-probability. Patching a site (a layer's residual stream at one position, or one head's output)
# from clean into corrupted gives its **effect**,
# $(m_\text{patched} - m_\text{corrupt}) / (m_\text{clean} - m_\text{corrupt})$: 1 when that site alone
# carries what the corruption changed (exercise 3).

# %%
seq, _ = repeated_tokens(VOCAB, 11, batch=1, seed=7)  # (1, 22)
k = 5  # the prompt ends at the repeat of token k; the answer is token k + 1
clean = seq[:, : 11 + k + 1]  # (1, 17)
answer = int(seq[0, k + 1])
corrupted = clean.clone()
corrupted[0, k] = (corrupted[0, k] + 1) % VOCAB  # the first occurrence of the last token, changed
while bool((corrupted[0, k] == clean[0]).any()):  # a token not already in the prompt
    corrupted[0, k] = (corrupted[0, k] + 1) % VOCAB


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].log_softmax(-1)[:, answer]  # (B,)


act = activation_patching(model, (clean,), (corrupted,), metric)
atp = attribution_patching(model, (clean,), (corrupted,), metric)
print(f"log p(answer): clean {act.clean:.2f}, corrupted {act.corrupted:.2f}")

fig, axes = plt.subplots(1, 4, figsize=(14, 2.8), gridspec_kw={"width_ratios": [3, 3, 1.2, 1.2]})
for ax, result, name in ((axes[0], act, "activation patching"), (axes[1], atp, "AtP")):
    grid = result.grid("resid", "resid_pre", "blocks")  # (L, T): each layer's input stream by position
    ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_title(f"{name}: residual stream")
    ax.set_xlabel("position")
    ax.set_yticks(range(len(grid)), [f"into layer {i + 1}" for i in range(len(grid))] if ax is axes[0] else [])
for ax, result, name in ((axes[2], act, "heads (activation)"), (axes[3], atp, "heads (AtP)")):
    ax.imshow(result.grid("heads", "head", "blocks"), cmap="RdBu_r", vmin=-1, vmax=1)  # (L, H)
    ax.set_title(name)
    ax.set_xticks(range(HEADS), range(1, HEADS + 1))
    ax.set_yticks(range(2), ["layer 1", "layer 2"] if ax is axes[2] else [])
show(fig)
for result in (act, atp):
    print(
        f"effect of each head, {result.method} (rows: layers):\n",
        result.grid("heads", "head", "blocks").numpy().round(2),
    )

# %% [markdown]
# Read it as a story. At the corrupted position ($k$) the residual stream carries the whole effect into
# layer 1; at the next position ($k + 1$), into layer 2: the previous-token head has copied token $k$
# into position $k + 1$'s stream, where the induction head finds it. By head, one layer-1 head (the
# previous-token head) and the layer-2 induction heads carry the effect.
#
# AtP estimates every site from one forward and one backward pass instead of one forward pass per site
# (exercise 4). It gets the layer-2 heads about right, and misses the layer-1 head and the residual
# stream at $k$ and $k + 1$. Their effect runs through the induction head's *attention pattern*: in the
# corrupted run nothing matches, the softmax sits far from the clean answer's key, and its gradient
# there says almost nothing about what patching the key would do. This is AtP's known blind spot
# (Kramár et al. 2024 fix it by recomputing the attention, "AtP*"): use AtP to find candidates at once,
# then check them with activation patching.
#
# ## 4. An attribution graph
#
# Freeze every attention pattern (and every norm's scale) at its value on the clean prompt. The model is
# then **linear** in what enters it, so the answer's logit (minus the mean logit) splits exactly into
# one share per position's embedding, plus a constant. `attribute` computes those shares by
# backpropagating through the frozen model. A model with MLPs gets a transcoder per layer (an SAE from
# the MLP's input to its output), and then features join the graph; this model has no MLP, so its graph
# holds the embeddings alone. A model with MLPs follows.

# %%
graph = attribute(model, clean, answer, tcs=[])
s = graph.nodes.slices()
shares = graph.adjacency[s["logit"].start, s["embeddings"]]  # (T,): each position's edge into the logit
replacement = scores(graph, normalised(graph.adjacency))["replacement_score"]
print(
    f"logit - mean logit {float(graph.value[s['logit']][0]):.3f} = sum of the shares {float(shares.sum()):.3f} "
    f"+ bias {float(graph.bias[s['logit']][0]):.3f} (gap {graph.linearity_gap():.1e}); replacement score "
    f"{replacement:.2f}"
)

fig, ax = plt.subplots(figsize=(8, 2.4))
colors = ["tab:red" if i in (k + 1,) else "tab:orange" if i == k else "tab:gray" for i in range(len(shares))]
ax.bar(range(len(shares)), shares, color=colors)
ax.set_xticks(range(len(shares)), [str(int(t)) for t in clean[0]])
ax.set_xlabel("the prompt's tokens (orange: token k's first occurrence; red: the answer's)")
ax.set_title("each position's share of the answer's logit, attention frozen")
show(fig)

# %% [markdown]
# The biggest share should sit on the answer's **first occurrence** (position $k + 1$, red): the
# induction head, frozen on this prompt, copies that token's embedding to the last position. Patching
# needed a corrupted prompt to say which site matters; the graph splits the clean run's own logit. On a
# model with MLPs, `attnlab circuits RUN --prompt TEXT --out DIR` trains the transcoders and draws the
# whole graph (docs/circuits.md).


# %% [markdown]
# One ablation tests the graph. Its prediction for removing a source is minus that source's share:
# exact in the frozen model, and only a guess in the real one, where attention moves. Zero the
# embedding at the answer's first occurrence (position $k + 1$) in the real model, attention
# recomputed, and see whether the logit moves the way the graph says; then the same for the position
# whose share is most negative.


# %%
def logit_gap(ids: torch.Tensor, zero_at: int | None = None) -> float:
    """logit(answer) - mean logit at the last position, with one position's embedding zeroed."""
    zero = lambda x: x.index_fill(1, torch.tensor([zero_at]), 0.0)  # (1, T, C) with one row zeroed
    edit = {} if zero_at is None else {"blocks.0.hook_resid_pre": zero}
    with torch.no_grad(), hooks(model, edit):
        logits = model(ids)[0, -1]  # (V,)
    return float(logits[answer] - logits.mean())


base = logit_gap(clean)
for pos in (k + 1, int(shares.argmin())):
    real = logit_gap(clean, pos) - base
    print(
        f"zero position {pos}'s embedding: the graph predicts {-float(shares[pos]):+.2f}, the real model "
        f"moves {real:+.2f} (the sign is {'right' if real * float(shares[pos]) < 0 else 'wrong'})"
    )

# %% [markdown]
# ### Features: a model with MLPs
#
# Induction needs no MLP (with relu MLPs the recipe above learned no induction head in 1,500 steps, and
# MLPs added to the trained model stayed idle). So give the model a job that needs one: after
# "A B ... A", answer not B but `shuffle[B]`, a fixed permutation of the vocabulary. Add a relu MLP to
# each block of the trained model, its output starting at zero (the model starts as it was), freeze
# everything else and train only the MLPs: the induction head still fetches B, and an MLP must turn it
# into `shuffle[B]`. (Left free, the induction head's own output matrix learns the permutation and the
# MLPs stay idle.)
#
# A relu MLP *is* a transcoder with a feature per neuron (encoder $W_1, b_1$; decoder $W_2, b_2$), so
# here the transcoders are the MLPs themselves and the graph is exact; on real runs `train_transcoders`
# learns sparser ones and error nodes hold what they miss (docs/circuits.md).

# %%
shuffle = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))
mapper = attnlab.GPT(dataclasses.replace(cfg, feedforward="mlp", activation="relu", d_ff=64))
mapper.load_state_dict(model.state_dict(), strict=False)  # everything but the new MLPs
for name, p in mapper.named_parameters():
    p.requires_grad_(".ff." in name)  # train the MLPs alone
for block in mlp_blocks(mapper):
    torch.nn.init.zeros_(block.ff.down.weight), torch.nn.init.zeros_(block.ff.down.bias)
loss = train(mapper, MAP_STEPS, lambda nxt, n: shuffle[nxt].index_fill(1, torch.arange(n), -1), seed=1000)
mapper.eval()


tcs = [Transcoder.of_mlp(block.ff) for block in mlp_blocks(mapper)]  # each MLP as the transcoder it already is
target = int(shuffle[answer])
graph2 = attribute(mapper, clean, target, tcs)
n = graph2.nodes
effects = total_effects(graph2)  # (features,): each feature's effect on the logit, through every path
top = effects.abs().argsort(descending=True)[:10]
names = [f"L{int(n.layer[j]) + 1} pos {int(n.pos[j])} #{int(n.index[j])}" for j in top]
with torch.no_grad():
    guess = int(mapper(clean)[0, -1].argmax())
print(
    f"after {MAP_STEPS} steps, loss {loss:.2f}; top guess {guess}, shuffle[B] = {target}; {n.n_features} active "
    f"features, gap {graph2.linearity_gap():.1e}"
)

fig, ax = plt.subplots(figsize=(8, 2.6))
ax.bar(range(len(top)), effects[top], color=["tab:blue" if e > 0 else "tab:red" for e in effects[top]])
ax.set_xticks(range(len(top)), names, rotation=30, ha="right", fontsize=8)
ax.set_title(f"the 10 features of most effect on the logit of shuffle[B] = {target}")
show(fig)

# %% [markdown]
# The features that drive `shuffle[B]` should sit in layer 2 at the last position: the MLP reading what
# the induction head fetched. The graph predicts what removing each does (minus its total effect);
# `intervention_check` removes the five of most effect, one at a time, from the real model (nothing
# frozen), and counts the signs it got right.

# %%
check = intervention_check(mapper, graph2, tcs, effects.abs(), top=5)
for row in check["features"]:
    print(
        f"L{row['layer'] + 1} pos {row['pos']} #{row['feature']}: predicted {row['predicted']:+.2f}, "
        f"real {row['real']:+.2f}"
    )
print(f"signs right in the real model: {check['real_right']:.0%}")

# %% [markdown]
# ## Exercises
#
# **1.** Explained variance of a reconstruction: activations `x` $(n, D)$ and their reconstruction
# `x_hat` $(n, D)$ -> $1 - \sum (x - \hat x)^2 / \sum (x - \bar x)^2$, with $\bar x$ the mean activation
# (over the $n$ samples, per dimension).

# %%
from checks.mechanisms import (
    check_atp,
    check_ce_loss_recovered,
    check_explained_variance,
    check_induction_head,
    check_patching_effect,
)


def my_explained_variance(x, x_hat):
    raise NotImplementedError  # your code


check_explained_variance(my_explained_variance)

# %% [markdown]
# **2.** CE loss recovered: the model's loss with the layer as it is (`clean`), with the SAE's
# reconstruction spliced in (`sae`), and with the layer zeroed (`zero`) -> the share of the loss the
# zeroing cost that the SAE gets back.


# %%
def my_ce_loss_recovered(clean, sae, zero):
    raise NotImplementedError  # your code


check_ce_loss_recovered(my_ce_loss_recovered)

# %% [markdown]
# **3.** The effect of a patched site from the three metrics: `patched` (the corrupted run with the
# site patched), `clean` and `corrupt`.


# %%
def my_patching_effect(patched, clean, corrupt):
    raise NotImplementedError  # your code


check_patching_effect(my_patching_effect)

# %% [markdown]
# **4.** AtP for one activation $(T, C)$: its clean value, its corrupted value and the metric's gradient
# with respect to it in the corrupted run -> the estimated change of the metric when each position is
# patched, $(T,)$: the first-order Taylor term, summed over the $C$ channels.


# %%
def my_atp(clean_act, corrupt_act, grad):
    raise NotImplementedError  # your code


check_atp(my_atp)


# %% [markdown]
# **5.** Read the induction head off the pictures: the head-effect grid $(L, H)$ of activation patching
# and the detector's induction scores $(L, H)$ -> `(layer, head)`, counted from 0, of the head that the
# detector flags (score above 0.5) and that carries the largest effect. (Why not simply the largest
# effect? Look at the grid of section 3.) Try yours on `act.grid("heads", "head", "blocks")` and
# `found["induction"]`.


# %%
def my_induction_head(effects, induction):
    raise NotImplementedError  # your code


check_induction_head(my_induction_head)
