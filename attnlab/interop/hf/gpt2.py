"""GPT-2 (transformers' GPT2LMHeadModel) <-> attnlab's GPT: configs and weights, both ways.

Legend: C model width (n_embd), V vocabulary, F feed-forward width (n_inner).

GPT-2 is attnlab's GPT with pre-norm blocks, learned positions, biases and tanh-GELU, so the
mapping is a renaming, with one twist: HuggingFace's Conv1D stores its weight as (in, out),
the transpose of nn.Linear's (out, in). c_attn's columns are q | k | v, stacked as the rows of
attnlab's qkv_proj; the LM head is tied to the token embedding (wte) unless the config says not.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.interop.hf import ACTIVATIONS, Pair, expected_shapes, map_weights
from attnlab.interop.hf.bounds import Shapes, Size, check_keys, layers, need
from attnlab.interop.hf.support import (
    Only,
    Rule,
    block_problems,
    classic_block,
    field_problems,
    gpt_head_problems,
    refuse_unfit,
)
from attnlab.models.gpt import GPT, GPTConfig

pixels_from_hf = None  # a text model: no preprocessor normalizes its input
ARCHITECTURES = ("GPT2LMHeadModel",)

# HuggingFace activation_function -> attnlab's. gelu_new is GPT-2's tanh GELU written out in
# elementwise ops; gelu_pytorch_tanh is the fused kernel attnlab calls: the same function.
EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# Options whose non-default value changes the attention math in ways attnlab's GPT does not have.
UNSUPPORTED = ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention")

# The config.json keys read here, and the kind of value each must be (interop/hf/bounds.py).
KEYS: dict[str, str] = {
    "n_layer": "size",
    "n_head": "size",
    "n_embd": "size",
    "n_inner": "size or null",
    "n_positions": "size",
    "n_ctx": "size",
    "resid_pdrop": "rate",
    "activation_function": "name",
    "layer_norm_epsilon": "positive",
    "vocab_size": "size",
    "tie_word_embeddings": "flag",
    "scale_attn_weights": "flag",
    **{key: "flag" for key in UNSUPPORTED},
}
CONTEXT_KEY = "n_positions"
FILLED = None  # every parameter comes from the files

# One block: attnlab name -> (HuggingFace name, stored transposed: Conv1D (in, out)).
BLOCK = {
    "norm_attn.weight": ("ln_1.weight", False),
    "norm_attn.bias": ("ln_1.bias", False),
    "attn.qkv_proj.weight": ("attn.c_attn.weight", True),  # (3C, C) <-> (C, 3C), q | k | v
    "attn.qkv_proj.bias": ("attn.c_attn.bias", False),
    "attn.out_proj.weight": ("attn.c_proj.weight", True),
    "attn.out_proj.bias": ("attn.c_proj.bias", False),
    "norm_ff.weight": ("ln_2.weight", False),
    "norm_ff.bias": ("ln_2.bias", False),
    "ff.up.weight": ("mlp.c_fc.weight", True),  # (F, C) <-> (C, F)
    "ff.up.bias": ("mlp.c_fc.bias", False),
    "ff.down.weight": ("mlp.c_proj.weight", True),  # (C, F) <-> (F, C)
    "ff.down.bias": ("mlp.c_proj.bias", False),
}

# Buffers that older checkpoints saved with the weights: the causal mask and its fill value.
BUFFERS = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


def pairs(cfg: GPTConfig, prefix: str = "transformer.") -> list[Pair]:
    """Every tensor of the model: (attnlab name, HuggingFace name, transposed)."""
    top = [("tok.weight", "wte.weight"), ("pos.embedding.weight", "wpe.weight")]
    out = [(ours, prefix + theirs, False) for ours, theirs in top]
    for i in range(cfg.n_layer):
        out += [(f"blocks.{i}.{ours}", f"{prefix}h.{i}.{theirs}", t) for ours, (theirs, t) in BLOCK.items()]
    out += [("norm.weight", f"{prefix}ln_f.weight", False), ("norm.bias", f"{prefix}ln_f.bias", False)]
    head = f"{prefix}wte.weight" if cfg.tie_weights else "lm_head.weight"  # tied: read the embedding twice
    return out + [("head.weight", head, False)]


def config_from_hf(hf: dict[str, Any]) -> tuple[str, GPTConfig, dict | None]:
    """GPT2Config's keys -> GPTConfig. Keys absent from config.json take GPT2Config's defaults
    (transformers leaves some out when they are default)."""
    check_keys(hf, KEYS)
    for key in UNSUPPORTED:
        if hf.get(key):
            raise AttnlabError(f"config.json sets {key}: attnlab's GPT has no such option")
    if not hf.get("scale_attn_weights", True):
        raise AttnlabError("config.json sets scale_attn_weights false: attnlab's GPT always scales by 1/sqrt(Dh)")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise AttnlabError(f"activation_function {act!r} is not supported: attnlab reads {', '.join(ACTIVATIONS)}")
    try:
        cfg = GPTConfig(
            n_layer=hf.get("n_layer", 12),
            n_head=hf.get("n_head", 12),
            d_model=hf.get("n_embd", 768),
            d_ff=hf.get("n_inner"),  # None: 4 * n_embd, in both
            context=hf.get("n_positions", hf.get("n_ctx", 1024)),
            dropout=hf.get("resid_pdrop", 0.1),  # attnlab has one rate for attention, residuals and embeddings
            norm="pre",
            activation=ACTIVATIONS[act],
            positions="learned",
            bias=True,
            ln_eps=hf.get("layer_norm_epsilon", 1e-5),
            vocab_size=hf.get("vocab_size", 50257),
            tie_weights=hf.get("tie_word_embeddings", True),
        )
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"config.json does not describe a GPT attnlab can build ({e})") from None
    return "gpt", cfg, None


def _prefix(names) -> str:
    """HuggingFace's names with or without the "transformer." prefix (GPT2Model's have none)."""
    return "transformer." if any(k.startswith("transformer.") for k in names) else ""


def sizes(cfg: GPTConfig, shapes: Shapes) -> list[Size]:
    """The sizes config.json gives beside those the tensors hold (interop/hf/bounds.py)."""
    p = _prefix(shapes)
    blocks = layers(shapes, rf"{re.escape(p)}h\.(\d+)\.")
    wte, wpe = need(shapes, f"{p}wte.weight", 2), need(shapes, f"{p}wpe.weight", 2)
    out = [
        Size("n_layer", cfg.n_layer, blocks, f"layers {p}h.N"),
        Size("vocab_size", cfg.vocab_size, wte[0], f"rows of {p}wte.weight"),
        Size("n_embd", cfg.d_model, wte[1], f"columns of {p}wte.weight"),
        Size("n_positions", cfg.context, wpe[0], f"rows of {p}wpe.weight"),
    ]
    if blocks:
        fc = need(shapes, f"{p}h.0.mlp.c_fc.weight", 2)  # Conv1D: (C, F)
        out.append(Size("n_inner", cfg.ff_width, fc[1], f"columns of {p}h.0.mlp.c_fc.weight"))
    return out


def weights_from_hf(tensors: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """HuggingFace names (with or without the "transformer." prefix) -> attnlab's GPT state dict."""
    prefix = _prefix(tensors)
    ignore = {k for k in tensors if BUFFERS.search(k)}
    if cfg.tie_weights:
        ignore.add("lm_head.weight")  # some checkpoints store the tied copy too; from_pretrained drops it
    return map_weights(tensors, pairs(cfg, prefix), expected_shapes(GPT, cfg), ignore)


# What GPT-2's block expresses of each block option (interop/hf/support.py).
SUPPORT: dict[str, Rule] = classic_block("GPT-2", "pre", EXPORT_ACTIVATIONS)


def target_name(cfg: GPTConfig) -> str:
    return "GPT-2"


def export_problems(cfg: GPTConfig) -> list[str]:
    """GPT-2's block is fixed: which of the run's choices it cannot express ([] if it fits)."""
    problems = block_problems(cfg, SUPPORT, "GPT-2")
    problems += field_problems(cfg, {"positions": Only(("learned",), "GPT-2's are learned")})
    return problems + gpt_head_problems(cfg, "GPT-2")


def check_exportable(cfg: GPTConfig) -> None:
    refuse_unfit("GPT", "GPT-2", export_problems(cfg))


def config_to_hf(cfg: GPTConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """GPTConfig -> a config.json that transformers' AutoConfig reads as a GPT2Config."""
    check_exportable(cfg)
    return {
        "architectures": list(ARCHITECTURES),
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.d_ff,
        "activation_function": EXPORT_ACTIVATIONS[cfg.activation],
        "layer_norm_epsilon": cfg.ln_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "tie_word_embeddings": cfg.tie_weights,
        "bos_token_id": None,  # GPT-2's 50256 would lie outside a small vocabulary; export sets the run's
        "eos_token_id": None,
        "dtype": "float32",
    }


def weights_to_hf(state: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """attnlab's GPT state dict -> HuggingFace names and layouts. A tied LM head is left out:
    transformers stores it once, as the embedding, and ties it again when loading."""
    check_exportable(cfg)
    out = {}
    for ours, theirs, transposed in pairs(cfg):
        if ours == "head.weight" and cfg.tie_weights:
            continue
        if ours not in state:
            raise AttnlabError(f"the run's weights have no tensor {ours}")
        out[theirs] = state[ours].T if transposed else state[ours]
    return out
