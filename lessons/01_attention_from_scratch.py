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
# # Lesson 1: attention from scratch
#
# Attention lets every position of a sequence gather information from every other position, with
# weights it computes on the fly. In this lesson we write it with plain `torch` operations, piece by
# piece: queries, keys and values, the scaling, masks, several heads, and finally a whole Transformer
# block. At each step we check our numbers against attnlab's own implementation (`attnlab.nn`), which
# is what every model in attnlab is built from.
#
# `SCALE` below sets the sizes. At 1 the lesson runs in seconds on a laptop; raise it for wider
# vectors and longer sequences (nothing else changes).

# %%
SCALE = 1
D_MODEL = 32 * SCALE  # width of each token's vector
N_HEAD = 4  # attention heads
D_HEAD = D_MODEL // N_HEAD
T_EXTRA = 4 * (SCALE - 1)  # more tokens at larger scales

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from attnlab.nn import Block, BlockConfig, Context, MultiHeadAttention, attend, causal_mask

torch.manual_seed(0)
tokens = "the cat sat on the mat because it was warm".split()[: 6 + T_EXTRA] + ["."] * max(0, T_EXTRA - 4)
T = len(tokens)
x = torch.randn(T, D_MODEL)  # stand-ins for learned token embeddings: (T, C)
print(T, "tokens:", " ".join(tokens))


def show(weights, title, ax=None, labels=tokens):
    """A heatmap of attention weights: one row per query, one column per key."""
    ax = ax or plt.gca()
    ax.imshow(weights.detach(), cmap="Blues", vmin=0, vmax=max(float(weights.max()), 1e-6))
    ax.set_xticks(range(len(labels)), labels, rotation=90)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("key (looked at)")
    ax.set_ylabel("query (looking)")
    ax.set_title(title)


# %% [markdown]
# ## Queries, keys and values
#
# Each token plays three roles, each a linear map of its vector:
#
# - its **query** $q_i = x_i W_Q$ says what it is looking for,
# - its **key** $k_j = x_j W_K$ says what it offers to be found by,
# - its **value** $v_j = x_j W_V$ is what it hands over when found.
#
# Token $i$ scores every token $j$ by the dot product $q_i \cdot k_j$, turns the scores into weights
# that sum to 1 with a softmax, and takes the weighted average of the values:
#
# $$
# \operatorname{Attention}(Q, K, V) = \operatorname{softmax}\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
# $$
#
# The matrices here are random (training would learn them), so the pattern means nothing yet; the
# computation is the point.

# %%
W_q, W_k, W_v = (torch.randn(D_MODEL, D_HEAD) / math.sqrt(D_MODEL) for _ in range(3))
q, k, v = x @ W_q, x @ W_k, x @ W_v  # each (T, Dh)
scores = q @ k.T / math.sqrt(D_HEAD)  # (T, T): row i holds query i's score for every key
weights = scores.softmax(dim=-1)  # each row sums to 1
out = weights @ v  # (T, Dh): each token's weighted mix of values
print("weights row sums:", weights.sum(-1))
print("out:", tuple(out.shape))

ours, theirs = out, attend(q, k, v)[0]
assert torch.allclose(ours, theirs, atol=1e-6)
print("matches attnlab.nn.attend")
show(weights, "one head, random weights")
plt.show()

# %% [markdown]
# ## Why divide by the square root of the width?
#
# If the entries of $q$ and $k$ have variance 1, their dot product over $d_k$ dimensions has variance
# $d_k$. With wide heads the scores grow large, the softmax puts almost all weight on one key, and its
# gradient almost vanishes: learning stalls. Dividing by $\sqrt{d_k}$ brings the variance back to 1
# whatever the width. The picture shows the largest weight among 16 keys, averaged over many random
# queries, with and without scaling.

# %%
widths = [4, 16, 64, 256, 1024]
top = {"unscaled": [], "scaled": []}
for d in widths:
    qs, ks = torch.randn(500, d), torch.randn(500, 16, d)
    dots = torch.einsum("nd,nkd->nk", qs, ks)  # (500, 16)
    top["unscaled"].append(dots.softmax(-1).max(-1).values.mean().item())
    top["scaled"].append((dots / math.sqrt(d)).softmax(-1).max(-1).values.mean().item())
    print(f"d={d:5d}  std of q.k = {dots.std():6.1f}  (sqrt(d) = {math.sqrt(d):5.1f})")
for name, values in top.items():
    plt.plot(widths, values, marker="o", label=name)
plt.axhline(1 / 16, color="gray", linestyle=":", label="uniform (1/16)")
plt.xscale("log")
plt.xlabel("head width d")
plt.ylabel("mean largest weight")
plt.title("without scaling, the softmax saturates")
plt.legend()
plt.show()

# %% [markdown]
# ## Masks: who may look at whom
#
# A mask says which keys each query may see. attnlab's convention (the same as
# `torch.nn.functional.scaled_dot_product_attention`) is a boolean tensor where **True means "may
# look"**. A masked score is set to $-\infty$ before the softmax, so it gets weight exactly 0.
#
# - A **causal** mask lets position $i$ see only positions $j \le i$: a language model predicting
#   the next token must not peek at it.
# - A **padding** mask hides the filler tokens added to make sequences of a batch the same length.

# %%
causal = torch.ones(T, T).tril().bool()  # True on and below the diagonal
assert torch.equal(causal, causal_mask(T, T))

pad = torch.ones(T, dtype=torch.bool)
pad[-2:] = False  # pretend the last two tokens are padding
padding = pad[None, :] & pad[:, None]  # (T, T): padding neither looks nor is looked at

masked_weights = {}
for name, mask in {"causal": causal, "padding": padding}.items():
    s = scores.masked_fill(~mask, float("-inf"))
    w = torch.nan_to_num(s.softmax(-1))  # a row with every key masked gives NaN: make it 0
    masked_weights[name] = w
    ref_out, ref_w = attend(q, k, v, mask, return_weights=True)
    assert torch.allclose(w, ref_w, atol=1e-6) and torch.allclose(w @ v, ref_out, atol=1e-6)
print("masked weights and outputs match attnlab.nn.attend (fully masked rows are zero there too)")

fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
for ax, (name, w) in zip(axes, masked_weights.items()):
    show(w, f"{name} mask", ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Several heads
#
# One head computes one weighted average: it can look for one kind of thing at a time. Multi-head
# attention runs $H$ heads side by side, each with its own $W_Q, W_K, W_V$ of width
# $d_h = d_\text{model} / H$, concatenates their outputs and mixes them with one more matrix $W_O$.
# It costs the same as one wide head.
#
# In code the heads are one big matrix product followed by a reshape: `(T, H*Dh) -> (H, T, Dh)`.
# attnlab stores $W_Q, W_K, W_V$ of all heads stacked in one matrix `qkv_proj` (rows: all the
# queries' weights, then the keys', then the values'), so we can copy ours in and compare.

# %%
W_qkv = torch.randn(3 * D_MODEL, D_MODEL) / math.sqrt(D_MODEL)  # stacked, as nn.Linear stores it: (out, in)
b_qkv = torch.randn(3 * D_MODEL) * 0.1
W_o, b_o = torch.randn(D_MODEL, D_MODEL) / math.sqrt(D_MODEL), torch.randn(D_MODEL) * 0.1


def multi_head(x, W_qkv, b_qkv, W_o, b_o, mask=None):
    """x: (T, C) -> (T, C), and the weights (H, T, T)."""
    t = x.shape[0]
    q, k, v = (x @ W_qkv.T + b_qkv).split(D_MODEL, dim=-1)  # each (T, C)
    q, k, v = (m.view(t, N_HEAD, D_HEAD).transpose(0, 1) for m in (q, k, v))  # each (H, T, Dh)
    s = q @ k.transpose(-2, -1) / math.sqrt(D_HEAD)  # (H, T, T)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = s.softmax(-1)
    heads = w @ v  # (H, T, Dh)
    joined = heads.transpose(0, 1).reshape(t, D_MODEL)  # (T, H*Dh): heads side by side
    return joined @ W_o.T + b_o, w


mha = MultiHeadAttention(D_MODEL, N_HEAD, causal=True)
with torch.no_grad():
    mha.qkv_proj.weight.copy_(W_qkv)
    mha.qkv_proj.bias.copy_(b_qkv)
    mha.out_proj.weight.copy_(W_o)
    mha.out_proj.bias.copy_(b_o)

ours, our_w = multi_head(x, W_qkv, b_qkv, W_o, b_o, causal)
theirs, their_w = mha(x[None], Context(return_weights=True))  # attnlab wants a batch: (1, T, C)
assert torch.allclose(ours, theirs[0], atol=1e-5) and torch.allclose(our_w, their_w[0], atol=1e-6)
print("multi-head attention matches attnlab.nn.MultiHeadAttention")

fig, axes = plt.subplots(1, N_HEAD, figsize=(3.2 * N_HEAD, 3.4))
for h, ax in enumerate(axes):
    show(our_w[h], f"head {h}", ax)
    ax.set_xlabel("")
    ax.set_ylabel("")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## One Transformer block, by hand
#
# A block wraps attention and a position-wise feed-forward network (two linear maps with a GELU
# between, applied to each token separately), each inside a residual connection with a LayerNorm.
# GPT-2 and most models since put the norm before each sublayer (**pre-norm**):
#
# $$
# x \leftarrow x + \operatorname{Attn}(\operatorname{LN}(x)), \qquad
# x \leftarrow x + \operatorname{FFN}(\operatorname{LN}(x))
# $$
#
# The original Transformer put it after the residual (**post-norm**):
# $x \leftarrow \operatorname{LN}(x + \operatorname{Attn}(x))$. We write both with the same weights and compare each
# with `attnlab.nn.Block`.

# %%
D_FF = 4 * D_MODEL
params = {
    "ln1_g": 1 + 0.1 * torch.randn(D_MODEL),
    "ln1_b": 0.1 * torch.randn(D_MODEL),
    "ln2_g": 1 + 0.1 * torch.randn(D_MODEL),
    "ln2_b": 0.1 * torch.randn(D_MODEL),
    "W_up": torch.randn(D_FF, D_MODEL) / math.sqrt(D_MODEL),
    "b_up": 0.1 * torch.randn(D_FF),
    "W_down": torch.randn(D_MODEL, D_FF) / math.sqrt(D_FF),
    "b_down": 0.1 * torch.randn(D_MODEL),
}


def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * g + b


def feed_forward(x, p):
    return F.gelu(x @ p["W_up"].T + p["b_up"]) @ p["W_down"].T + p["b_down"]


def block_by_hand(x, p, pre_norm=True, mask=causal):
    attn = lambda h: multi_head(h, W_qkv, b_qkv, W_o, b_o, mask)[0]
    ln1 = lambda h: layer_norm(h, p["ln1_g"], p["ln1_b"])
    ln2 = lambda h: layer_norm(h, p["ln2_g"], p["ln2_b"])
    if pre_norm:
        x = x + attn(ln1(x))
        return x + feed_forward(ln2(x), p)
    x = ln1(x + attn(x))
    return ln2(x + feed_forward(x, p))


def attnlab_block(norm):
    block = Block(BlockConfig(d_model=D_MODEL, n_head=N_HEAD, d_ff=D_FF, norm=norm, causal=True)).eval()
    state = {
        "attn.qkv_proj.weight": W_qkv,
        "attn.qkv_proj.bias": b_qkv,
        "attn.out_proj.weight": W_o,
        "attn.out_proj.bias": b_o,
        "norm_attn.weight": params["ln1_g"],
        "norm_attn.bias": params["ln1_b"],
        "ff.up.weight": params["W_up"],
        "ff.up.bias": params["b_up"],
        "ff.down.weight": params["W_down"],
        "ff.down.bias": params["b_down"],
        "norm_ff.weight": params["ln2_g"],
        "norm_ff.bias": params["ln2_b"],
    }
    block.load_state_dict(state)  # strict: every parameter named, none left over
    return block


differences = {}
for norm in ("pre", "post"):
    ours = block_by_hand(x, params, pre_norm=norm == "pre")
    theirs, _ = attnlab_block(norm)(x[None])
    differences[norm] = (ours - theirs[0]).abs().max().item()
    assert torch.allclose(ours, theirs[0], atol=1e-5), norm
    print(f"{norm}-norm block matches attnlab.nn.Block (largest difference {differences[norm]:.1e})")

# %% [markdown]
# The residual stream carries each token's vector through the block; attention and the feed-forward
# each add their update to it. Below: how much each sublayer changed each token (the length of its
# update), in the pre-norm block. Attention's update to the first token depends only on itself
# (causal), the others mix in what came before.

# %%
with torch.no_grad():
    h = x
    attn_update = multi_head(layer_norm(h, params["ln1_g"], params["ln1_b"]), W_qkv, b_qkv, W_o, b_o, causal)[0]
    h = h + attn_update
    ff_update = feed_forward(layer_norm(h, params["ln2_g"], params["ln2_b"]), params)
positions = torch.arange(T)
plt.bar(positions - 0.2, attn_update.norm(dim=-1), width=0.4, label="attention's update")
plt.bar(positions + 0.2, ff_update.norm(dim=-1), width=0.4, label="feed-forward's update")
plt.xticks(positions, tokens, rotation=45)
plt.ylabel("length of the update")
plt.legend()
plt.title("what each sublayer adds to the residual stream")
plt.show()

# %% [markdown]
# ## Exercises
#
# Fill in each function and run its cell: the check under it compares your answer with attnlab's
# and says what is off. Until you fill one in it prints "not done yet".
#
# **1.** The scores: given queries `q` of shape `(B, Tq, d)` and keys `k` of shape `(B, Tk, d)`,
# return the scaled dot products, shape `(B, Tq, Tk)`.

# %%
from checks.attention import check_attention, check_causal_mask, check_scores


def my_scores(q, k):
    raise NotImplementedError  # your code: Q K^T / sqrt(d) over the last two dimensions


check_scores(my_scores)

# %% [markdown]
# **2.** The causal mask: return a boolean `(t, t)` tensor, True where query `i` may look at key `j`.


# %%
def my_causal_mask(t):
    raise NotImplementedError  # your code


check_causal_mask(my_causal_mask)

# %% [markdown]
# **3.** Masked attention: `q, k, v` of shape `(B, T, d)` and a boolean `mask` `(T, T)` (True = may
# look); return $\operatorname{softmax}(\text{scores, the masked ones set to } -\infty)\, v$.


# %%
def my_attention(q, k, v, mask):
    raise NotImplementedError  # your code


check_attention(my_attention)
