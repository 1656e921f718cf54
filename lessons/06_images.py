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
# # Lesson 6: images as sequences of patches
#
# A Transformer reads a sequence of vectors. Text arrives as one; an image does not. The Vision
# Transformer (ViT, Dosovitskiy et al. 2021) makes one: cut the image into small squares, flatten each
# square into a vector, and treat the squares as the "words" of the image. Everything after that is the
# encoder you already know. In this lesson we cut scikit-learn's 8 x 8 handwritten digits into patches,
# train a small ViT on them, look at where its `[CLS]` token looks, and then hang a caption decoder on
# the same patches: a model that writes the digits it sees, word by word, with cross-attention over
# the patches.
#
# `SCALE = 1` trains for a few seconds on one CPU thread; `SCALE = 5` trains longer and wider.

# %%
SCALE = 1
VIT_STEPS = 150 * SCALE  # optimizer steps of the digit classifier
CAPTION_STEPS = 250 * SCALE  # optimizer steps of the captioner
WIDTH = 32 if SCALE == 1 else 64  # model width of both models
BATCH = 64

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from pictures import show, show_file

from attnlab.data.images import ImageDataConfig, load_images
from attnlab.models.vit import PatchEmbedding, ViT, ViTConfig, patchify

# Tiny models train fastest on one thread: a second one mostly waits for the first.
torch.set_num_threads(1 if SCALE == 1 else os.cpu_count())
torch.manual_seed(0)
PICTURES = Path(tempfile.mkdtemp())  # attnlab's own pictures are written as files; we show them from here


# %% [markdown]
# ## The data: 1,797 small digits
#
# `load_images` reads scikit-learn's digits (shipped inside the package, nothing downloaded) as float
# images (N, C, H, W) in [0, 1], split by class into train, validation and test sets.

# %%
digits = load_images(ImageDataConfig(data="digits"))
x_train, y_train = (torch.from_numpy(a) for a in digits.splits["train"])
x_test, y_test = (torch.from_numpy(a) for a in digits.splits["test"])
print("train", tuple(x_train.shape), "test", tuple(x_test.shape), "classes", digits.classes)

# %% [markdown]
# ## Cutting an image into patches
#
# With patches of $P \times P$ pixels, an $H \times W$ image becomes $N = (H/P)(W/P)$ patches, each a vector of
# $C \cdot P \cdot P$ numbers. Our 8 x 8 digits with $P = 4$ give $2 \times 2 = 4$ patches of 16 numbers. attnlab's
# `patchify` does the cutting with one reshape and one permute. Below: one digit, its four patches, and
# the four 16-number vectors the Transformer receives (one row each).

# %%
P = 4
image = x_test[:1]  # (1, 1, 8, 8)
patches = patchify(image, P)  # (1, N, C*P*P) = (1, 4, 16)
print("patches:", tuple(patches.shape))

fig = plt.figure(figsize=(9, 2.6))
ax = fig.add_subplot(1, 6, 1)
ax.imshow(image[0, 0], cmap="gray")
ax.axhline(P - 0.5, color="red")  # the cuts between patches
ax.axvline(P - 0.5, color="red")
ax.set_title(f"digit {int(y_test[0])}, cut {P}x{P}")
ax.axis("off")
for k in range(patches.shape[1]):
    ax = fig.add_subplot(1, 6, 2 + k)
    ax.imshow(patches[0, k].reshape(P, P), cmap="gray", vmin=0, vmax=1)
    ax.set_title(f"patch {k}")
    ax.axis("off")
ax = fig.add_subplot(1, 6, 6)
ax.imshow(patches[0], cmap="gray", aspect="auto")
ax.set_title("the sequence")
ax.set_xlabel("16 numbers")
ax.set_ylabel("token")
show(fig)

# %% [markdown]
# Each patch then goes through the same linear map to a `WIDTH`-long vector: the patch's "token
# embedding". Cutting, flattening and one shared linear map is exactly a convolution whose kernel and
# stride are both $P$, which is the fast way to compute it. attnlab keeps both paths; they give the same
# numbers:

# %%
conv = PatchEmbedding(channels=1, patch=P, d_model=WIDTH, path="conv")
linear = PatchEmbedding(channels=1, patch=P, d_model=WIDTH, path="linear")
linear.load_state_dict(conv.state_dict())
print("conv == cut-flatten-linear:", torch.allclose(conv(image), linear(image), atol=1e-6), tuple(conv(image).shape))

# %% [markdown]
# ## A small ViT
#
# The model prepends a learned `[CLS]` vector to the patch tokens, adds a position to each, runs the
# encoder blocks (no mask: every patch sees every patch), and classifies from the final `[CLS]`
# vector. So the sequence is $1 + 4 = 5$ tokens long. We train it with a plain loop: sample a batch,
# compute the loss the model returns, step AdamW.

# %%
cfg = ViTConfig.from_preset("vit-nano", n_layer=2, d_model=WIDTH, dropout=0.0)
vit = ViT(cfg)
print(f"{sum(p.numel() for p in vit.parameters()):,} parameters, {cfg.context} tokens per image, grid {cfg.grid}")
optimizer = torch.optim.AdamW(vit.parameters(), lr=3e-3, weight_decay=0.05)
losses = []
for _ in range(VIT_STEPS):
    rows = torch.randint(0, len(x_train), (BATCH,))
    _, loss = vit(x_train[rows], y_train[rows])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

vit.eval()
with torch.no_grad():
    predicted = vit(x_test).argmax(-1)
accuracy = (predicted == y_test).float().mean().item()
print(f"test accuracy after {VIT_STEPS} steps: {accuracy:.1%} of {len(y_test)} digits")
plt.plot(losses)
plt.xlabel("step")
plt.ylabel("training loss (label smoothing 0.1)")
plt.title("ViT on digits")
show()

# %% [markdown]
# ## Where does `[CLS]` look?
#
# `vit.attention(images)` returns every layer's attention (B, H, T, T). Row 0 of each head is what
# `[CLS]` gathers from each patch. One layer's map tells only part of the story: the patches have
# themselves mixed information in the layers below. **Attention rollout** (Abnar and Zuidema 2020)
# follows the mixing through all the layers: each layer is read as half identity (the residual path
# carries each token on) and half the mean of its heads, and the layers are multiplied together.
# `plot_patch_attention` draws each head, each layer's mean, and the rollout over the image.

# %%
from attnlab.interpret.patches import cls_maps, plot_patch_attention
from attnlab.interpret.rollout import rollout

with torch.no_grad():
    weights = vit.attention(image)  # L tensors (1, H, T, T)
one = [w[0] for w in weights]  # L arrays (H, T, T) for this image
path = PICTURES / "cls.png"
plot_patch_attention(image[0].numpy(), one, cfg.grid, path, title=f"predicted {int(predicted[0])}")
show_file(path)
print("[CLS]'s rollout over the 4 patches:", rollout(one)[0, 1:].round(3))

# %% [markdown]
# Averaged over the whole test set, the rollout says which parts of the 8 x 8 square the classifier
# reads most. Each patch holds a quarter of the pixels; a digit's strokes are mostly in the middle,
# where all four patches meet, so do not expect a dramatic picture with only four patches.

# %%
with torch.no_grad():
    all_weights = torch.stack(vit.attention(x_test), dim=1)  # (B, L, H, T, T)
mean_map = np.mean([rollout(w)[0, 1:] for w in all_weights], axis=0).reshape(cfg.grid)
print("mean [CLS] rollout per patch (row by row):", mean_map.round(3).tolist())
print("[CLS] maps of the first test image, layer x head x grid:", cls_maps(one, cfg.grid).shape)

# %% [markdown]
# ## Captioning: words that look at patches
#
# A captioner writes text about an image. attnlab's `captioner` is the translation Transformer with its
# source embedding swapped for the patch embedding: a ViT-style encoder turns the patches into a
# memory, one vector per patch, and a causal decoder writes the caption one word at a time. Each
# decoder block has **cross-attention**: the current word's query against the keys of the patches. So
# every word comes with a map over the image saying where it looked.
#
# attnlab's built-in caption data, `digits-strips`, puts 2-4 digits side by side and captions the number
# in words ("seventy-four"); learning to read those takes a few minutes (`attnlab train caption`). Here
# we make a quicker task from the same digits: two test-set digits side by side (8 x 16 pixels), and
# the caption names them left to right, "four two". Patches are full-height columns 4 pixels wide
# (patch 8 x 4), so the image is 4 patches: two per digit.

# %%
from attnlab.data.batches import BOS_ID, EOS_ID, N_SPECIAL
from attnlab.data.numbers import ONES
from attnlab.decoding.beam import greedy
from attnlab.models import build_model
from attnlab.models.captioner import CaptionerConfig

WORDS = ["<pad>", "<s>", "</s>"] + [ONES[d] for d in range(10)]  # id N_SPECIAL + d is the word for digit d
generator = torch.Generator().manual_seed(0)


def pairs(images, labels, n):
    """n images of two digits side by side (n, 1, 8, 16) and their captions as ids: <s> d1 d2 </s>."""
    a, b = (torch.randint(0, len(images), (n,), generator=generator) for _ in range(2))
    captions = torch.stack(
        [torch.full((n,), BOS_ID), labels[a] + N_SPECIAL, labels[b] + N_SPECIAL, torch.full((n,), EOS_ID)], dim=1
    )
    return torch.cat([images[a], images[b]], dim=-1), captions


test_images, test_captions = pairs(x_test, y_test, 300)
print("a caption:", " ".join(WORDS[i] for i in test_captions[0].tolist()))

cap_cfg = CaptionerConfig(
    n_layer=2,
    n_dec_layer=1,
    n_head=2,
    d_model=WIDTH,
    d_ff=2 * WIDTH,
    context=4,
    dropout=0.0,
    tgt_vocab=len(WORDS),
    image_size=8,
    image_width=16,
    channels=1,
    patch_size=8,
    patch_width=4,
    label_smoothing=0.0,
)
captioner = build_model("captioner", cap_cfg)
optimizer = torch.optim.AdamW(captioner.parameters(), lr=3e-3, weight_decay=0.0)
for _ in range(CAPTION_STEPS):
    images, captions = pairs(x_train, y_train, BATCH)
    # teacher forcing: the decoder reads <s> d1 d2 and must predict d1 d2 </s>
    _, loss = captioner(images, captions[:, :-1], captions[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

captioner.eval()
written = greedy(captioner, test_images, 3)  # one list of word ids per image, </s> left out
right = np.mean([w == c[1:3].tolist() for w, c in zip(written, test_captions)])
print(f"after {CAPTION_STEPS} steps, {right:.1%} of {len(written)} test captions are exactly right")
for w, c in list(zip(written, test_captions))[:4]:
    print(f"  wrote {' '.join(WORDS[i] for i in w)!r:22} true {' '.join(WORDS[i] for i in c[1:3].tolist())!r}")

# %% [markdown]
# `alignment(images, caption_in)` gives the cross-attention of teacher-forced decoding,
# (B, layers, heads, words, patches), and attnlab's `plot_caption_attention` lays each word's attention
# over the image in red: one column per word, a row per layer (the mean of its heads) and per head.
# A model that reads left to right should look at the left digit for the first word and at the right
# one for the second; `</s>` needs no particular place.

# %%
from attnlab.viz.captions import plot_caption_attention

k = 0
with torch.no_grad():
    cross = captioner.alignment(test_images[k : k + 1], test_captions[k : k + 1, :-1])[0]  # (L, H, T, N)
words = [WORDS[i] for i in test_captions[k, 1:].tolist()]
path = PICTURES / "caption.png"
plot_caption_attention(test_images[k].numpy(), words, cross.numpy(), cap_cfg.grid, path, title="where each word looked")
show_file(path)

# %% [markdown]
# Over the whole test set: on which half of the image does each word put most of its attention
# (last decoder layer, mean of heads)? Patches 0-1 cover the left digit, 2-3 the right one.

# %%
with torch.no_grad():
    cross = captioner.alignment(test_images, test_captions[:, :-1])[:, -1].mean(1)  # (B, T, N)
left_share = cross[..., :2].sum(-1)  # (B, T): attention on the left digit's patches
for t, name in enumerate(["first word", "second word", "</s>"]):
    print(f"{name:12}: {left_share[:, t].mean():.0%} of its attention on the left digit")

# %% [markdown]
# ## Exercises
#
# Each exercise has a function to fill in and a check that compares your answer with attnlab's. Until
# you fill one in, its check says so and the notebook runs on.
#
# **1.** Write `patchify`: images (B, C, H, W) -> patches (B, N, C*p*p), numbered row by row, each
# patch listing its channels, then rows, then columns (as `attnlab.models.vit.patchify`). Hint: reshape
# to (B, C, H/p, p, W/p, p), then permute.

# %%
from checks.images import check_cls_map, check_patchify, check_rollout


def my_patchify(images, p):
    raise NotImplementedError  # your code


check_patchify(my_patchify)

# %% [markdown]
# **2.** Write `cls_map`: from attention patterns (L, H, T, T) of a ViT whose token 0 is `[CLS]`, return
# `[CLS]`'s attention on each patch, laid out on the grid (L, H, gh, gw).


# %%
def my_cls_map(patterns, grid):
    raise NotImplementedError  # your code


check_cls_map(my_cls_map)

# %% [markdown]
# **3.** Write attention rollout: patterns (L, H, T, T) -> (T, T). Mix each layer as
# $A = 0.5\, I + 0.5 \cdot (\text{the mean over heads})$, then multiply the layers so that the last one is on the left.


# %%
def my_rollout(patterns):
    raise NotImplementedError  # your code


check_rollout(my_rollout)

# %% [markdown]
# **4.** (open) Set `SCALE = 5` and run again: the ViT reaches about 95% and the captioner nearly every
# caption. Does each word's attention settle more clearly on its own digit? Try patches of 2 x 2 pixels
# (`patch_size=2` in the ViT's config): 16 tokens instead of 4; what happens to accuracy and speed?
