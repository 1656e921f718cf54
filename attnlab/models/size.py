"""How big is a model: parameters, FLOPs per token, and memory.

Parameters are counted on a model built on the meta device (shapes only, no memory), so
even gpt3-175b is counted in a second. FLOPs follow Kaplan et al. (2020): a forward pass
costs 2 FLOPs per parameter per token plus 2 * n_layer * context * d_attn for attention
scores, and training (forward + backward) three times that.
"""

from __future__ import annotations

import torch

# The cluster plan moved to models/cluster.py (torch-free, for `attnlab size --help`); its names stay here too.
from attnlab.models.cluster import ClusterConfig as ClusterConfig
from attnlab.models.cluster import cluster_estimate as cluster_estimate
from attnlab.models.cluster import format_cluster as format_cluster
from attnlab.models.gpt import GPT, PAPER_ACTIVE_PARAMS, PAPER_PARAMS, GPTConfig

GB = 1024**3


def count_params(cfg: GPTConfig, active: bool = False) -> tuple[int, int]:
    """(all parameters, non-embedding parameters) of a GPT, built on the meta device; active:
    counting only those one token uses (a mixture of experts runs k of its E experts)."""
    return _counts(_meta_gpt(cfg), active)


def _meta_gpt(cfg: GPTConfig) -> GPT:
    with torch.device("meta"):
        return GPT(cfg)


def _counts(model: GPT, active: bool) -> tuple[int, int]:
    return model.num_params(active=active), model.num_params(non_embedding=True, active=active)


def estimate(cfg: GPTConfig, preset: str | None = None) -> dict:
    model = _meta_gpt(cfg)  # built once, counted both ways
    (params, non_emb), (active, active_non_emb) = _counts(model, False), _counts(model, True)
    d_attn = cfg.n_head * cfg.head_width
    d_kv = (cfg.n_kv_head or cfg.n_head) * cfg.head_width  # grouped-query attention caches fewer heads
    # The matrices a token uses (an untied LM head among them; a tied one added), plus attention.
    head = 2 * cfg.d_model * cfg.vocab_size if cfg.tie_weights else 0
    fwd = 2 * active_non_emb + head + 2 * cfg.n_layer * cfg.context * d_attn
    kv_cache = 2 * cfg.n_layer * cfg.context * d_kv * 2  # keys and values, bf16, batch 1
    # Korthikanti et al. (2022): ~34 bytes per layer per token per d_model of 16-bit
    # activations kept for backward, with a fused attention kernel (no T x T matrix).
    activations = 34 * cfg.n_layer * cfg.context * cfg.d_model
    out = {
        "preset": preset,
        "params": params,
        "non_embedding_params": non_emb,
        "paper_params": PAPER_PARAMS.get(preset or ""),
        "active_params": active,
        "paper_active_params": PAPER_ACTIVE_PARAMS.get(preset or ""),
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
    """One row per model: parameters next to the paper's figure, those one token uses (where fewer:
    a mixture of experts), FLOPs and memory."""
    head = (
        f"{'preset':<14} {'params':>16} {'paper':>8} {'diff':>6} {'active/token':>16} {'train FLOPs/tok':>16} "
        f"{'infer bf16':>11} {'AdamW':>11}"
    )
    rows = [head, "-" * len(head)]
    for e in estimates:
        paper, diff = "", ""
        if e["paper_params"]:
            paper, diff = _short(e["paper_params"]), f"{100 * (e['params'] / e['paper_params'] - 1):+.1f}%"
        active = f"{e['active_params']:,}" if e["active_params"] != e["params"] else ""
        rows.append(
            f"{e['preset']:<14} {e['params']:>16,} {paper:>8} {diff:>6} {active:>16} "
            f"{e['flops_per_token_train']:>16.3e} "
            f"{e['memory_inference_bf16_gb']:>8.2f} GiB {e['memory_train_adamw_gb']:>7.1f} GiB"
        )
    return "\n".join(rows)


def _short(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _active_line(e: dict) -> list[str]:
    """The parameters one token uses, when that is fewer than all (a mixture of experts)."""
    if e["active_params"] == e["params"]:
        return []
    paper = e["paper_active_params"]
    versus = f" (paper: {_short(paper)}, {100 * (e['active_params'] / paper - 1):+.1f}%)" if paper else ""
    return [f"  active per token      {e['active_params']:,}{versus}"]


def format_estimate(e: dict) -> str:
    paper = ""
    if e["paper_params"]:
        paper = f" (paper: {_short(e['paper_params'])}, {100 * (e['params'] / e['paper_params'] - 1):+.1f}%)"
    lines = [
        f"{e['preset'] or 'model'}: {e['n_layer']} layers, d_model {e['d_model']}, {e['n_head']} heads, "
        f"context {e['context']}, vocabulary {e['vocab_size']}",
        f"  parameters            {e['params']:,}{paper}",
        *_active_line(e),
        f"  non-embedding         {e['non_embedding_params']:,}",
        f"  FLOPs per token       {e['flops_per_token_forward']:.3e} forward, "
        f"{e['flops_per_token_train']:.3e} training",
        f"  inference, bf16       {e['memory_inference_bf16_gb']:.3f} GiB (weights + KV cache of one "
        f"{e['context']}-token sequence: {e['kv_cache_per_sequence_gb']:.3f} GiB)",
        f"  AdamW training        {e['memory_train_adamw_gb']:.3f} GiB for weights, gradients and optimizer "
        f"state (16 bytes/param) + {e['activations_per_sequence_gb']:.3f} GiB activations per sequence",
    ]
    return "\n".join(lines)
