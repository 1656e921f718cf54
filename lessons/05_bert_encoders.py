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
# # Lesson 5: BERT-style encoders
#
# An encoder is the Transformer without the causal mask: every token attends to every other, left
# and right. It cannot write text left to right, but it reads: each output vector describes its
# token *in context*. BERT (Devlin et al., 2018) showed how to train one without labels, by
# **masked-language modelling**, and then adapt it with a small head to a task with labels:
# classifying a whole text, or tagging each token.
#
# We pretrain a tiny encoder on unlabeled reviews, fine-tune it to classify them, and train a
# tagger that must tell the noun *watch* from the verb.

# %%
SCALE = 1
MLM_STEPS = 200 * SCALE
CLASSIFY_STEPS = 250 * SCALE
TAG_STEPS = 150 * SCALE
D_MODEL = 64 * SCALE

import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.data import sentiment
from attnlab.data.batches import IGNORE, mask_tokens
from attnlab.data.labeled import LabeledDataConfig
from attnlab.data.tokenizers import WordTokenizer
from attnlab.models.encoder import EncoderConfig

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny models: a second thread only adds waiting
workdir = Path(tempfile.mkdtemp(prefix="attnlab-lesson5-"))


def small(steps, **kw):
    """Training settings for a tiny run on this CPU."""
    settings = dict(
        max_steps=steps,
        batch_size=32,
        lr=2e-3,
        warmup_steps=20,
        eval_interval=steps,
        eval_batches=2,
        device="cpu",
        dtype="float32",
    )
    return attnlab.TrainConfig(**{**settings, **kw})


# %% [markdown]
# ## Masked-language modelling
#
# Choose 15% of the tokens. Of those, 80% are replaced by `[MASK]`, 10% by a random word and 10%
# are left as they are; the model must predict the original word at every chosen position (the
# loss ignores the others). The random and unchanged ones keep the model from learning that only
# `[MASK]` positions matter, since at fine-tuning time there is no `[MASK]` at all.
# `attnlab.data.batches.mask_tokens` does exactly this:

# %%
reviews = [text for text, _ in sentiment.splits(seed=0)["train"]]
tok = WordTokenizer.train(reviews)
ids = torch.tensor([tok.encode(r)[:10] for r in reviews[:2000] if len(tok.encode(r)) >= 10])  # (N, 10)
g = torch.Generator().manual_seed(0)
n_special = len(tok.specials)
inputs, labels = mask_tokens(ids, tok.mask_id, n_special, tok.vocab_size, rate=0.15, g=g)
print("original:", tok.decode(ids[0].tolist()))
print("input   :", tok.decode(inputs[0].tolist()))
print("labels  :", [tok.itos[i] if i != IGNORE else "-" for i in labels[0].tolist()])

chosen = labels != IGNORE
kinds = {
    "not chosen": (~chosen).float().mean(),
    "[MASK]": (chosen & (inputs == tok.mask_id)).float().mean(),
    "random word": (chosen & (inputs != tok.mask_id) & (inputs != ids)).float().mean(),
    "kept": (chosen & (inputs == ids)).float().mean(),
}
plt.figure(figsize=(6, 3))
plt.bar(list(kinds), [100 * v for v in kinds.values()])
plt.ylabel("% of tokens")
plt.yscale("log")
plt.title("what mask_tokens does to 20,000 tokens")
plt.show()
# (a random word can by chance be the original one: "kept" is a little above 1.5%)

# %% [markdown]
# Now pretrain: `attnlab.train(..., task="mlm")` reads a text corpus with a word tokenizer and trains
# an encoder with a masked-LM head (a projection back to the vocabulary). Our corpus is the reviews'
# text without their labels.

# %%
(workdir / "reviews.txt").write_text(" . ".join(reviews))  # one stream of text, reviews ended by a full stop
encoder = EncoderConfig(n_layer=2, n_head=4, d_model=D_MODEL, context=32, head="mlm")
start = time.perf_counter()
result = attnlab.train(
    workdir / "mlm",
    encoder,
    small(MLM_STEPS, block_size=32),
    attnlab.DataConfig(data=str(workdir / "reviews.txt"), tokenizer="word", vocab_size=200),
    task="mlm",
    progress=False,
)
print(f"masked-LM pretraining: validation loss {result['val_loss']:.3f} ({time.perf_counter() - start:.1f} s)")

mlm_run = attnlab.load(workdir / "mlm", device="cpu")
for text in ("the food was [MASK] good", "the [MASK] was excellent but the service was slow"):
    answer = mlm_run.task.predict(mlm_run, text, {})
    fills = [", ".join(f"{c['token']} ({c['probability']:.2f})" for c in m["candidates"][:3]) for m in answer["masks"]]
    print(f"{text!r}: {'; '.join(fills)}")

# %% [markdown]
# ## Classification
#
# To classify, a head reads one vector for the whole text: BERT's is the output at the `[CLS]` token
# put in front of every input (attnlab also offers the mean of all outputs). Fine-tuning starts from
# the pretrained encoder (`init=` the masked-LM run) and trains everything, the new head included.
# Compare it with the same encoder trained from random weights, with the same budget:

# %%
scores = {}
for name, init in (("from scratch", None), ("pretrained (MLM)", workdir / "mlm")):
    start = time.perf_counter()
    model = None if init else EncoderConfig(n_layer=2, n_head=4, d_model=D_MODEL, context=32)  # init: the run's own
    result = attnlab.train(
        workdir / f"classify-{len(scores)}",
        model,
        small(CLASSIFY_STEPS, lr=1e-3),
        LabeledDataConfig(data="sentiment", max_len=32),
        task="classify",
        init=init,
        progress=False,
    )
    scores[name] = result["test"]["accuracy"]
    print(f"{name:<18} test accuracy {scores[name]:.1%} ({time.perf_counter() - start:.1f} s)")

# %% [markdown]
# Pretraining pays when it has learned something about the language: BERT read billions of words
# before seeing a label. At `SCALE = 1` our masked-LM has had a few hundred steps and mostly knows
# which words are frequent (its guesses above are "." and "but" everywhere), so starting from it
# buys nothing yet, and at this budget it can even start slower than random weights. Raise `SCALE`
# (more pretraining steps first) to see the pretrained start pull ahead. Below: where the
# fine-tuned classifier's `[CLS]` looks in
# its last layer, for a review where "but" decides.

# %%
clf_run = attnlab.load(workdir / "classify-1", device="cpu")
review = "the food was good but the service was terrible"
ids = torch.tensor([[clf_run.tokenizer.cls_id, *clf_run.tokenizer.encode(review)]])
with torch.no_grad():
    last = clf_run.model.attention(ids)[-1][0]  # (H, T, T): the last layer's heads
words = ["[CLS]", *review.split()]
plt.figure(figsize=(8, 3))
for h in range(last.shape[0]):
    plt.plot(last[h, 0], marker="o", label=f"head {h}")
plt.xticks(range(len(words)), words, rotation=30)
plt.ylabel("attention from [CLS]")
plt.title(f"fine-tuned classifier ({clf_run.task.predict(clf_run, review, {}).get('label', '?')})")
plt.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Tagging
#
# A tagger puts a head on *every* output vector: one label per token. attnlab's generated tagging
# task asks for parts of speech where the word alone does not decide: *watch*, *fish* and *saw* are
# nouns or verbs by context, which an encoder reads from both sides.

# %%
start = time.perf_counter()
tagger = EncoderConfig(n_layer=2, n_head=4, d_model=D_MODEL, context=32, head="tag")
result = attnlab.train(
    workdir / "tag", tagger, small(TAG_STEPS), LabeledDataConfig(data="tagging", max_len=32), task="tag", progress=False
)
print(f"tagging: token accuracy {result['test']['accuracy']:.1%} ({time.perf_counter() - start:.1f} s)")
tag_run = attnlab.load(workdir / "tag", device="cpu")
for sentence in ("i watch the watch", "they saw the saw"):
    tagged = tag_run.task.predict(tag_run, sentence, {})["tokens"]
    print("  ".join(f"{t['token']}/{t['tag']}" for t in tagged))

# %% [markdown]
# ## Exercises
#
# **1.** BERT's masking: given token ids `(B, T)` and a boolean `chosen` `(B, T)` (the 15% already
# picked), return `labels`: the original id where chosen, `IGNORE` (-100) elsewhere.

# %%
from checks.encoders import check_mlm_labels, check_tag_accuracy


def my_mlm_labels(ids, chosen):
    raise NotImplementedError  # your code


check_mlm_labels(my_mlm_labels)

# %% [markdown]
# **2.** Token accuracy for tagging: `logits` `(B, T, L)` and `labels` `(B, T)` with `IGNORE` on
# padding. Return the share of real tokens whose most likely tag is right (a float).


# %%
def my_tag_accuracy(logits, labels):
    raise NotImplementedError  # your code


check_tag_accuracy(my_tag_accuracy)
