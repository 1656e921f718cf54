"""Llama and Mixtral (transformers' LlamaForCausalLM, MixtralForCausalLM) <-> attnlab's GPT.

Legend: C model width (hidden_size), F feed-forward width (intermediate_size), H query heads,
Hkv key/value heads, Dh head width, E experts.

A Llama is attnlab's GPT with pre-norm RMSNorm blocks, rotary positions (half-split pairs, the
layout of HuggingFace checkpoints), grouped-query attention, a SwiGLU feed-forward, no biases and,
usually, an untied head; a Mixtral replaces the feed-forward by a mixture of SwiGLU experts with
Mixtral's routing (softmax, top-k, gates renormalised), which is attnlab's. The mapping renames,
with two reshapes: q_proj, k_proj and v_proj are stacked as the rows of attnlab's qkv_proj, and a
Mixtral's experts are read in either layout: the Hub's (block_sparse_moe.experts.j.w1 / w3 / w2 =
gate / up / down, one tensor per expert) or transformers 5's fused one (mlp.experts.gate_up_proj
(E, 2F, C), mlp.experts.down_proj (E, C, F)). Export writes the Hub's layout, which every
version of transformers reads.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.interop.hf import Pair, expected_shapes, map_weights
from attnlab.interop.hf.bounds import Shapes, Size, check_keys, fits, layers, need, shown
from attnlab.interop.hf.support import (
    ANY,
    UNUSED,
    Only,
    Rule,
    block_problems,
    field_problems,
    gpt_head_problems,
    refuse_unfit,
)
from attnlab.models.gpt import GPT, GPTConfig

pixels_from_hf = None  # a text model: no preprocessor normalizes its input
ARCHITECTURES = ("LlamaForCausalLM", "MixtralForCausalLM")

# hidden_act -> the gated feed-forward that gates with it.
GATED = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
EXPORT_ACT = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}

# One block: attnlab name -> HuggingFace name under model.layers.{i}. (qkv_proj is built apart.)
BLOCK = {
    "norm_attn.weight": "input_layernorm.weight",
    "attn.out_proj.weight": "self_attn.o_proj.weight",
    "norm_ff.weight": "post_attention_layernorm.weight",
}
DENSE = {
    "ff.gate.weight": "mlp.gate_proj.weight",
    "ff.up.weight": "mlp.up_proj.weight",
    "ff.down.weight": "mlp.down_proj.weight",
}
EXPERT = {"gate.weight": "w1.weight", "up.weight": "w3.weight", "down.weight": "w2.weight"}  # Mixtral's names
QKV = ("q_proj", "k_proj", "v_proj")
# The config.json keys read here, and the kind of value each must be (interop/hf/bounds.py).
KEYS: dict[str, str] = {
    "num_hidden_layers": "size",
    "num_attention_heads": "size",
    "num_key_value_heads": "size or null",
    "architectures": "names or null",
    "model_type": "name",
    "hidden_size": "size",
    "head_dim": "size or null",
    "intermediate_size": "size",
    "max_position_embeddings": "size",
    "attention_dropout": "rate",
    "rms_norm_eps": "positive",
    "vocab_size": "size",
    "tie_word_embeddings": "flag",
    "hidden_act": "name",
    "rope_theta": "positive",
    "rope_parameters": "section or null",
    "rope_scaling": "section or null",
    "num_local_experts": "size",
    "num_experts_per_tok": "size",
    "router_aux_loss_coef": "nonnegative",
    "sliding_window": "size or null",
    "attention_bias": "flag",
    "mlp_bias": "flag",
}
CONTEXT_KEY = "max_position_embeddings"
FILLED = None  # every parameter comes from the files
STACKED = "+".join(QKV)  # the name of the three stacked, in messages about its shape


def is_mixtral(cfg: GPTConfig) -> bool:
    return cfg.feedforward == "moe"


def pairs(cfg: GPTConfig) -> list[Pair]:
    """Every tensor: (attnlab name, HuggingFace name, transposed: never here). qkv_proj reads the
    tensor `stack_qkv` builds, named model.layers.{i}.self_attn.q_proj+k_proj+v_proj.weight."""
    out = [("tok.weight", "model.embed_tokens.weight")]
    for i in range(cfg.n_layer):
        layer = f"model.layers.{i}."
        block = {**BLOCK, "attn.qkv_proj.weight": f"self_attn.{STACKED}.weight"}
        if is_mixtral(cfg):
            block["ff.router.weight"] = "block_sparse_moe.gate.weight"
            for j in range(cfg.n_experts):
                block |= {f"ff.experts.{j}.{k}": f"block_sparse_moe.experts.{j}.{v}" for k, v in EXPERT.items()}
        else:
            block |= DENSE
        out += [(f"blocks.{i}.{ours}", layer + theirs) for ours, theirs in block.items()]
    out += [("norm.weight", "model.norm.weight")]
    out += [("head.weight", "model.embed_tokens.weight" if cfg.tie_weights else "lm_head.weight")]
    return [(ours, theirs, False) for ours, theirs in out]


def _rope_theta(hf: dict[str, Any]) -> float:
    """rope_theta from transformers 5's rope_parameters or the older top-level key (a scaled variant,
    whose angles attnlab does not compute, was refused by check_keys)."""
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    if why := fits(theta, "positive"):
        raise AttnlabError(f"config.json: rope_theta must be {why}, got {shown(theta)}")
    return float(theta)


def config_from_hf(hf: dict[str, Any]) -> tuple[str, GPTConfig, dict | None]:
    """LlamaConfig / MixtralConfig keys -> GPTConfig (absent keys take transformers' defaults)."""
    check_keys(hf, KEYS)
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise AttnlabError(f"config.json sets {key}: attnlab's Llama block has no biases")
    act = hf.get("hidden_act", "silu")
    if act not in GATED:
        raise AttnlabError(f"hidden_act {act!r} is not supported: attnlab reads {', '.join(GATED)}")
    mixtral = "MixtralForCausalLM" in (hf.get("architectures") or []) or hf.get("model_type") == "mixtral"
    d_model, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    context = hf.get("max_position_embeddings", 4096 if not mixtral else 32768)
    window = hf.get("sliding_window")
    if window is not None and window < context:
        raise AttnlabError(f"config.json sets a sliding window of {window}: attnlab's attention sees the whole context")
    moe = {}
    if mixtral:
        n_experts, k = hf.get("num_local_experts", 8), hf.get("num_experts_per_tok", 2)
        # HuggingFace's balancing loss is k times attnlab's, averaged (not summed) over the layers.
        weight = hf.get("router_aux_loss_coef", 0.001) * k / hf.get("num_hidden_layers", 32)
        moe = dict(
            feedforward="moe", n_experts=n_experts, experts_per_token=k, expert_ff=GATED[act], aux_loss_weight=weight
        )
    head_dim = hf.get("head_dim") or d_model // heads
    theta = _rope_theta(hf)
    try:
        cfg = GPTConfig(
            n_layer=hf.get("num_hidden_layers", 32),
            n_head=heads,
            n_kv_head=hf.get("num_key_value_heads") or heads,
            d_model=d_model,
            d_head=None if head_dim * heads == d_model else head_dim,
            d_ff=hf.get("intermediate_size", 11008 if not mixtral else 14336),
            context=context,
            dropout=hf.get("attention_dropout", 0.0),
            norm="pre",
            norm_kind="rmsnorm",
            positions="rope",
            rope_theta=theta,
            feedforward=moe.pop("feedforward", GATED[act]),
            bias=False,
            ln_eps=hf.get("rms_norm_eps", 1e-6 if not mixtral else 1e-5),
            vocab_size=hf.get("vocab_size", 32000),
            tie_weights=hf.get("tie_word_embeddings", False),
            **moe,
        )
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"config.json does not describe a model attnlab can build ({e})") from None
    return "gpt", cfg, None


def _fused_to_hub(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's fused Mixtral names (mlp.gate, mlp.experts.gate_up_proj / down_proj) -> the
    Hub's per-expert ones; other tensors pass unchanged."""
    out, fused = {}, any(k.endswith(".mlp.experts.down_proj") for k in tensors)
    for name, t in tensors.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name.removesuffix("mlp.experts.gate_up_proj") + "block_sparse_moe.experts."
            gate, up = t.chunk(2, dim=1)  # (E, F, C) each
            for j in range(t.shape[0]):
                out[f"{base}{j}.w1.weight"], out[f"{base}{j}.w3.weight"] = gate[j], up[j]
        elif name.endswith(".mlp.experts.down_proj"):
            base = name.removesuffix("mlp.experts.down_proj") + "block_sparse_moe.experts."
            out |= {f"{base}{j}.w2.weight": down for j, down in enumerate(t)}  # (C, F) each
        elif fused and name.endswith(".mlp.gate.weight"):
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
        else:
            out[name] = t
    return out


def stack_qkv(tensors: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """q_proj, k_proj, v_proj of every layer -> one self_attn.qkv_proj.weight ((H + 2 Hkv) Dh, C)."""
    out = dict(tensors)
    for i in range(n_layer):
        names = [f"model.layers.{i}.self_attn.{p}.weight" for p in QKV]
        missing = [n for n in names if n not in out]
        if missing:
            raise AttnlabError(f"the checkpoint has no tensor {missing[0]}")
        out[f"model.layers.{i}.self_attn.{STACKED}.weight"] = torch.cat([out.pop(n) for n in names])
    return out


def sizes(cfg: GPTConfig, shapes: Shapes) -> list[Size]:
    """The sizes config.json gives beside those the tensors hold (interop/hf/bounds.py)."""
    emb, first = need(shapes, "model.embed_tokens.weight", 2), "model.layers.0."
    out = [
        Size("num_hidden_layers", cfg.n_layer, layers(shapes, r"model\.layers\.(\d+)\."), "layers model.layers.N"),
        Size("vocab_size", cfg.vocab_size, emb[0], "rows of model.embed_tokens.weight"),
        Size("hidden_size", cfg.d_model, emb[1], "columns of model.embed_tokens.weight"),
    ]
    if out[0].held == 0:
        return out
    for heads, proj in ((cfg.n_head, "q_proj"), (cfg.n_kv_head or cfg.n_head, "k_proj")):
        key = "num_attention_heads" if proj == "q_proj" else "num_key_value_heads"
        rows = need(shapes, f"{first}self_attn.{proj}.weight", 2)[0]
        out.append(Size(f"{key} x head_dim", heads * cfg.head_width, rows, f"rows of {first}self_attn.{proj}.weight"))
    if not is_mixtral(cfg):
        up = need(shapes, f"{first}mlp.up_proj.weight", 2)
        return [*out, Size("intermediate_size", cfg.ff_width, up[0], f"rows of {first}mlp.up_proj.weight")]
    fused = f"{first}mlp.experts.gate_up_proj"
    if fused in shapes:  # transformers 5's layout: (E, 2F, C)
        e, f2, _ = need(shapes, fused, 3)
        return [
            *out,
            Size("num_local_experts", cfg.n_experts, e, f"the first size of {fused}"),
            Size("intermediate_size", cfg.ff_width, f2 // 2, f"half the rows of {fused}"),
        ]
    experts = layers(shapes, rf"{re.escape(first)}block_sparse_moe\.experts\.(\d+)\.")
    w1 = need(shapes, f"{first}block_sparse_moe.experts.0.w1.weight", 2) if experts else (0, 0)
    return [
        *out,
        Size("num_local_experts", cfg.n_experts, experts, f"experts of {first}block_sparse_moe"),
        Size("intermediate_size", cfg.ff_width, w1[0], f"rows of {first}block_sparse_moe.experts.0.w1.weight"),
    ]


def weights_from_hf(tensors: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """HuggingFace names -> attnlab's GPT state dict."""
    tensors = stack_qkv(_fused_to_hub(tensors), cfg.n_layer)
    ignore = {k for k in tensors if k.endswith("rotary_emb.inv_freq")}  # older checkpoints saved the buffer
    if cfg.tie_weights:
        ignore.add("lm_head.weight")
    return map_weights(tensors, pairs(cfg), expected_shapes(GPT, cfg), ignore)


def _experts(cfg: GPTConfig) -> str | None:
    """A mixture's experts are gated and drop no token, as Mixtral's."""
    if not is_mixtral(cfg):
        return None
    if cfg.expert_ff not in EXPORT_ACT:
        return f"expert_ff {cfg.expert_ff!r} (Mixtral's experts are gated: swiglu or geglu)"
    return "capacity_factor (Mixtral drops no tokens)" if cfg.capacity_factor is not None else None


# What Llama's (and Mixtral's) block expresses of each block option (interop/hf/support.py).
SUPPORT: dict[str, Rule] = {
    "n_head": ANY,
    "d_model": ANY,
    "d_ff": ANY,
    "d_head": ANY,
    "n_kv_head": ANY,
    "dropout": ANY,
    "norm": Only(("pre",), "Llama is pre-norm"),
    "activation": UNUSED,  # a gated feed-forward names its own
    "feedforward": Only((*EXPORT_ACT, "moe"), "Llama's feed-forward is gated: swiglu or geglu"),
    "n_experts": ANY,
    "experts_per_token": ANY,
    "expert_ff": _experts,
    "capacity_factor": _experts,
    "aux_loss_weight": ANY,
    "norm_kind": Only(("rmsnorm",), "Llama uses RMSNorm"),
    "bias": Only((False,), "Llama has no biases: train with --no-bias"),
    "ln_eps": ANY,
    "qk_norm": Only((False,), "Llama has no QK-norm"),
}


def target_name(cfg: GPTConfig) -> str:
    return "Mixtral" if is_mixtral(cfg) else "Llama"


def export_problems(cfg: GPTConfig) -> list[str]:
    """Which of the run's choices a HuggingFace Llama / Mixtral cannot express ([] if it fits)."""
    name = target_name(cfg)
    problems = block_problems(cfg, SUPPORT, name)
    problems += field_problems(cfg, {"positions": Only(("rope",), f"{name}'s are rotary")})
    return problems + gpt_head_problems(cfg, name)


def check_exportable(cfg: GPTConfig) -> None:
    refuse_unfit("GPT", target_name(cfg), export_problems(cfg))


def config_to_hf(cfg: GPTConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """GPTConfig -> a config.json transformers reads as a LlamaConfig or MixtralConfig."""
    check_exportable(cfg)
    mixtral = is_mixtral(cfg)
    hf = {
        "architectures": ["MixtralForCausalLM" if mixtral else "LlamaForCausalLM"],
        "model_type": "mixtral" if mixtral else "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ff_width,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head or cfg.n_head,
        "head_dim": cfg.head_width,
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": cfg.ln_eps,
        "rope_theta": cfg.rope_theta,  # transformers < 5
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "hidden_act": EXPORT_ACT[cfg.expert_ff if mixtral else cfg.feedforward],
        "attention_bias": False,
        "attention_dropout": cfg.dropout,
        "tie_word_embeddings": cfg.tie_weights,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": "float32",
    }
    if mixtral:
        hf |= {
            "num_local_experts": cfg.n_experts,
            "num_experts_per_tok": cfg.experts_per_token,
            "router_aux_loss_coef": cfg.aux_loss_weight * cfg.n_layer / cfg.experts_per_token,
            "sliding_window": None,
        }
    else:
        hf["mlp_bias"] = False
    return hf


def weights_to_hf(state: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """attnlab's GPT state dict -> HuggingFace names (qkv_proj split back into q, k, v)."""
    check_exportable(cfg)
    out = {}
    inner, kv = cfg.n_head * cfg.head_width, (cfg.n_kv_head or cfg.n_head) * cfg.head_width
    for ours, theirs, _ in pairs(cfg):
        if ours == "head.weight" and cfg.tie_weights:
            continue
        if ours not in state:
            raise AttnlabError(f"the run's weights have no tensor {ours}")
        if ours.endswith("attn.qkv_proj.weight"):
            base = theirs.removesuffix(f"{STACKED}.weight")
            for p, t in zip(QKV, state[ours].split([inner, kv, kv])):
                out[f"{base}{p}.weight"] = t.contiguous()
        else:
            out[theirs] = state[ours]
    return out
