"""Helpers shared by the benchmarks: the matched HuggingFace GPT-2 peer, devices, tables.

The peer is `transformers.GPT2LMHeadModel` built locally from a `GPT2Config` of the same shape
as an attnlab `GPTConfig` (nothing is downloaded). `copy_weights_to_hf` gives it attnlab's
weights, so both models compute the same function from the same starting point; the
benchmarks check that their outputs agree before trusting the timings.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
from dataclasses import replace

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from attnlab.interop.hf.gpt2 import weights_to_hf
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runtime.device import DTYPES, pick_device

# HF activations equal to attnlab's "gelu_tanh": "gelu_new" is GPT-2's own, written out as
# elementwise ops; "gelu_pytorch_tanh" calls the same fused kernel attnlab does.
HF_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")


def gpt2_like(cfg: GPTConfig) -> GPTConfig:
    """cfg with GPT-2's block (pre-norm, learned positions, tanh-GELU, biases) and no dropout."""
    return replace(
        cfg,
        activation="gelu_tanh",
        dropout=0.0,
        norm="pre",
        positions="learned",
        bias=True,
        d_head=None,
        tie_weights=True,
    )


def hf_config(cfg: GPTConfig, activation: str = "gelu_new") -> GPT2Config:
    """A GPT2Config of the same shape as a GPT-2-like attnlab config, dropout off, SDPA attention."""
    if cfg != gpt2_like(cfg):
        raise ValueError("the HF peer matches only GPT-2-like configs: pass the config through gpt2_like()")
    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.context,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.ff_width,
        activation_function=activation,
        layer_norm_epsilon=cfg.ln_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,  # GPT-2's 50256 is outside a small vocab
        attn_implementation="sdpa",
    )


@torch.no_grad()
def copy_weights_to_hf(gpt: GPT, hf: GPT2LMHeadModel) -> None:
    """Load attnlab's weights into the peer, through the same mapping `attnlab export --to hf` uses."""
    result = hf.load_state_dict(weights_to_hf(gpt.state_dict(), gpt.cfg), strict=False)
    # The only tensor left out is the LM head, tied to wte (as gpt.head is to gpt.tok).
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not fit the HF peer: {result}")


def build_pair(
    cfg: GPTConfig, device: torch.device, seed: int = 0, hf_activation: str = "gelu_new"
) -> tuple[GPT, GPT2LMHeadModel]:
    """attnlab's GPT (random init, seeded) and the HF peer holding the same weights."""
    cfg = gpt2_like(cfg)
    torch.manual_seed(seed)
    gpt = GPT(cfg).to(device)
    hf = GPT2LMHeadModel(hf_config(cfg, hf_activation)).to(device)
    if hf.config._attn_implementation != "sdpa":
        raise RuntimeError(f"HF peer uses {hf.config._attn_implementation!r} attention, expected 'sdpa'")
    copy_weights_to_hf(gpt, hf)
    if num_params(gpt) != num_params(hf):
        raise RuntimeError(f"shape mismatch: attnlab {num_params(gpt):,} vs HF {num_params(hf):,} parameters")
    return gpt, hf


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when available, else the CPU; anything else as attnlab's pick_device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return pick_device(name)


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}: use {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Hand cached GPU memory back between runs (call after dropping the models)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    """Start counting the device's peak memory afresh (read it with peak_mib)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    """The most memory allocated on the device since reset_peak, in MiB (None on a CPU: not counted)."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where a and b differ (the shorter length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (None: leave as is)")
    parser.add_argument(
        "--hf-activation",
        default="gelu_new",
        choices=HF_ACTIVATIONS,
        help="the peer's GELU, same math as gelu_tanh: GPT-2's own or the fused one",
    )
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for weights and data")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")


def setup(args: argparse.Namespace) -> torch.device:
    """Apply --threads and --seed; return the device to run on."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return resolve_device(args.device)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def columns(spec: str) -> list[tuple[str, str, str]]:
    """A table's columns from one line of text: "key:header:format; ..." (format_table's triples), the
    header defaulting to the key and the format to "" (text, left-aligned), so that a table reads as
    what it shows rather than as ten lines of tuples."""
    out = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        key, header, fmt = (item.split(":") + ["", ""])[:3]
        out.append((key, header or key, fmt))
    return out


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Rows as an aligned text table. columns: (key, header, format spec) triples; a spec of
    "" leaves the value as text, left-aligned; numbers are right-aligned; None is blank."""
    cells = [["" if row.get(key) is None else format(row[key], spec) for key, _, spec in columns] for row in rows]
    headers = [header for _, header, _ in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    left = [spec == "" for _, _, spec in columns]

    def line(values: list[str]) -> str:
        padded = (v.ljust(w) if lf else v.rjust(w) for v, w, lf in zip(values, widths, left, strict=True))
        return "  ".join(padded).rstrip()

    head = line(headers)
    return "\n".join([head, "-" * len(head)] + [line(r) for r in cells])


def cpu_name() -> str:
    """The CPU's model name (lscpu), to print beside every figure."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def cpu_named() -> str:
    """cpu_name() with what tells CPUs sold under one name apart (family, model, stepping) and its widest
    vector instructions: one "AMD EPYC" was a Zen 3 with AVX2 only, another a Zen 4 with AVX-512."""
    from attnlab.runtime.precision import cpu_flags, cpu_identity

    flags = cpu_flags() or set()
    vectors = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile") if f in flags]
    return f"{cpu_identity()}; {' '.join(vectors) or 'no AVX2'}"
