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
# # Lesson 7: today's blocks and mixtures of experts
#
# The block of GPT-2 (learned positions, LayerNorm, a GELU feed-forward, one key and value per head)
# has been changed piece by piece in the open models people run today (Llama, Mistral, Mixtral, Gemma).
# Each change is small and each has a reason. This lesson takes them one at a time, with attnlab's own
# parts from `attnlab.nn`: rotary and ALiBi positions, RMSNorm, the gated SwiGLU feed-forward,
# grouped-query attention and its smaller key/value cache, and a mixture of experts whose router we
# train and then watch choosing.
#
# In attnlab each part is one config field of every family (`--positions rope`, `--norm-kind rmsnorm`,
# `--feedforward swiglu`, `--n-kv-head 2`, `--feedforward moe`); the preset `llama-nano` combines the
# first four.

# %%
SCALE = 1
MOE_STEPS = 150 * SCALE  # training steps of the tiny mixture of experts
MOE_WIDTH = 64 if SCALE == 1 else 128
CONTEXT = 64

import os
import string

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from pictures import show

from attnlab.nn import attend
from attnlab.nn.position import ALiBiPositions, RotaryPositions

torch.set_num_threads(1 if SCALE == 1 else os.cpu_count())  # tiny models: one thread is fastest
torch.manual_seed(0)


# %% [markdown]
# ## Rotary positions: distance inside the dot product
#
# GPT-2 adds a learned vector per position to each token. Rotary positions (RoPE, Su et al. 2021) add
# nothing. Inside every attention layer they turn each query and key: the head's $D_h$ features are
# taken as $D_h/2$ pairs, and pair $i$ at position $m$ is rotated by the angle $m\,\theta^{-2i/D_h}$. A rotation
# by angle $a$ followed by the dot product with a vector rotated by $b$ only sees $a - b$, so the score of
# query $m$ and key $n$ depends on their contents and on $m - n$: **relative** position, for free.
#
# The first check below: the same query and key placed at positions (3, 1) and at (103, 101) give the
# same score. The picture: a query scoring copies of itself at growing distance. The score falls off
# with distance (the slow pairs turn little, the fast ones average out), and a larger base $\theta$
# (Llama 3: 500,000) keeps it high for longer, which is how long-context models stretch their reach.

# %%
D_HEAD, T = 64, 512
q = torch.randn(1, 1, 1, D_HEAD)  # (B, H, T, Dh): one query vector
rope = RotaryPositions(max_len=T)


def score_at(m, n, vector=q):
    """The score of the same content as a query at position m and a key at position n."""
    qm, _ = rope.qk_transform(vector, vector, m)
    _, kn = rope.qk_transform(vector, vector, n)
    return (qm * kn).sum().item()


print(
    f"score at (3, 1): {score_at(3, 1):.4f}   at (103, 101): {score_at(103, 101):.4f}   at (3, 3): {score_at(3, 3):.4f}"
)

vectors = torch.randn(200, 1, T, D_HEAD) / D_HEAD**0.5  # 200 contents, each repeated at every position
vectors = vectors[:, :, :1].expand(-1, -1, T, -1)
for theta in (10_000.0, 500_000.0):
    turned, _ = RotaryPositions(T, theta=theta).qk_transform(vectors, vectors, 0)  # (200, 1, T, Dh)
    scores = (turned[:, 0, :1] * turned[:, 0]).sum(-1).mean(0)  # query at 0 against keys at 0..T-1
    plt.plot(scores, label=f"theta = {theta:,.0f}")
plt.xscale("symlog")
plt.xlabel("distance between query and key (positions)")
plt.ylabel("mean score of a vector with itself")
plt.title("rotary positions: the same content scores less far away")
plt.legend()
show()

# %% [markdown]
# ## ALiBi: a penalty that grows with distance
#
# ALiBi (Press et al. 2022) is simpler still: head $h$ subtracts $\text{slope}_h \cdot \lvert i - j \rvert$ from
# the score of query $i$ for key $j$. The slopes form a geometric series, $2^{-8/H}, 2^{-16/H}, \dots$, so one
# head sees only the last few tokens and another far back. Because the bias depends on the distance alone, a model
# trained on short sequences still behaves on longer ones. Below: the bias of 8 heads against distance, and
# what it does to a query whose content scores every key alike: each head's attention over the keys
# behind it.

# %%
HEADS, T_ALIBI = 8, 48
alibi = ALiBiPositions(T_ALIBI, n_heads=HEADS)
bias = alibi.score_bias(T_ALIBI, T_ALIBI)  # (1, H, T, T)
print("slopes:", [round(s, 4) for s in alibi.slopes.tolist()])
flat = torch.zeros(1, HEADS, T_ALIBI, 8)  # queries and keys of no content: every raw score is 0
_, weights = attend(flat, flat, torch.zeros(1, HEADS, T_ALIBI, 8), bias=bias, causal=True, return_weights=True)

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
distance = np.arange(T_ALIBI)
for h in range(HEADS):
    left.plot(distance, bias[0, h, -1].flip(0), label=f"head {h + 1}")
    right.plot(distance, weights[0, h, -1].flip(0), label=f"head {h + 1}")
left.set(xlabel="distance back from the query", ylabel="bias added to the score", title="ALiBi's bias per head")
right.set(xlabel="distance back from the query", ylabel="attention weight", title="the last query's attention")
right.legend(fontsize=7, ncol=2)
show(fig)

# %% [markdown]
# ## RMSNorm: LayerNorm without the mean
#
# LayerNorm centres each token's vector (subtracts its mean), divides by its standard deviation, then
# scales and shifts by learned gain and bias. RMSNorm (Zhang and Sennrich 2019) skips the centring and
# the bias: it divides by the root mean square, $\sqrt{\operatorname{mean}(x^2) + \epsilon}$, and scales. It is cheaper,
# has half the parameters, and trains as well in practice. The difference shows on a vector with an
# offset: LayerNorm takes the offset away, RMSNorm keeps its direction.

# %%
from attnlab.nn.norm import LayerNorm, RMSNorm

x = torch.randn(4, 16) + 3  # four tokens of width 16, all shifted up by 3
layer_norm, rms_norm = LayerNorm(16), RMSNorm(16)
for name, norm in (("LayerNorm", layer_norm), ("RMSNorm", rms_norm)):
    y = norm(x).detach()
    assert torch.allclose(y, norm.forward_math(x).detach(), atol=1e-5)  # the fused kernel is the formula
    params = sum(p.numel() for p in norm.parameters())
    print(
        f"{name:9}  mean per token {y.mean(-1).numpy().round(2)}  rms {y.square().mean(-1).sqrt().numpy().round(2)}"
        f"  parameters {params}"
    )

# %% [markdown]
# ## SwiGLU: a gated feed-forward
#
# The feed-forward of GPT-2 is $\operatorname{act}(x W_1) W_2$. The gated variants (Shazeer 2020) multiply two
# projections elementwise, one of them through the activation: $(\operatorname{silu}(x W_\text{gate}) \odot x W_1)
# W_2$, with $\operatorname{silu}(z) = z \, \sigma(z)$.
# The gate lets each hidden unit scale, or switch off, what the other projection carries. Three matrices
# instead of two, so the hidden width is cut to $8/3$ of $d_\text{model}$ (rounded up to a multiple of 8) to keep
# the parameter count: attnlab's `default_width` does that.

# %%
from attnlab.nn import FeedForward, GatedFeedForward, default_width

d = 96
mlp = FeedForward(d, default_width("mlp", d), activation="gelu", bias=False)
swiglu = GatedFeedForward(d, default_width("swiglu", d), activation="silu")
x = torch.randn(2, 5, d)
by_hand = (F.silu(x @ swiglu.gate.weight.T) * (x @ swiglu.up.weight.T)) @ swiglu.down.weight.T
print("SwiGLU by hand == attnlab:", torch.allclose(by_hand, swiglu(x), atol=1e-5))
for name, ff in (("MLP (GELU), 4d", mlp), ("SwiGLU, 8d/3", swiglu)):
    hidden = ff.up.out_features
    print(f"{name:15} hidden width {hidden:4}  parameters {sum(p.numel() for p in ff.parameters()):,}")

z = torch.linspace(-4, 3, 200)
for name, f in (("relu", F.relu), ("gelu", F.gelu), ("silu (the gate)", F.silu)):
    plt.plot(z, f(z), label=name)
plt.axhline(0, color="gray", lw=0.5)
plt.legend()
plt.title("activations: silu is smooth and lets a little negative through")
show()

# %% [markdown]
# ## Grouped-query attention and the KV cache
#
# When a model generates, it keeps the keys and values of every token so far (the KV cache), per layer
# and per head. At long contexts that cache, not the weights, fills the memory. Grouped-query attention
# (GQA, Ainslie et al. 2023) lets several query heads share one key/value head: with $H$ query heads and
# $G$ key/value heads the cache shrinks by $H/G$, while every query head still has its own pattern.
# Multi-query attention is $G = 1$. Below, attnlab's `MultiHeadAttention` with 8 query heads and 8, 4, 2
# or 1 key/value heads decodes 100 tokens into a `KVCache`; we measure what the cache holds.

# %%
from attnlab.nn import Context, KVCache, MultiHeadAttention

tokens = torch.randn(1, 100, 256)  # (B, T, C)
for kv_heads in (8, 4, 2, 1):
    attn = MultiHeadAttention(256, n_heads=8, n_kv_heads=kv_heads, causal=True)
    cache = KVCache()
    with torch.no_grad():
        for t in range(tokens.shape[1]):  # one token at a time, as generation does
            attn(tokens[:, t : t + 1], Context(offset=t), cache)
    kv_bytes = (cache.k.numel() + cache.v.numel()) * cache.k.element_size()
    print(
        f"{kv_heads} key/value heads: cache keys {tuple(cache.k.shape)}, {kv_bytes / 1024:.0f} KiB, "
        f"attention parameters {sum(p.numel() for p in attn.parameters()):,}"
    )

# %% [markdown]
# The same arithmetic at the size of a 7-billion-parameter model (32 layers, 32 heads of 128, bf16 = 2
# bytes a number): the cache of one 4,096-token conversation, for each number of key/value heads.

# %%
layers, d_head, context = 32, 128, 4096
kv_heads = [32, 8, 4, 1]
gib = [2 * layers * g * d_head * context * 2 / 2**30 for g in kv_heads]  # keys and values
plt.bar([f"{g} kv heads" + (" (MHA)" if g == 32 else " (MQA)" if g == 1 else "") for g in kv_heads], gib)
for i, v in enumerate(gib):
    plt.text(i, v, f"{v:.2f} GiB", ha="center", va="bottom")
plt.ylabel("KV cache, GiB")
plt.title("one 4,096-token sequence, 32 layers x 32 query heads of 128, bf16")
show()

# %% [markdown]
# ## A mixture of experts, and its router
#
# A mixture-of-experts feed-forward holds $E$ feed-forwards (the experts) and a **router**, a linear map
# from the token's vector to $E$ scores. Each token goes through its top $k$ experts only, their outputs
# weighted by the router's softmax probabilities renormalised over the chosen $k$. Parameters grow with $E$
# while each token pays for $k$. Left alone, a router tends to send everything to a few experts; a small
# **load-balancing loss**, $E \sum_e f_e P_e$ ($f_e$ the share of tokens routed to $e$, $P_e$ its mean
# probability), equal to 1 when the load is even, pushes it to spread the tokens.
#
# We train a tiny GPT whose blocks use 4 experts, 2 per token, on Python source from the standard
# library, character by character, adding the balancing loss to the language-model loss ourselves
# (`attnlab.nn.aux_loss` collects it from every MoE layer; attnlab's trainer does the same).

# %%
import inspect
import json.decoder
import json.encoder
import textwrap as textwrap_module

from attnlab.data.tokenizers import train_tokenizer
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import aux_loss
from attnlab.nn.moe import moe_layers

text = "".join(inspect.getsource(m) for m in (json.decoder, json.encoder, textwrap_module))
tok = train_tokenizer("char", [text])
data = torch.tensor(tok.encode(text))
print(f"{len(text):,} characters, {tok.vocab_size} distinct")

moe_cfg = GPTConfig(
    n_layer=2,
    n_head=4,
    d_model=MOE_WIDTH,
    context=CONTEXT,
    vocab_size=tok.vocab_size,
    dropout=0.0,
    feedforward="moe",
    n_experts=4,
    experts_per_token=2,
    aux_loss_weight=0.01,
)
model = GPT(moe_cfg)
print(f"{model.num_params():,} parameters, {model.num_params(active=True):,} used per token")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
history = []
for _ in range(MOE_STEPS):
    starts = torch.randint(0, len(data) - CONTEXT - 1, (16,))
    x = torch.stack([data[s : s + CONTEXT] for s in starts])
    y = torch.stack([data[s + 1 : s + CONTEXT + 1] for s in starts])
    _, lm_loss = model(x, y)
    loss = lm_loss + aux_loss(model)  # the balancing term, weighted 0.01 per layer
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append([lm_loss.item()] + [m.aux.item() for m in moe_layers(model)])
history = np.array(history)
print(
    f"loss {history[:10, 0].mean():.2f} -> {history[-10:, 0].mean():.2f} nats/char; "
    f"balancing loss per layer at the end {history[-10:, 1:].mean(0).round(3).tolist()} (1.0 = even)"
)

# %% [markdown]
# Now route a piece of held-out text (the `csv` module's source) and count. Each MoE layer keeps what it
# chose on its last forward: `choice` (B, T, k), the experts of each token, best first. The bars are the
# share of first choices per expert in each layer; the table below splits them by kind of character.

# %%
import csv

sample = inspect.getsource(csv)[:4000]
ids = torch.tensor([tok.encode(sample)])
model.eval()
chosen = [[] for _ in moe_layers(model)]  # per layer: each window's first choices
with torch.no_grad():
    for start in range(0, ids.shape[1] - CONTEXT + 1, CONTEXT):
        model(ids[:, start : start + CONTEXT])
        for layer, moe in enumerate(moe_layers(model)):
            chosen[layer].append(moe.choice[0, :, 0])  # (T,) the first choice of each token
firsts = [torch.cat(c) for c in chosen]  # per layer: (T_total,)
chars = sample[: len(firsts[0])]

fig, axes = plt.subplots(1, len(firsts), figsize=(9, 3), sharey=True)
for layer, (ax, first) in enumerate(zip(axes, firsts)):
    counts = torch.bincount(first, minlength=4).float()
    ax.bar([f"expert {e}" for e in range(4)], counts / counts.sum())
    ax.set_title(f"layer {layer + 1}: first choices")
axes[0].set_ylabel("share of tokens")
show(fig)

kinds = {
    "space": " ",
    "newline": "\n",
    "letter": string.ascii_letters,
    "digit": string.digits,
    "punctuation": string.punctuation,
}
for layer, first in enumerate(firsts):
    print(f"layer {layer + 1}")
    for kind, members in kinds.items():
        picked = first[[i for i, c in enumerate(chars) if c in members]]
        share = torch.bincount(picked, minlength=4).float() / max(len(picked), 1)
        print(f"  {kind:12} ({len(picked):4} chars): experts {[round(v, 2) for v in share.tolist()]}")

# %% [markdown]
# Even after a few seconds of training the router is not random: kinds of character tend to go to
# their own experts (at `SCALE = 1` the split is rough; README's 2-minute `moe-nano` run sends every
# space to one expert and 98% of digits to another). attnlab draws the same routing over the text
# itself: `attnlab plot RUN --what experts` (or `attnlab.viz.experts.plot_routing`).
#
# ## Exercises
#
# **1.** Write RMSNorm: x (..., C), gain (C,), eps ->
# $x / \sqrt{\operatorname{mean}(x^2) + \text{eps}} \cdot \text{gain}$.

# %%
from checks.blocks import check_alibi, check_kv_cache_bytes, check_rmsnorm, check_rotate, check_top_k


def my_rmsnorm(x, gain, eps):
    raise NotImplementedError  # your code


check_rmsnorm(my_rmsnorm)

# %% [markdown]
# **2.** Write the rotary turn: x (T, Dh) at integer positions (T,) -> each pair of features
# $(i, i + D_h/2)$ turned by the angle $\phi = \text{pos} \cdot \theta^{-2i/D_h}$:
# $(a, b) \mapsto (a \cos\phi - b \sin\phi,\; b \cos\phi + a \sin\phi)$.


# %%
def my_rotate(x, positions, theta):
    raise NotImplementedError  # your code


check_rotate(my_rotate)

# %% [markdown]
# **3.** Write ALiBi's bias (H, T, T) for `n_heads` heads (a power of 2) and $T$ positions:
# $-\text{slope}_h \cdot \lvert i - j \rvert$ with $\text{slope}_h = 2^{-8(h+1)/H}$.


# %%
def my_alibi(n_heads, t):
    raise NotImplementedError  # your code


check_alibi(my_alibi)

# %% [markdown]
# **4.** Write the router's choice: logits (N, E), k -> (gates (N, k), experts (N, k)): the softmax over
# experts, the $k$ most probable (best first), gates renormalised to sum to 1. Then the KV cache's size in
# bytes for n_layer layers, n_kv_head key/value heads of d_head, `tokens` tokens, `bytes_per_number`.


# %%
def my_top_k(logits, k):
    raise NotImplementedError  # your code


def my_kv_bytes(n_layer, n_kv_head, d_head, tokens, bytes_per_number):
    raise NotImplementedError  # your code


check_top_k(my_top_k)
check_kv_cache_bytes(my_kv_bytes)
