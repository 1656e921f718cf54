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
# # Lesson 2: from words to attention
#
# How does a model read a sentence? This lesson climbs a ladder of text classifiers on one task,
# each rung adding one idea, until we reach the Transformer encoder:
#
# 1. **bag of words**: which words occur, nothing else;
# 2. **pooled embeddings**: each word a learned vector, averaged;
# 3. **pretrained vectors**: the same, with vectors learned beforehand from unlabeled text;
# 4. **1-D convolution**: vectors of neighbouring words combined, so local order counts;
# 5. **RNN**: an LSTM reads the words one by one, carrying a state;
# 6. **parameter-free self-attention**: every word mixes in the others, weighted by similarity;
# 7. **one learned head**: queries, keys and values decide who looks at whom;
# 8. **multi-head**: several such heads side by side;
# 9. **the Transformer encoder**: heads, feed-forward layers, residuals, norms and positions.
#
# Every model is attnlab's own (`attnlab.models`: the same ones `attnlab compare --task sentiment`
# trains); here we train them with a ten-line loop so that each step is visible.

# %%
SCALE = 1
N_TRAIN = 3000 * SCALE  # training reviews (the full task has 20,000)
N_TEST = 500 * SCALE
STEPS = 150 * SCALE  # Adam steps per model
BATCH = 32
VECTOR_EPOCHS = 2 * SCALE  # passes of skip-gram over the unlabeled reviews

import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnlab.data import sentiment
from attnlab.data.tokenizers import WordTokenizer
from attnlab.models import build_model
from attnlab.models.attention_ladder import QKVAttentionConfig, SelfAttentionConfig
from attnlab.models.baselines import BagOfWordsConfig, Conv1DConfig, PooledConfig, RNNConfig
from attnlab.models.encoder import EncoderConfig

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny models: a second thread only adds waiting
workdir = Path(tempfile.mkdtemp(prefix="attnlab-lesson2-"))
# torch's first optimizer imports its compiler machinery (seconds): pay for it here, not in the first rung's time.
torch.optim.Adam([torch.zeros(1, requires_grad=True)])

# %% [markdown]
# ## The task
#
# attnlab generates restaurant reviews whose label depends on more than which words occur:
# negation ("not too terrible"), intensifiers and "but" (the second clause decides). Most two-part
# reviews have a twin with the same words in another order and the opposite label, so counting
# words cannot solve it.

# %%
splits = sentiment.splits(seed=0, sizes=(N_TRAIN, N_TEST, N_TEST))
for text, label in splits["train"][:5]:
    print(f"{label:>8}  {text}")

tok = WordTokenizer.train(text for text, _ in splits["train"])
labels = sorted({label for _, label in splits["train"]})
print(f"{tok.vocab_size} words in the vocabulary; labels {labels}")


def encode(examples):
    """Examples -> ids (N, T) padded with 0 ([PAD]) and labels (N,)."""
    rows = [tok.encode(text) for text, _ in examples]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids, torch.tensor([labels.index(label) for _, label in examples])


train_x, train_y = encode(splits["train"])
test_x, test_y = encode(splits["test"])
print("train ids", tuple(train_x.shape), " test ids", tuple(test_x.shape))

# %% [markdown]
# ## Word vectors
#
# A word vector places each word in a space where words used alike sit close together. Word2Vec's
# skip-gram learns them without labels: each word's vector is trained to predict the words around
# it. Here `attnlab.wordvec` trains skip-gram on the reviews' text alone (the labels unused): a
# small "pretraining" step. With so few distinct words the neighbours are rough, but words of the
# same kind (foods, adjectives of praise or blame) drift together.

# %%
from attnlab.wordvec import VectorsConfig, load_vectors, train_vectors

D_VEC = 16
unlabeled = "\n".join(text for text, _ in splits["train"])
train_vectors(
    workdir / "vectors",
    VectorsConfig(dim=D_VEC, epochs=VECTOR_EPOCHS, min_count=1, threads=1),
    text=unlabeled,
    progress=False,
)
vectors = load_vectors(workdir / "vectors")
for word in ("good", "terrible", "not", "food"):
    print(f"{word:>9}:", ", ".join(w for w, _ in vectors.neighbors(word, 4)))

# A 2-D picture: the first two principal directions of the vectors of the 40 most frequent words.
words = [w for w in tok.itos[5:45] if w in vectors]
matrix = np.stack([vectors[w] for w in words])
matrix = matrix - matrix.mean(0)
xy = matrix @ np.linalg.svd(matrix, full_matrices=False)[2][:2].T  # (words, 2)
plt.figure(figsize=(7, 5))
plt.scatter(xy[:, 0], xy[:, 1], s=8)
for (px, py), w in zip(xy, words):
    plt.annotate(w, (px, py), fontsize=8)
plt.title("skip-gram vectors of the reviews' words (PCA)")
plt.show()

# %% [markdown]
# ## The training loop
#
# Every model on the ladder takes word ids `(B, T)` and labels, and returns logits and the loss, so
# one loop trains them all. Padding is id 0; each model knows to ignore it.


# %%
def train(model, lr=3e-3, steps=STEPS):
    """Adam on random batches; returns the test accuracy and the seconds spent."""
    start = time.perf_counter()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=lr)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(train_x), (BATCH,), generator=g)
        _, loss = model(train_x[rows], train_y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(-1) == test_y).float().mean().item()
    return accuracy, time.perf_counter() - start


V = tok.vocab_size
base = dict(vocab_size=V, n_labels=len(labels))
results = {}

# %% [markdown]
# ## Rungs 1-3: order-blind models
#
# The bag of words sees a 0/1 vector of which words occur. Pooled embeddings average a learned
# vector per word. The third rung is the second with its embedding copied from the skip-gram vectors
# and frozen (`attnlab.wordvec.embedding.load_word_vectors`). All three are blind to word order.

# %%
from attnlab.wordvec.embedding import load_word_vectors

results["bag of words"] = train(build_model("bow", BagOfWordsConfig(**base)))
results["pooled"] = train(build_model("pooled", PooledConfig(**base, d_embed=D_VEC)))
pretrained = build_model("pooled", PooledConfig(**base, d_embed=D_VEC))
found, missing = load_word_vectors(pretrained.word_embedding, workdir / "vectors", tok.itos, freeze=True)
print(f"{found} rows from the vectors, {len(missing)} words missing")
results["pooled + vectors"] = train(pretrained)
for name, (acc, secs) in results.items():
    print(f"{name:<18} {acc:6.1%}  ({secs:.1f} s)")

# %% [markdown]
# ## Rungs 4-5: reading order
#
# A 1-D convolution slides a window of a few words along the sentence, so "not good" and "good, not"
# look different. An LSTM reads left to right and classifies from its last state.

# %%
results["conv1d"] = train(build_model("conv1d", Conv1DConfig(**base, d_embed=32, channels=32)))
results["rnn (LSTM)"] = train(build_model("rnn", RNNConfig(**base, d_embed=32, hidden=32)), lr=1e-2)
for name in ("conv1d", "rnn (LSTM)"):
    print(f"{name:<18} {results[name][0]:6.1%}  ({results[name][1]:.1f} s)")

# %% [markdown]
# ## Rungs 6-8: attention without positions
#
# Parameter-free self-attention replaces each word vector $x_i$ by
# $\sum_j \operatorname{softmax}_j(x_i \cdot x_j)\, x_j$: a mix of the sentence, weighted by similarity, then
# averaged. It has no weights of its own. One learned head computes the same with queries, keys and values
# (lesson 1), and multi-head attention runs four. None of them knows where a word stands: shuffle the words
# and the average is the same. So expect them near the order-blind rungs.

# %%
results["self-attention"] = train(build_model("self-attention", SelfAttentionConfig(**base, d_embed=32)))
one_head = build_model("qkv-attention", QKVAttentionConfig(**base, d_embed=32))
results["one QKV head"] = train(one_head)
results["4 heads"] = train(build_model("qkv-attention", QKVAttentionConfig(**base, d_embed=32, n_head=4)))
for name in ("self-attention", "one QKV head", "4 heads"):
    print(f"{name:<18} {results[name][0]:6.1%}  ({results[name][1]:.1f} s)")

# %% [markdown]
# What did the learned head look at? `mix(..., return_weights=True)` hands back its attention
# weights for one review.

# %%
review = splits["test"][0][0]
ids = torch.tensor([tok.encode(review)])
with torch.no_grad():
    _, weights = one_head.mix(ids, ids != 0, return_weights=True)  # (1, 1, T, T)
review_words = review.split()
plt.imshow(weights[0, 0], cmap="Blues")
plt.xticks(range(len(review_words)), review_words, rotation=90)
plt.yticks(range(len(review_words)), review_words)
plt.title("the one learned head, on a test review")
plt.show()

# %% [markdown]
# ## Rung 9: the Transformer encoder
#
# Add positions (so order is visible), residual connections, a feed-forward layer after each
# attention and stack two such blocks: that is the encoder of lesson 5, here a small one. It has
# more to fit than the rungs below it, so it gets twice their steps at a gentler learning rate.

# %%
encoder_cfg = EncoderConfig(**base, n_layer=2, n_head=4, d_model=64, context=64, head="classify", pooling="mean")
results["Transformer encoder"] = train(build_model("encoder", encoder_cfg), lr=1e-3, steps=2 * STEPS)
print(f"Transformer encoder {results['Transformer encoder'][0]:6.1%}  ({results['Transformer encoder'][1]:.1f} s)")

# %%
names = list(results)
accuracies = [results[n][0] for n in names]
colors = ["tab:gray"] * 3 + ["tab:orange"] * 2 + ["tab:blue"] * 3 + ["tab:green"]
plt.figure(figsize=(8, 4))
plt.barh(names[::-1], accuracies[::-1], color=colors[::-1])
plt.axvline(0.5, color="black", linestyle=":", label="chance")
plt.xlim(0, 1)
plt.xlabel("test accuracy")
plt.title(f"the ladder on the generated reviews ({STEPS} steps each)")
plt.legend()
plt.show()

# %% [markdown]
# At `SCALE = 1` the budget is tiny, so the exact numbers wobble, but the pattern is the one the
# README's full comparison measures (`attnlab compare --task sentiment`: 1,500 steps on 20,000
# reviews): the order-blind models, attention without positions included, stay near chance; the
# convolution, the LSTM and the encoder, which all see order, learn the rules. Raise `SCALE` to
# watch the gaps open.

# %% [markdown]
# ## Exercises
#
# **1.** Pooling with padding: `x` is `(B, T, C)`, `mask` is `(B, T)` (True on real words). Return
# the mean over the real words only, `(B, C)`. A row with no real word should give zeros, not NaN.

# %%
from checks.ladder import check_masked_mean, check_simple_self_attention


def my_masked_mean(x, mask):
    raise NotImplementedError  # your code


check_masked_mean(my_masked_mean)

# %% [markdown]
# **2.** Parameter-free self-attention: for embeddings `x` `(B, T, C)` return
# $\operatorname{softmax}(x x^\top)\, x$ `(B, T, C)`, unscaled, as rung 6 computes it (no mask needed here).


# %%
def my_simple_self_attention(x):
    raise NotImplementedError  # your code


check_simple_self_attention(my_simple_self_attention)
