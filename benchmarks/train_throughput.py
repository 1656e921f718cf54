"""Training throughput: attnlab's GPT against HuggingFace's GPT2LMHeadModel of the same shape.

One training step is forward + cross-entropy + backward + torch.optim.AdamW step, on a batch
of random token ids (B sequences of the model's full context T). Each (model, dtype, impl)
gets a fresh model and optimizer, `--warmup` untimed steps, then `--steps` timed ones;
tokens/s = B * T / median step time (the median shrugs off a stray slow step). Both impls
see the same batch, start from the same weights (copied from attnlab's random init into the
peer) and compute the loss the same way, so their step-1 losses agree.

Models: "gpt-nano" (attnlab's preset, vocab 256, context 256) and "6x384" (6 layers, 384
wide, 6 heads, context 256, vocab --vocab). Both are built with activation="gelu_tanh" and
no dropout; the peer uses GELU "gelu_new" (the same math; see --hf-activation), SDPA attention
and no dropout. dtypes: float32, and bfloat16 under torch.autocast (weights stay float32).
bf16 is very slow on CPUs without native bf16 instructions (AVX512-BF16/AMX): that is part of
what is measured.

Run from the repository root:

    .venv/bin/python benchmarks/train_throughput.py                 # everything, default sizes
    .venv/bin/python benchmarks/train_throughput.py --dtypes float32 --models 6x384 --steps 20
    .venv/bin/python benchmarks/train_throughput.py --steps 2 --warmup 1 --batch-size 2  # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import (
    add_common_args,
    build_pair,
    describe,
    dtype_name,
    format_table,
    num_params,
    parse_dtype,
    release,
    setup,
    synchronize,
)
from torch import Tensor, nn

from attnlab.engine.device import autocast
from attnlab.models.gpt import GPTConfig

LogitsFn = Callable[[nn.Module, Tensor], Tensor]  # (model, ids (B, T)) -> logits (B, T, V)

IMPLS: dict[str, LogitsFn] = {
    "attnlab": lambda model, x: model(x),
    "hf-gpt2": lambda model, x: model(input_ids=x, use_cache=False).logits,
}

COLUMNS = [
    ("model", "model", ""),
    ("impl", "impl", ""),
    ("dtype", "dtype", ""),
    ("params", "params", ","),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("ms_per_step", "ms/step", ",.1f"),
    ("loss", "step-1 loss", ".4f"),
    ("ratio", "attnlab/peer", ".2f"),
]


def model_config(name: str, vocab: int) -> GPTConfig:
    """'6x384' is 6 layers, 384 wide, 6 heads, context 256; anything else is an attnlab preset."""
    if name == "6x384":
        return GPTConfig(n_layer=6, n_head=6, d_model=384, context=256, vocab_size=vocab)
    try:
        return GPTConfig.from_preset(name, vocab_size=vocab)
    except KeyError:
        raise SystemExit(f"unknown model {name!r}: use 6x384 or an attnlab preset such as gpt-nano") from None


def train_step(
    model: nn.Module,
    logits_fn: LogitsFn,
    opt: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """One forward + backward + AdamW step; returns the loss."""
    with autocast(device, dtype):
        logits = logits_fn(model, x)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()  # waits for the device, so the step's time is all in


def measure(
    model: nn.Module,
    logits_fn: LogitsFn,
    batch: Tensor,
    device: torch.device,
    dtype: torch.dtype,
    warmup: int,
    steps: int,
) -> tuple[float, float]:
    """(median seconds per timed step, loss of the first step)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = batch[:, :-1], batch[:, 1:]
    first_loss = train_step(model, logits_fn, opt, x, y, device, dtype)
    for _ in range(warmup - 1):
        train_step(model, logits_fn, opt, x, y, device, dtype)
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        train_step(model, logits_fn, opt, x, y, device, dtype)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), first_loss


def bench_pair(
    name: str, cfg: GPTConfig, dtype: torch.dtype, device: torch.device, args: argparse.Namespace
) -> list[dict]:
    """Both impls of one model in one dtype: two rows, the attnlab one carrying the ratio."""
    gen = torch.Generator().manual_seed(args.seed)
    batch = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.context + 1), generator=gen).to(device)
    models = dict(zip(IMPLS, build_pair(cfg, device, args.seed, args.hf_activation), strict=True))
    rows = []
    for impl, logits_fn in IMPLS.items():
        model = models[impl]
        if args.compile:  # what attnlab's --compile does; compiling happens in the warmup steps
            model = torch.compile(model)
        seconds, loss = measure(model, logits_fn, batch, device, dtype, args.warmup, args.steps)
        tokens = args.batch_size * cfg.context
        rows.append(
            {
                "model": name,
                "impl": impl,
                "dtype": dtype_name(dtype) + (" compiled" if args.compile else ""),
                "device": describe(device),
                "params": num_params(models[impl]),
                "batch_size": args.batch_size,
                "seq_len": cfg.context,
                "tokens_per_s": tokens / seconds,
                "ms_per_step": seconds * 1e3,
                "loss": loss,
                "ratio": None,
            }
        )
        del models[impl], model  # free its memory (and its optimizer's) before the next impl runs
        release(device)
    rows[0]["ratio"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (each of the model's context)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (at least 1)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16 (autocast)")
    p.add_argument("--models", default="gpt-nano,6x384", help="comma-separated: 6x384 or attnlab presets")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary of the 6x384 model")
    p.add_argument("--compile", action="store_true", help="torch.compile both models (give --warmup 3 or more)")
    add_common_args(p)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1 or args.batch_size < 1:
        p.error("--steps, --warmup and --batch-size must be at least 1")
    try:
        args.dtypes = [parse_dtype(d.strip()) for d in args.dtypes.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    args.models = [m.strip() for m in args.models.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = setup(args)
    configs = {name: model_config(name, args.vocab) for name in args.models}
    if not args.json:
        print(
            f"device {describe(device)}, batch {args.batch_size}, {args.warmup} warmup + {args.steps} timed "
            f"steps (median), AdamW, HF activation {args.hf_activation}",
            flush=True,
        )
    rows = []
    for name, cfg in configs.items():
        for dtype in args.dtypes:
            rows += bench_pair(name, cfg, dtype, device, args)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
