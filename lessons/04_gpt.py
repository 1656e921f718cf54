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
# # Lesson 4: GPT
#
# A GPT is a stack of Transformer blocks with a **causal** mask (lesson 1), trained on one task:
# predict the next token. Everything it can do, writing code or prose, comes from that objective
# on enough text. In this lesson we train a small one on Python source, then look at how text is
# drawn from it (temperature, top-k, top-p), at the key/value cache that makes drawing fast, and at
# how GPT-3's sizes follow from a handful of numbers.

# %%
SCALE = 1
STEPS = 250 * SCALE  # training steps
D_MODEL = 64 * SCALE
N_LAYER = 2 * SCALE
CONTEXT = 64 * SCALE
CORPUS_KB = 150 * SCALE  # kilobytes of Python source to train on

import sysconfig
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.decoding.draw import filter_logits
from attnlab.io import read_metrics
from attnlab.models.gpt import PAPER_PARAMS, PRESETS
from attnlab.models.size import count_params

torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: a second thread only adds waiting
workdir = Path(tempfile.mkdtemp(prefix="attnlab-lesson4-"))

# %% [markdown]
# ## Next-token prediction
#
# The training text is cut into windows of `CONTEXT` tokens (here characters). For a window
# $x_1 \dots x_T$ the model outputs, at every position $t$, a distribution over the next token, and
# the loss is the average of $-\log p(x_{t+1} \mid x_1 \dots x_t)$. The causal mask keeps position
# $t$ from seeing $x_{t+1}$, so one window trains $T$ predictions at once. Inputs and targets are the
# same text, shifted by one:

# %%
stdlib = Path(sysconfig.get_paths()["stdlib"])
files = ["textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "csv.py"]
text = "".join((stdlib / f).read_text() for f in files if (stdlib / f).exists())[: CORPUS_KB * 1000]
(workdir / "code.txt").write_text(text)
print(f"{len(text):,} characters of Python from the standard library")

window = text[1000 : 1000 + 24]
print("input :", repr(window[:-1]))
print("target:", repr(window[1:]))

# %% [markdown]
# `attnlab.train` runs the same loop as `attnlab train lm`: a run folder with the config, the
# tokenizer, the weights and the metrics. We keep it tiny.

# %%
model_cfg = attnlab.GPTConfig(n_layer=N_LAYER, n_head=4, d_model=D_MODEL, context=CONTEXT, dropout=0.0)
train_cfg = attnlab.TrainConfig(
    max_steps=STEPS,
    batch_size=16,
    lr=3e-3,
    warmup_steps=20,
    eval_interval=STEPS // 5,
    eval_batches=2,
    device="cpu",
    dtype="float32",
)
start = time.perf_counter()
attnlab.train(workdir / "gpt", model_cfg, train_cfg, attnlab.DataConfig(data=str(workdir / "code.txt")), progress=False)
print(f"trained in {time.perf_counter() - start:.1f} s")
run = attnlab.load(workdir / "gpt", device="cpu")
model, tok = run.model.eval(), run.tokenizer

rows = read_metrics(workdir / "gpt" / "metrics.jsonl")
train_rows = [r for r in rows if "train_loss" in r]
val_rows = [r for r in rows if "val_loss" in r]
plt.plot([r["step"] for r in train_rows], [r["train_loss"] for r in train_rows], label="train")
plt.plot([r["step"] for r in val_rows], [r["val_loss"] for r in val_rows], "o-", label="validation")
plt.xlabel("step")
plt.ylabel("cross-entropy (nats per character)")
plt.legend()
plt.title("next-character loss")
plt.show()

# %% [markdown]
# ## Drawing text: temperature, top-k, top-p
#
# To write, the model predicts a distribution for the next token, one is drawn, appended, and the
# loop repeats. How we draw matters:
#
# - **temperature** $\tau$ divides the logits before the softmax: $\tau < 1$ sharpens the
#   distribution (safer, more repetitive), $\tau > 1$ flattens it (more varied, more mistakes);
#   $\tau \to 0$ is greedy decoding.
# - **top-k** keeps only the $k$ most likely tokens.
# - **top-p** (nucleus sampling) keeps the smallest set of most likely tokens whose probabilities
#   add up to at least $p$: few tokens when the model is sure, many when it is not.

# %%
prompt = "    def "
ids = torch.tensor([tok.encode(prompt)])
with torch.no_grad():
    logits = model(ids)[0, -1]  # (V,): the distribution of the character after the prompt


def top_bars(ax, probs, title, n=12):
    p, order = probs.sort(descending=True)
    labels = [repr(tok.decode([int(i)]))[1:-1] for i in order[:n]]
    ax.bar(range(n), p[:n])
    ax.set_xticks(range(n), labels)
    ax.set_ylim(0, 1)
    ax.set_title(title)


fig, axes = plt.subplots(2, 3, figsize=(13, 6))
for ax, t in zip(axes[0], (0.5, 1.0, 2.0)):
    top_bars(ax, torch.softmax(logits / t, -1), f"temperature {t}")
top_bars(axes[1, 0], torch.softmax(filter_logits(logits, top_k=3), -1), "top-k = 3")
top_bars(axes[1, 1], torch.softmax(filter_logits(logits, top_p=0.8), -1), "top-p = 0.8")
top_bars(axes[1, 2], torch.softmax(filter_logits(logits / 1.5, top_k=8, top_p=0.9), -1), "temperature 1.5, k=8, p=0.9")
fig.suptitle(f"next character after {prompt!r}")
plt.tight_layout()
plt.show()

for t in (0.0, 0.8, 1.5):  # compile=False: 180 tokens are written before a first compiled step would be
    sample = run.generate("def ", max_new_tokens=60, temperature=t, seed=0, dtype="float32", compile=False)
    print(f"temperature {t}: {sample!r}")

# %% [markdown]
# ## The key/value cache
#
# Drawing token $t+1$ needs attention of the newest query over all $t$ keys and values. Without a
# cache the model recomputes every earlier position's keys and values at every step: the cost of
# writing $n$ tokens grows like $n^2$ in passes over the prefix. With a cache each block keeps the keys
# and values it has computed, and each step runs the model on the one new token only. The results
# are the same (up to rounding); only the work differs.


# %%
def decode_uncached(prompt_ids, n):
    ids = prompt_ids
    for _ in range(n):
        logits = model(ids[:, -CONTEXT:])[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


def decode_cached(prompt_ids, n):
    caches = model.new_caches()
    logits = model(prompt_ids, caches=caches)[:, -1]  # the prompt in one pass fills the caches
    ids, offset = prompt_ids, prompt_ids.shape[1]
    for _ in range(n):
        next_id = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], 1)
        logits = model(next_id, caches=caches, offset=offset)[:, -1]  # one new token at position `offset`
        offset += 1
    return ids


prompt_ids = torch.tensor([tok.encode("class ")])
n_new = CONTEXT - prompt_ids.shape[1] - 1
with torch.no_grad():
    timings = {}
    for name, fn in (("without cache", decode_uncached), ("with cache", decode_cached)):
        start = time.perf_counter()
        out = fn(prompt_ids, n_new)
        timings[name] = time.perf_counter() - start
        print(f"{name:>14}: {timings[name] * 1000:6.1f} ms  {tok.decode(out[0].tolist())!r}")
    assert torch.equal(decode_uncached(prompt_ids, n_new), decode_cached(prompt_ids, n_new))

    # Logits too, not just the chosen tokens: a whole sequence at once against one token at a time.
    seq = decode_cached(prompt_ids, n_new)
    full = model(seq)  # (1, T, V)
    caches, steps = model.new_caches(), []
    for t in range(seq.shape[1]):
        steps.append(model(seq[:, t : t + 1], caches=caches, offset=t))
    stepwise = torch.cat(steps, 1)
    print(f"largest logit difference, cached vs uncached: {(full - stepwise).abs().max():.2e}")
    assert torch.allclose(full, stepwise, atol=1e-4)

plt.figure(figsize=(5, 3))
plt.barh(list(timings), [1000 * s for s in timings.values()])
plt.xlabel(f"ms for {n_new} greedy tokens")
plt.title("the key/value cache")
plt.show()

# %% [markdown]
# The gap grows with the length: at 64 tokens and 2 layers it is small; at GPT-2's 1,024 tokens it
# is the difference between usable and not.
#
# ## GPT-3's sizes
#
# A GPT's parameters are almost all in its blocks: per block about $4d^2$ in attention ($W_Q, W_K,
# W_V, W_O$) and $8d^2$ in the feed-forward ($d \to 4d \to d$), so about $12 \cdot n_\text{layer} \cdot
# d^2$, plus the token embedding $V \cdot d$. Table 2.1 of the GPT-3 paper lists eight models; attnlab has
# each as a preset and counts its parameters exactly (on PyTorch's "meta" device, which allocates
# nothing).

# %%
print(f"{'preset':<12} {'layers':>6} {'d_model':>7} {'heads':>5} {'attnlab count':>14} {'paper':>8} {'12 L d^2':>9}")
names = [name for name in PRESETS if name.startswith("gpt3-")]
counted, paper = [], []
for name in names:
    cfg = PRESETS[name]
    total, _ = count_params(cfg)
    counted.append(total)
    paper.append(PAPER_PARAMS[name])
    approx = 12 * cfg.n_layer * cfg.d_model**2
    print(
        f"{name:<12} {cfg.n_layer:>6} {cfg.d_model:>7} {cfg.n_head:>5} {total / 1e9:>13.3f}B "
        f"{PAPER_PARAMS[name] / 1e9:>7.2f}B {approx / 1e9:>8.2f}B"
    )
    assert abs(total / PAPER_PARAMS[name] - 1) < 0.03, name

plt.figure(figsize=(6, 4))
plt.loglog(paper, counted, "o")
plt.loglog([1e8, 2e11], [1e8, 2e11], ":", color="gray")
for name, x, y in zip(names, paper, counted):
    plt.annotate(name.removeprefix("gpt3-"), (x, y), fontsize=8)
plt.xlabel("the paper's parameters")
plt.ylabel("attnlab's count")
plt.title("GPT-3 Table 2.1, counted")
plt.show()

# %% [markdown]
# ## Inside the trained model
#
# `attnlab.trace` runs the model once and keeps every named activation; in a notebook its last line
# shows the attention of each layer and head over the text.

# %%
attnlab.trace(run, "def add(a, b):\n    return a + b")

# %% [markdown]
# ## Exercises
#
# **1.** Temperature: return the probabilities $\operatorname{softmax}(\text{logits} / t)$ for a temperature $t > 0$.

# %%
from checks.sampling import check_temperature, check_top_k, check_top_p


def my_temperature(logits, t):
    raise NotImplementedError  # your code


check_temperature(my_temperature)

# %% [markdown]
# **2.** Top-k: return a copy of `logits` (shape `(V,)`) with every entry outside the `k` largest
# set to `-inf`.


# %%
def my_top_k(logits, k):
    raise NotImplementedError  # your code


check_top_k(my_top_k)

# %% [markdown]
# **3.** Top-p: keep the smallest set of the most likely tokens whose probabilities add up to at
# least `p` (the most likely token is always kept); set the other logits to `-inf`.


# %%
def my_top_p(logits, p):
    raise NotImplementedError  # your code


check_top_p(my_top_p)
