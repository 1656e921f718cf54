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
# # Lesson 9: from a pretrained model to an assistant, and onto a laptop
#
# A pretrained language model continues text. An assistant answers questions. Between the two lie a few
# steps, each a small training run of its own:
#
# 1. **supervised fine-tuning (SFT)** on conversations, with the loss on the assistant's turns only;
# 2. the same with **LoRA**: the pretrained weights frozen, small low-rank adapters trained beside them;
# 3. **preference tuning (DPO)**: for one prompt, a chosen and a rejected answer; the model is pushed
#    toward the chosen one, relative to where it started;
# 4. and to run it small: **quantized** weights (int8, int4), what they cost in held-out loss, and the
#    **GGUF** file that llama.cpp and ollama read, written and read back.
#
# `attnlab demo --chat` runs the first three at a size that learns to answer (about twelve minutes on a
# 2-core CPU). Here everything is tiny, so that the lesson runs in seconds: the model will not become a good
# assistant, but every step is the real one, with attnlab's `train` tasks (`sft`, `dpo`), its LoRA, its
# quantizers and its GGUF writer and reader.

# %%
SCALE = 1
WIDTH, LAYERS = (64, 2) if SCALE == 1 else (128, 4)
BASE_STEPS = 60 * SCALE  # "pretraining"
SFT_STEPS = 40 * SCALE  # fine-tuning, every weight and LoRA
DPO_STEPS = 20 * SCALE  # preference tuning
EXAMPLES = 500 * SCALE  # generated conversations to fine-tune on

import os
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from pictures import show

import attnlab
from attnlab.data import DataConfig
from attnlab.data.chat import ChatTemplate
from attnlab.data.finetune import ChatData, PreferenceData
from attnlab.data.instructions import instructions
from attnlab.io import read_metrics

torch.set_num_threads(1 if SCALE == 1 else os.cpu_count())  # tiny models: one thread is fastest
warnings.filterwarnings("ignore", message=".*longer than the (model's )?context.*")  # a few long chats are left out
ROOT = Path(tempfile.mkdtemp())  # every run folder of this lesson goes here
# float32 on the CPU, and a validation every few steps, for every run of the lesson
TRAIN = dict(batch_size=16, warmup_steps=5, eval_interval=10, eval_batches=2, device="cpu", dtype="float32")


def curve(run, key="loss"):
    """(steps, values) of one metric logged in a run's metrics.jsonl."""
    rows = [r for r in read_metrics(Path(run) / "metrics.jsonl") if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


# %% [markdown]
# ## The data: generated instructions and a chat template
#
# attnlab generates checkable instructions (reverse a string, capitalise it, its length, the larger of two
# numbers, digits in words, follow-ups that need the first turn), with train and test questions kept
# apart. A **chat template** renders a conversation as one text with markers around each turn; the model
# learns the markers too, and at answer time the text up to the assistant's marker is the prompt.
# `assistant_spans` says which characters are the assistant's: only those carry the SFT loss.

# %%
template = ChatTemplate()
conversation = instructions("train", 1, seed=3)[0].messages
text, spans = template.assistant_spans(conversation)
print(text)
print("trained characters:", [text[a:b] for a, b in spans])

# %% [markdown]
# ## A "pretrained" base
#
# A real base model has read billions of tokens. Ours is a character-level GPT that reads a few hundred
# rendered conversations for `BASE_STEPS` steps with the plain language-model loss on every character:
# enough to know the characters and the template's shape, not to answer. Its activation is GPT-2's
# tanh GELU, so that it can be written as a GGUF file at the end.

# %%
corpus = ROOT / "chats.txt"
corpus.write_text("".join(template.render(c.messages) for c in instructions("train", 300, seed=5)))
base_cfg = attnlab.GPTConfig(n_layer=LAYERS, n_head=4, d_model=WIDTH, context=192, dropout=0.0, activation="gelu_tanh")
base = ROOT / "base"
result = attnlab.train(
    base,
    base_cfg,
    attnlab.TrainConfig(max_steps=BASE_STEPS, lr=3e-3, **TRAIN),
    DataConfig(data=str(corpus), tokenizer="char"),
    progress=False,
)
print(f"base: {result['parameters']:,} parameters, validation loss {result['val_loss']:.3f} nats/char")

# %% [markdown]
# ## Supervised fine-tuning, every weight, and with LoRA
#
# `attnlab.train(..., task="sft", init=BASE)` starts from the base's weights and tokenizer and trains on
# `ChatData` (the built-in instructions, or your own JSON/JSONL conversations), the loss on the
# assistant's turns. With `lora_rank=r` the base stays frozen: each adapted matrix $W$ (by default the
# queries' and values') gets $W + \frac{\alpha}{r} B A$, with $A$ ($r \times \text{in}$) and $B$ ($\text{out} \times
# r$), $B$ starting at zero so that training starts from the base model exactly. Only $A$ and $B$ train, and the
# run stores only them.

# %%
chat_data = ChatData(examples=EXAMPLES, test_examples=20)
sft = attnlab.train(
    ROOT / "sft",
    None,
    attnlab.TrainConfig(max_steps=SFT_STEPS, lr=3e-3, **TRAIN),
    chat_data,
    init=base,
    task="sft",
    progress=False,
)
lora = attnlab.train(
    ROOT / "lora",
    None,
    attnlab.TrainConfig(max_steps=SFT_STEPS, lr=3e-3, **TRAIN),
    chat_data,
    init=base,
    task="sft",
    lora_rank=4,
    progress=False,
)
for name, r in (("every weight", sft), ("LoRA rank 4", lora)):
    print(
        f"{name:13}: {r['trained_parameters']:7,} of {r['parameters']:,} parameters trained, "
        f"validation loss {r['val_loss']:.3f}, exact answers {r['test']['exact']:.0%} of {r['test']['examples']}"
    )

for run, label in ((ROOT / "sft", "sft, every weight"), (ROOT / "lora", "sft, LoRA rank 4")):
    steps, values = curve(run, "val_loss")
    plt.plot(steps, values, marker="o", label=label)
plt.xlabel("step")
plt.ylabel("validation loss on the answers (nats/char)")
plt.title("fine-tuning the base")
plt.legend()
show()

# %% [markdown]
# `attnlab.load` reads a LoRA run as its base plus the adapters. Its layers are `LoRALinear`: the frozen
# layer, and $A$ and $B$ beside it. Here is one, and the answer the fine-tuned model gives to a held-out
# question (at this size, expect the template's shape more than the right answer; `attnlab demo --chat`
# reaches 93% exact with 800 steps of a 4 x 128 model).

# %%
from attnlab.decoding.chat import answers
from attnlab.nn.lora import lora_layers

tuned = attnlab.load(ROOT / "lora")
name, layer = next(iter(lora_layers(tuned.model).items()))
print(
    name,
    "->",
    {part: tuple(a.shape) for part, a in layer.lora_A.items()},
    "A;",
    {part: tuple(b.shape) for part, b in layer.lora_B.items()},
    "B; scaling alpha / r =",
    layer.scaling,
)
question = instructions("test", 1, seed=11)[0].messages
reply = answers(tuned.model, tuned.tokenizer, template, [question[:-1]], temperature=0.0, max_new_tokens=24)[0]
print(f"Q: {question[0].content!r}\nexpected {question[-1].content!r}, the model says {reply!r}")

# %% [markdown]
# ## Preference tuning with DPO
#
# For each prompt, a pair of answers: `PreferenceData` pairs the right answer (chosen) with a near miss
# (rejected). DPO (Rafailov et al. 2023) needs no reward model: with the fine-tuned model frozen as the
# reference, it raises
# $\beta\,(\log \pi(\text{chosen}) - \log \pi_\text{ref}(\text{chosen})) - \beta\,(\log \pi(\text{rejected}) -
# \log \pi_\text{ref}(\text{rejected}))$ through $-\log \sigma$ of it. The implicit reward
# $\beta\,(\log \pi - \log \pi_\text{ref})$ of the
# chosen answer should end above the rejected one's: the run logs that accuracy and the margin. At
# `SCALE = 1` (20 steps, 20 held-out pairs) the accuracy is mostly noise; the training loss leaving $\ln 2$
# is what shows the pairs starting to separate. (The demo's 150 steps rank 97.5% of held-out pairs right.)

# %%
dpo = attnlab.train(
    ROOT / "dpo",
    None,
    attnlab.TrainConfig(max_steps=DPO_STEPS, lr=5e-4, **TRAIN),
    PreferenceData(examples=EXAMPLES // 2, test_examples=20),
    init=ROOT / "sft",
    task="dpo",
    beta=0.1,
    progress=False,
)
print(
    f"dpo: held-out pairs whose chosen answer has the larger implicit reward: "
    f"{dpo['test']['preference_accuracy']:.0%} of {dpo['test']['pairs']}"
)
steps, values = curve(ROOT / "dpo", "loss")
plt.plot(steps, values, label="DPO loss (training)")
plt.axhline(0.6931, color="gray", ls=":", label="ln 2: no preference yet")
plt.xlabel("step")
plt.legend()
plt.title("DPO starts at ln 2 (policy = reference) and falls as the pairs separate")
show()

# %% [markdown]
# ## Quantization: smaller weights, and what they cost
#
# Decoding one token reads every weight once, so a smaller weight is a faster token. `attnlab.load(RUN,
# quantize=...)` stores each block matrix and the output head as **int8** (one scale per output row:
# $\max \lvert w \rvert / 127$) or **int4** (groups of 32 weights, 16 levels between the group's min and max), weights
# only. `every_layer=True` packs every layer (by default a layer whose shape ran faster in float32 on
# this machine stays float32). The price is measured as it should be: the held-out loss of the same
# validation text through the run's own `evaluate`.

# %%
losses = {}
for precision in (None, "bf16", "int8", "int4"):
    run = attnlab.load(base, quantize=precision, every_layer=True)
    losses[precision or "float32"] = run.task.evaluate(run, None, "val", {"progress": False})["loss"]
for name, loss in losses.items():
    print(f"{name:8} held-out loss {loss:.4f} nats/char ({100 * (loss / losses['float32'] - 1):+.3f}%)")

from attnlab.quant.quantize import dequantize_int8, quantize_int8

weight = attnlab.load(base).model.blocks[0].attn.qkv_proj.weight.detach()
codes, scales = quantize_int8(weight)  # per output row: codes int8 (O, I), one float scale per row (O,)
error = (dequantize_int8(codes, scales) - weight).abs()
small = codes.numel() + scales.numel() * 4  # one byte a weight, four per row's scale
print(
    f"one matrix {tuple(weight.shape)}: {weight.numel() * 4:,} bytes float32 -> {small:,} int8; "
    f"largest error {error.max():.2e}, mean {error.mean():.2e}"
)

# %% [markdown]
# ## GGUF: one file for llama.cpp and ollama, and back
#
# `export_gguf(RUN, FILE, type)` (the command `attnlab export RUN --to gguf FILE --type ...`) writes the
# model as llama.cpp's converter lays it out, weights in f32, f16, q8_0 or q4_0, the tokenizer inside.
# `convert_from_gguf(FILE, OUT)` (`attnlab convert FILE.gguf --out RUN`) reads a GGUF file (ours, or a
# llama or gpt2 model from elsewhere) into an attnlab run, dequantized to float32. We write each type,
# read it back, and compare the file size and the held-out loss of what came back.

# %%
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import export_gguf

sizes, back_losses = {}, {}
for qtype in ("f32", "f16", "q8_0", "q4_0"):
    written = export_gguf(base, ROOT / f"model-{qtype}.gguf", qtype)
    convert_from_gguf(ROOT / f"model-{qtype}.gguf", ROOT / f"back-{qtype}")
    back = attnlab.load(ROOT / f"back-{qtype}")
    sizes[qtype] = written["bytes"] / 1024
    back_losses[qtype] = back.task.evaluate(back, str(corpus), "val", {"progress": False})["loss"]
    print(
        f"{qtype:5} {sizes[qtype]:7.1f} KiB, architecture {written['architecture']}, "
        f"held-out loss after the round trip {back_losses[qtype]:.4f}"
    )
print(f"(the float32 run itself: {losses['float32']:.4f})")

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
left.bar(list(sizes), list(sizes.values()))
left.set(ylabel="file size, KiB", title="GGUF file per weight type")
right.bar(list(back_losses), [100 * (v / losses["float32"] - 1) for v in back_losses.values()])
right.set(ylabel="held-out loss change, %", title="after writing and reading back")
show(fig)

# %% [markdown]
# The same chain at a size that works: `attnlab demo --chat` (base, sft, dpo, a reward model), then
# `attnlab quantize RUN --to int8`, `attnlab export RUN --to gguf model.gguf --type q8_0` and, with
# llama.cpp installed, `llama-completion -m model.gguf`.
#
# ## Exercises
#
# **1.** Write a LoRA layer's output: x (N, I), the frozen W (O, I), A (r, I), B (O, r), alpha ->
# $x W^\top + \frac{\alpha}{r}\, x A^\top B^\top$.

# %%
from checks.finetune import check_dpo, check_int8, check_lora


def my_lora(x, W, A, B, alpha):
    raise NotImplementedError  # your code


check_lora(my_lora)

# %% [markdown]
# **2.** Write DPO's loss from the four sequence log-probabilities (each of shape (B,)) and beta: the mean
# over the batch of $-\log \sigma\bigl(\beta\,((\pi_c - \text{ref}_c) - (\pi_r - \text{ref}_r))\bigr)$.
# (`F.logsigmoid` is exact where $\log(\sigma(x))$ would underflow.)


# %%
def my_dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    raise NotImplementedError  # your code


check_dpo(my_dpo)

# %% [markdown]
# **3.** Write int8 quantization of a matrix W (O, I), symmetric per output row:
# $\text{scale} = \max \lvert w \rvert / 127$ for each row, $\text{codes} = \operatorname{round}(w / \text{scale})$
# as torch.int8. Return (codes, scales).


# %%
def my_quantize(W):
    raise NotImplementedError  # your code


check_int8(my_quantize)
