"""The names the parser offers as choices, kept here so that cli/options.py imports without torch.

Each registry lives beside the code it runs (interpret/plots.py's PLOTS, quant/packed.py's KINDS, ...),
and those modules import torch, seconds on a small machine (docs/cpu.md, "How fast a command
starts"), which `attnlab COMMAND --help` should not pay. So the parser reads the names from here,
and tests/test_startup.py holds each tuple equal to its registry: a new plot, inspection or quantized
kind is refused by that test until it is named here too. TASK_HELPS does the same for
`attnlab train --help`: each task's name and help line.
"""

from __future__ import annotations

PLOTS = ("loss", "lr", "positions", "embeddings", "experts", "expert-load")  # interpret/plots.py
INSPECTIONS = ("lens", "heads", "ablate", "rollout", "flow", "over-training")  # interpret/report.py
VIEW_NAMES = ("self", "encoder", "decoder", "cross")  # interpret/views.py
PATCH_METRICS = ("logit-diff", "prob", "loss")  # interpret/patching_inputs.py's METRICS
PATCH_METHODS = ("activation", "attribution", "eap", "eap-ig")  # interpret/patching_run.py's METHODS, EDGES
PATCH_GRANULARITIES = ("resid", "heads", "components")  # interpret/patching.py's GRANULARITIES
QUANTIZED = ("int8", "int4", "bf16")  # quant/packed.py's KINDS
SPLITS = ("val", "train", "all")  # tasks/lm_eval.py
PROJECTIONS = ("pca", "tsne")  # viz/vectors.py
# interop/hf's family modules' ARCHITECTURES, in their order
ARCHITECTURES = (
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "MixtralForCausalLM",
    "Qwen3ForCausalLM",
    "ViTForImageClassification",
    "ViTModel",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
)

# tasks/registry.py's TASKS, in its order: each task's `help` (its line in `attnlab train --help`)
TASK_HELPS = {
    "lm": "a GPT language model on text (next-token prediction)",
    "classify": "a label per text: the encoder or a baseline, on a file or a generated task",
    "tag": "a label per token: the encoder or a baseline, on a file or a generated task",
    "mlm": "an encoder by masked-language modelling (BERT's pretraining)",
    "translate": "source -> target: the Transformer or an RNN encoder-decoder",
    "image": "images: a Vision Transformer or an MLP on the pixels",
    "caption": "image -> words: a ViT encoder with a Transformer decoder, or Show, Attend and Tell's RNN",
    "sft": "supervised fine-tuning of a pretrained GPT on conversations (every weight, or LoRA)",
    "dpo": "preference tuning (DPO) of a fine-tuned GPT on chosen/rejected answers (every weight, or LoRA)",
    "reward": "a reward model: a GPT scoring answers, trained on chosen/rejected pairs (Bradley-Terry)",
    "grpo": "reinforcement learning (GRPO, Dr. GRPO, DAPO) of a fine-tuned GPT against a reward",
    "ppo": "InstructGPT's RL step (PPO) of a fine-tuned GPT against a reward model, with a reward-hacking alarm",
}


def architectures() -> tuple[str, ...]:
    """The HuggingFace architectures `attnlab convert` reads (interop/hf's architectures(), by name)."""
    return ARCHITECTURES
