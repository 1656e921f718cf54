"""The plan of a training run on a cluster: memory per GPU under DDP and FSDP, and the days it takes,
from a model's size (models/size.py's `estimate`). Torch-free, so that `attnlab size --help`, whose
flags ClusterConfig makes, starts without it."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import option


@dataclass
class ClusterConfig:
    """The hardware a run is planned for."""

    devices: int = option(8, "number of GPUs")
    gpu_tflops: float = option(989.0, "peak dense bf16 TFLOP/s of one GPU (H100/H200 SXM: 989; A100: 312)")
    mfu: float = option(0.4, "model FLOPs utilization: the share of the peak training reaches")
    tokens: float | None = option(None, "training tokens (default: 20 per parameter, Chinchilla-optimal)")
    micro_batch: int = option(1, "sequences per GPU per micro-step (activations scale with it)")

    def __post_init__(self):
        if self.devices < 1 or self.gpu_tflops <= 0 or not 0 < self.mfu <= 1 or self.micro_batch < 1:
            raise ValueError("devices and micro_batch must be >= 1, gpu_tflops > 0 and mfu in (0, 1]")


def cluster_estimate(e: dict, c: ClusterConfig) -> dict:
    """Memory per GPU under DDP and FSDP, and the time to train, for an `estimate` result.

    DDP keeps a full replica of weights, gradients and AdamW state (16 bytes/param) on every
    GPU; FSDP shards those 16 bytes over the GPUs and gathers one block's bf16 weights at a
    time (twice, to overlap the next gather). Both add the activations of a micro-batch.
    """
    gib = 1024**3
    params = e["params"]
    states = e["memory_train_adamw_gb"] * gib
    activations = e["activations_per_sequence_gb"] * gib * c.micro_batch
    block = e["non_embedding_params"] / e["n_layer"]
    tokens = c.tokens or 20 * params
    flops = e["flops_per_token_train"] * tokens
    seconds = flops / (c.devices * c.gpu_tflops * 1e12 * c.mfu)
    return {
        "devices": c.devices,
        "ddp_memory_per_device_gb": (states + activations) / gib,
        "fsdp_memory_per_device_gb": (states / c.devices + 2 * 2 * block + activations) / gib,
        "train_tokens": tokens,
        "train_flops": flops,
        "train_days": seconds / 86400,
        "gpu_tflops": c.gpu_tflops,
        "mfu": c.mfu,
    }


def format_cluster(e: dict, c: dict) -> str:
    return "\n".join(
        [
            f"  on {c['devices']} GPUs   DDP {c['ddp_memory_per_device_gb']:.1f} GiB/GPU, "
            f"FSDP {c['fsdp_memory_per_device_gb']:.1f} GiB/GPU",
            f"  training on {c['train_tokens']:.3g} tokens: {c['train_flops']:.3g} FLOPs, "
            f"{_duration(c['train_days'])} at {c['gpu_tflops']:g} TFLOP/s per GPU and {c['mfu']:.0%} utilization",
        ]
    )


def _duration(days: float) -> str:
    return f"{days:.3g} days" if days >= 1 else f"{days * 24:.3g} hours"
