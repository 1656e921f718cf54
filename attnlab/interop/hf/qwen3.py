"""Qwen3 (transformers' Qwen3ForCausalLM) <-> attnlab's GPT: a Llama with QK-norm.

Legend: C model width (hidden_size), H query heads, Hkv key/value heads, Dh head width.

Qwen3's block is Llama's (llama.py: pre-norm RMSNorm, rotary positions in HuggingFace's half-split
pairs, grouped-query attention, SwiGLU, no biases) with each head's query and key RMS-normalized
over Dh by a learned gain (self_attn.q_norm, self_attn.k_norm, one (Dh,) vector each, shared by the
heads) before the rotation: attnlab's `qk_norm`, which computes the same in the same place
(nn/attention.py). So this module is llama.py's mapping plus those two vectors a layer. It is how
a run with QK-norm leaves attnlab: llama.cpp runs it as its `qwen3` architecture (interop/gguf_layout.py).

attnlab's QK-norm divides by sqrt(mean(x^2) + 1e-5), a fixed epsilon, where Qwen3 takes the
block's rms_norm_eps: a run whose ln_eps is not 1e-5, or a checkpoint whose rms_norm_eps is not
(Qwen's own use 1e-6), is refused rather than written or read as another model.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.interop.hf import Pair, expected_shapes, llama, map_weights
from attnlab.interop.hf.bounds import Shapes, Size, check_keys
from attnlab.interop.hf.support import Only, Rule, block_problems, field_problems, gpt_head_problems, refuse_unfit
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.norm import RMSNorm

pixels_from_hf = None  # a text model: no preprocessor normalizes its input
ARCHITECTURES = ("Qwen3ForCausalLM",)
QK_EPS = RMSNorm(1).eps  # the epsilon of attnlab's QK-norm (nn/attention.py builds RMSNorm(Dh))
# The config.json keys read here: Llama's, and Qwen3's sliding-window switches (refused when on).
KEYS: dict[str, str] = {
    **llama.KEYS,
    "use_sliding_window": "flag",
    "max_window_layers": "size or null",
    "layer_types": "names or null",
}
CONTEXT_KEY, FILLED = llama.CONTEXT_KEY, llama.FILLED
NORMS = {"attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"}


def pairs(cfg: GPTConfig) -> list[Pair]:
    """llama.py's tensors and each layer's q_norm and k_norm (never transposed)."""
    norms = [
        (f"blocks.{i}.{ours}", f"model.layers.{i}.{theirs}", False)
        for i in range(cfg.n_layer)
        for ours, theirs in NORMS.items()
    ]
    return llama.pairs(cfg) + norms


def config_from_hf(hf: dict[str, Any]) -> tuple[str, GPTConfig, dict | None]:
    """Qwen3Config keys -> GPTConfig: Llama's reading with QK-norm on."""
    check_keys(hf, KEYS)
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise AttnlabError("config.json turns on Qwen3's sliding window: attnlab's attention sees the whole context")
    eps = hf.get("rms_norm_eps", 1e-6)
    if not math.isclose(eps, QK_EPS, rel_tol=1e-6):  # a GGUF file holds it as float32
        raise AttnlabError(
            f"config.json's rms_norm_eps is {eps}: attnlab's QK-norm divides with epsilon {QK_EPS}, "
            "so this Qwen3 would compute another model"
        )
    plain = {k: v for k, v in hf.items() if k not in ("use_sliding_window", "max_window_layers", "layer_types")}
    family, cfg, task = llama.config_from_hf(
        {**plain, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": eps}
    )
    return family, replace(cfg, qk_norm=True), task


def sizes(cfg: GPTConfig, shapes: Shapes) -> list[Size]:
    return llama.sizes(cfg, shapes)


def weights_from_hf(tensors: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """HuggingFace names -> attnlab's GPT state dict."""
    tensors = llama.stack_qkv(tensors, cfg.n_layer)
    ignore = {k for k in tensors if k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_weights:
        ignore.add("lm_head.weight")
    return map_weights(tensors, pairs(cfg), expected_shapes(GPT, cfg), ignore)


def _eps(cfg: GPTConfig) -> str | None:
    """Qwen3's QK-norm divides with the block's rms_norm_eps, attnlab's with QK_EPS: they must agree."""
    if math.isclose(cfg.ln_eps, QK_EPS, rel_tol=1e-6):
        return None
    return f"ln_eps {cfg.ln_eps} (Qwen3's QK-norm shares it; attnlab's is {QK_EPS})"


SUPPORT: dict[str, Rule] = {
    **llama.SUPPORT,
    "qk_norm": Only((True,), "without QK-norm the run is a Llama"),
    "feedforward": Only(("swiglu",), "Qwen3's feed-forward is SwiGLU"),
    "ln_eps": _eps,
    "norm": Only(("pre",), "Qwen3 is pre-norm"),
    "norm_kind": Only(("rmsnorm",), "Qwen3 uses RMSNorm"),
    "bias": Only((False,), "Qwen3 has no biases: train with --no-bias"),
}


def target_name(cfg: GPTConfig) -> str:
    return "Qwen3"


def export_problems(cfg: GPTConfig) -> list[str]:
    """Which of the run's choices a HuggingFace Qwen3 cannot express ([] if it fits)."""
    problems = block_problems(cfg, SUPPORT, "Qwen3")
    problems += field_problems(cfg, {"positions": Only(("rope",), "Qwen3's are rotary")})
    return problems + gpt_head_problems(cfg, "Qwen3")


def config_to_hf(cfg: GPTConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """GPTConfig -> a config.json transformers reads as a Qwen3Config."""
    refuse_unfit("GPT", "Qwen3", export_problems(cfg))
    hf = llama.config_to_hf(replace(cfg, qk_norm=False))
    return hf | {
        "architectures": list(ARCHITECTURES),
        "model_type": "qwen3",
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.n_layer,
    }


def weights_to_hf(state: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """attnlab's GPT state dict -> HuggingFace names: Llama's, and the QK-norm gains."""
    refuse_unfit("GPT", "Qwen3", export_problems(cfg))
    out = llama.weights_to_hf(
        {k: v for k, v in state.items() if not k.endswith(tuple(NORMS))}, replace(cfg, qk_norm=False)
    )
    for ours, theirs, _ in pairs(cfg)[-2 * cfg.n_layer :]:
        out[theirs] = state[ours]
    return out
