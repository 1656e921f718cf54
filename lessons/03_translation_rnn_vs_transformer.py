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
# # Lesson 3: translation, the RNN with attention beside the Transformer
#
# Attention was invented for translation. In 2014 an encoder RNN read the source sentence into one
# vector and a decoder RNN wrote the translation from it: everything the decoder knew of the source
# had to squeeze through that vector. Bahdanau, Cho and Bengio (2015) let the decoder look back at
# *every* encoder state at each step, with weights it computes itself: attention. The Transformer
# (Vaswani et al., 2017) kept the attention and dropped the recurrence.
#
# We train both on a small translation task attnlab generates: dates as people write them, to ISO
# 8601 (`the 21st of November 2026 -> 2026-11-21`), one character per token, and look at where each
# one attends while it writes.

# %%
SCALE = 1
N_TRAIN = 3000 * SCALE  # training pairs
N_TEST = 100 * SCALE
RNN_STEPS = 150 * SCALE
TRANSFORMER_STEPS = 300 * SCALE  # the Transformer needs more steps to find its way on so little data
BATCH = 32

import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnlab.data.batches import BOS_ID, EOS_ID, N_SPECIAL, Pairs
from attnlab.data.parallel import generate
from attnlab.data.shifted import to_ids, to_text
from attnlab.data.tokenizers import train_tokenizer
from attnlab.decoding.beam import greedy
from attnlab.models import build_model
from attnlab.models.rnn import RNNSeq2SeqConfig
from attnlab.models.seq2seq import Seq2SeqConfig

torch.manual_seed(0)
torch.set_num_threads(1)  # small models: a second thread only adds waiting

# %% [markdown]
# ## The data
#
# `attnlab.data.parallel.generate("dates", ...)` gives training, validation and test pairs whose dates
# never repeat across splits, so the test measures translating new dates. Each side gets its own
# character tokenizer; attnlab shifts every id above three special ones: padding, begin (BOS) and end
# of sequence (EOS).

# %%
splits = generate("dates", seed=0, sizes=(N_TRAIN, N_TEST, N_TEST))
for source, target in splits["train"][:6]:
    print(f"{source:>28}  ->  {target}")

src_tok = train_tokenizer("char", [s for s, _ in splits["train"]], 1000)
tgt_tok = train_tokenizer("char", [t for _, t in splits["train"]], 1000)
pairs = Pairs(
    {name: [to_ids(src_tok, s) for s, _ in data] for name, data in splits.items()},
    {name: [to_ids(tgt_tok, t) for _, t in data] for name, data in splits.items()},
)
src_vocab, tgt_vocab = src_tok.vocab_size + N_SPECIAL, tgt_tok.vocab_size + N_SPECIAL
print(f"source vocabulary {src_vocab}, target vocabulary {tgt_vocab}")

# %% [markdown]
# ## Teacher forcing
#
# Both models are trained the same way. The decoder gets the target shifted right by one, starting
# with BOS, and must predict the target followed by EOS: at every position it sees the true previous
# characters (teacher forcing), so one forward pass trains all positions at once.

# %%
src, tgt_in, labels = pairs.collate("train", [0])
print("source ids  ", src[0].tolist())
print("decoder in  ", tgt_in[0].tolist(), f"(starts with BOS = {BOS_ID})")
print("labels      ", labels[0].tolist(), f"(ends with EOS = {EOS_ID})")


def train(model, steps, lr, warmup=1):
    """Adam, with a linear warmup over `warmup` steps; returns the losses."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    rng = np.random.default_rng(0)
    losses = []
    model.train()
    for _ in range(steps):
        src, tgt_in, labels = pairs.batch("train", BATCH, rng, (0, 1))
        _, loss = model(src, tgt_in, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def exact_match(model):
    """Greedy decoding of the test sources; the share translated exactly, and the outputs."""
    out = greedy(model, pairs.source("test", range(N_TEST)), max_len=16)
    hypotheses = [to_text(tgt_tok, ids) for ids in out]
    return np.mean([h == t for h, (_, t) in zip(hypotheses, splits["test"])]), hypotheses


# %% [markdown]
# ## The RNN encoder-decoder with Bahdanau attention
#
# The encoder, a bidirectional GRU, turns the source into states $h_1 \dots h_S$. At step $i$ the
# decoder, in state $s_{i-1}$, scores every source state with a small network and mixes them:
#
# $$
# e_{ij} = v^\top \tanh(W s_{i-1} + U h_j), \qquad a_{ij} = \operatorname{softmax}_j(e_{ij}), \qquad
# c_i = \sum_j a_{ij} h_j
# $$
#
# and its next state reads the context $c_i$ with the previous character. This is *additive*
# attention; the Transformer's is the dot product of lesson 1.

# %%
rnn_cfg = RNNSeq2SeqConfig(
    src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_emb=32, d_hidden=64, d_attn=32, dropout=0.0, label_smoothing=0.0
)
rnn = build_model("rnn-seq2seq", rnn_cfg)
start = time.perf_counter()
rnn_losses = train(rnn, RNN_STEPS, lr=3e-3, warmup=20)
rnn_acc, rnn_out = exact_match(rnn)
print(
    f"RNN + attention: {sum(p.numel() for p in rnn.parameters()):,} parameters, "
    f"exact match {rnn_acc:.1%} after {RNN_STEPS} steps ({time.perf_counter() - start:.1f} s)"
)

# %% [markdown]
# ## The Transformer encoder-decoder
#
# The encoder is a stack of self-attention blocks over the source; the decoder's blocks have
# causal self-attention over what it has written so far, then **cross-attention**: queries from the
# decoder, keys and values from the encoder's output. Cross-attention plays the role of Bahdanau's
# alignment, with several heads in every layer. With no recurrence, positions come from sinusoids
# added to the embeddings.

# %%
transformer_cfg = Seq2SeqConfig(
    src_vocab=src_vocab, tgt_vocab=tgt_vocab, n_layer=2, n_head=4, d_model=64, context=64, dropout=0.0
)
transformer = build_model("seq2seq", transformer_cfg)
start = time.perf_counter()
transformer_losses = train(transformer, TRANSFORMER_STEPS, lr=1e-3)
transformer_acc, transformer_out = exact_match(transformer)
seconds = time.perf_counter() - start
print(
    f"Transformer: {sum(p.numel() for p in transformer.parameters()):,} parameters, "
    f"exact match {transformer_acc:.1%} after {TRANSFORMER_STEPS} steps ({seconds:.1f} s)"
)

plt.plot(rnn_losses, label="RNN + attention")
plt.plot(transformer_losses, label="Transformer")
plt.yscale("log")
plt.xlabel("step")
plt.ylabel("training loss")
plt.legend()
plt.title("teacher-forced training loss")
plt.show()

for (source, target), a, b in list(zip(splits["test"], rnn_out, transformer_out))[:6]:
    print(f"{source:>28} -> RNN {a:<11} Transformer {b:<11} (reference {target})")

# %% [markdown]
# On so few examples and steps the RNN learns faster: its recurrence already knows that characters
# come in order, while the Transformer must learn that from its positions (at `SCALE = 1` it is
# often still guessing the digits; its training loss is higher partly because it is trained with
# label smoothing, the paper's 0.1). Raise `SCALE` and it catches up. The Transformer's advantages,
# parallel training over whole sequences and no fixed-size state, pay off at scale (the translation guide's
# `attnlab compare --task numbers` and `--task dates` train all three models, the plain RNN too, for
# 3,000 steps).
#
# ## Where did they look?
#
# Both models can hand back their attention on a teacher-forced pair: `alignment(src, tgt_in)`.
# The RNN has one map; the Transformer one per layer and head (we average the heads of the last
# layer). For a date like `the 3rd of March 2021`, the year's digits should look at the year, the
# month's at the month's name.

# %%
row = next(i for i, (s, _) in enumerate(splits["test"]) if s.startswith("the "))
src, tgt_in, _ = pairs.collate("test", [row])
source, target = splits["test"][row]
with torch.no_grad():
    rnn_map = rnn.alignment(src, tgt_in)[0, 0, 0]  # (T, S)
    transformer_map = transformer.alignment(src, tgt_in)[0, -1].mean(0)  # last layer, heads averaged: (T, S)

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for ax, weights, title in (
    (axes[0], rnn_map, "RNN + Bahdanau attention"),
    (axes[1], transformer_map, "Transformer cross-attention (last layer)"),
):
    ax.imshow(weights, cmap="Greys", aspect="auto")
    # One character is one token here; row i predicts target character i (the last row: the end).
    ax.set_xticks(range(weights.shape[1]), list(source) if len(source) == weights.shape[1] else None)
    rows = [*target, "<eos>"]
    ax.set_yticks(range(weights.shape[0]), rows if len(rows) == weights.shape[0] else None)
    ax.set_xlabel("source character")
    ax.set_ylabel("predicting")
    ax.set_title(title)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Exercises
#
# **1.** Teacher forcing: given a target as a list of ids, return `(decoder_input, labels)`, two
# lists: the input starts with `BOS_ID` and the labels end with `EOS_ID`.

# %%
from checks.translation import check_additive_attention, check_teacher_forcing


def my_teacher_forcing(target_ids):
    raise NotImplementedError  # your code: return decoder_input, labels


check_teacher_forcing(my_teacher_forcing)

# %% [markdown]
# **2.** Bahdanau's score: given `query = W s` of shape `(B, A)`, `keys = U h` `(B, S, A)`, the
# encoder states `values` `(B, S, C)`, a boolean `mask` `(B, S)` (True on real source tokens) and the
# vector `v` `(A,)`, return `(context (B, C), weights (B, S))`, with weight exactly 0 on padding.


# %%
def my_additive_attention(query, keys, values, mask, v):
    raise NotImplementedError  # your code


check_additive_attention(my_additive_attention)
