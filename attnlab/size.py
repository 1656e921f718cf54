"""How big is a model: parameters, FLOPs per token, and memory.

Parameters are counted on a model built on the meta device (shapes only, no memory), so
even gpt3-175b is counted in a second. FLOPs follow Kaplan et al. (2020): a forward pass
costs 2 FLOPs per parameter per token plus 2 * n_layer * context * d_attn for attention
scores, and training (forward + backward) three times that.
"""

from __future__ import annotations

import torch

from attnlab.models.gpt import GPT, PAPER_PARAMS, GPTConfig

GB = 1024**3


def count_params(cfg: GPTConfig) -> tuple[int, int]:
    """(all parameters, non-embedding parameters) of a GPT, built on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg)
    return model.num_params(), model.num_params(non_embedding=True)


def estimate(cfg: GPTConfig, preset: str | None = None) -> dict:
    params, non_emb = count_params(cfg)
    d_attn = cfg.n_head * cfg.head_width
    # Non-embedding matrices, plus the LM head's (d_model x vocab) product, plus attention.
    fwd = 2 * non_emb + 2 * cfg.d_model * cfg.vocab_size + 2 * cfg.n_layer * cfg.context * d_attn
    kv_cache = 2 * cfg.n_layer * cfg.context * d_attn * 2  # keys and values, bf16, batch 1
    # Korthikanti et al. (2022): ~34 bytes per layer per token per d_model of 16-bit
    # activations kept for backward, with a fused attention kernel (no T x T matrix).
    activations = 34 * cfg.n_layer * cfg.context * cfg.d_model
    out = {
        "preset": preset,
        "params": params,
        "non_embedding_params": non_emb,
        "paper_params": PAPER_PARAMS.get(preset or ""),
        "n_layer": cfg.n_layer,
        "d_model": cfg.d_model,
        "n_head": cfg.n_head,
        "d_attn": d_attn,
        "context": cfg.context,
        "vocab_size": cfg.vocab_size,
        "flops_per_token_forward": fwd,
        "flops_per_token_train": 3 * fwd,
        # Inference in bf16: 2 bytes per weight, plus the KV cache of one full-context sequence.
        "memory_inference_bf16_gb": (2 * params + kv_cache) / GB,
        "kv_cache_per_sequence_gb": kv_cache / GB,
        # AdamW with bf16 autocast: fp32 weights (4) + fp32 grads (4) + Adam m and v (8).
        "memory_train_adamw_gb": 16 * params / GB,
        "activations_per_sequence_gb": activations / GB,
    }
    return out


def format_table(estimates: list[dict]) -> str:
    """One row per model: parameters next to the paper's figure, FLOPs and memory."""
    head = (
        f"{'preset':<12} {'params':>16} {'paper':>8} {'diff':>6} {'train FLOPs/tok':>16} "
        f"{'infer bf16':>11} {'AdamW':>11}"
    )
    rows = [head, "-" * len(head)]
    for e in estimates:
        paper, diff = "", ""
        if e["paper_params"]:
            paper, diff = _short(e["paper_params"]), f"{100 * (e['params'] / e['paper_params'] - 1):+.1f}%"
        rows.append(
            f"{e['preset']:<12} {e['params']:>16,} {paper:>8} {diff:>6} {e['flops_per_token_train']:>16.3e} "
            f"{e['memory_inference_bf16_gb']:>8.2f} GiB {e['memory_train_adamw_gb']:>7.1f} GiB"
        )
    return "\n".join(rows)


def _short(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def format_estimate(e: dict) -> str:
    paper = (
        f" (paper: {e['paper_params'] / 1e9:.3g}B, {100 * (e['params'] / e['paper_params'] - 1):+.1f}%)"
        if e["paper_params"]
        else ""
    )
    lines = [
        f"{e['preset'] or 'model'}: {e['n_layer']} layers, d_model {e['d_model']}, {e['n_head']} heads, "
        f"context {e['context']}, vocabulary {e['vocab_size']}",
        f"  parameters            {e['params']:,}{paper}",
        f"  non-embedding         {e['non_embedding_params']:,}",
        f"  FLOPs per token       {e['flops_per_token_forward']:.3e} forward, "
        f"{e['flops_per_token_train']:.3e} training",
        f"  inference, bf16       {e['memory_inference_bf16_gb']:.3f} GiB (weights + KV cache of one "
        f"{e['context']}-token sequence: {e['kv_cache_per_sequence_gb']:.3f} GiB)",
        f"  AdamW training        {e['memory_train_adamw_gb']:.3f} GiB for weights, gradients and optimizer "
        f"state (16 bytes/param) + {e['activations_per_sequence_gb']:.3f} GiB activations per sequence",
    ]
    return "\n".join(lines)
