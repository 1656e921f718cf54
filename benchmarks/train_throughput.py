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

--end-to-end adds a second table: how many optimizer steps per second a real run makes, through
the training entry point (`attnlab.train`, as `attnlab train lm` and `attnlab demo` call it, on
the `stdlib` corpus with the demo's settings: its learning rate, warmup, evaluation every 150
steps with up to 20 batches, checkpoints, metrics, plot and progress bar), against the bare step
loop on the same model (the run's own config and optimizer), batch and dtype: forward, loss,
backward, AdamW step, nothing else, on random token ids. The two alternate, --e2e-repeats
times each, after an untimed short run that builds the token cache; ratios are taken pair by
pair and the table shows the medians. Columns:

    bare steps/s   --e2e-steps steps of the bare loop / their seconds
    e2e steps/s    the run's steps / the seconds of its training loop (from the first step to
                   the last checkpoint on disk: what a --time-budget spends, and more)
    e2e/bare       the ratio of the two (issue 16's target: 0.95 or more)
    run/bare       the same with the whole `attnlab.train` call: start-up (tokenizer, token
                   cache, model, step-0 checkpoint) and the end too
    steps, val, ckpt, plot, other   seconds of the training loop in train_step, validation,
                   checkpoints (what the step waits for: the copy, or an earlier write still
                   going), drawing loss.png, and the rest (data is inside steps)
    start          seconds of the call outside the training loop

Run from the repository root:

    .venv/bin/python benchmarks/train_throughput.py                 # everything, default sizes
    .venv/bin/python benchmarks/train_throughput.py --dtypes float32 --models 6x384 --steps 20
    .venv/bin/python benchmarks/train_throughput.py --steps 2 --warmup 1 --batch-size 2  # smoke test
    .venv/bin/python benchmarks/train_throughput.py --end-to-end --skip-peer --models gpt-nano \
        --dtypes float32 --batch-size 32 --e2e-steps 600           # end-to-end against bare
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (
    add_common_args,
    build_pair,
    columns,
    describe,
    dtype_name,
    format_table,
    num_params,
    parse_dtype,
    peak_mib,
    release,
    reset_peak,
    setup,
    synchronize,
)
from torch import Tensor, nn

import attnlab
from attnlab.cli.demo import DEMO_TRAIN
from attnlab.data import DataConfig
from attnlab.engine import loop as loop_mod
from attnlab.engine import train as train_mod
from attnlab.engine.config import TrainConfig
from attnlab.engine.optim import make_optimizer
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs.folder import read_run_config
from attnlab.runtime.device import autocast

LogitsFn = Callable[[nn.Module, Tensor], Tensor]  # (model, ids (B, T)) -> logits (B, T, V)

IMPLS: dict[str, LogitsFn] = {
    "attnlab": lambda model, x: model(x),
    "hf-gpt2": lambda model, x: model(input_ids=x, use_cache=False).logits,
}

COLUMNS = columns(
    "model; impl; dtype; params::,; tokens_per_s:tokens/s:,.0f; ms_per_step:ms/step:,.1f; "
    "loss:step-1 loss:.4f; ratio:attnlab/peer:.2f; mfu:MFU:.3f; peak_mib:peak MiB:,.0f;"
)
# Dense bf16 tensor-core peaks (TFLOP/s) when --peak-tflops is not given, by a part of the GPU's name
# as torch reports it: data-sheet figures without sparsity (the H100's SXM part reports "H100 80GB
# HBM3", its PCIe part "H100 PCIe"). MFU is left blank for another GPU, and in float32.
PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4, "A100": 312.0}

E2E_COLUMNS = columns(
    "model; dtype; batch_size:batch; steps; bare_steps_per_s:bare steps/s:.2f; e2e_steps_per_s:e2e steps/s:.2f; "
    "e2e_ratio:e2e/bare:.3f; run_ratio:run/bare:.3f; steps_s:steps s:.1f; val_s:val s:.2f; ckpt_s:ckpt s:.2f; "
    "plot_s:plot s:.2f; other_s:other s:.2f; start_s:start s:.2f"
)
# The parts of the training loop timed in the end-to-end table: (module attribute, column).
LOOP_PARTS = [
    ("train_step", "steps_s"),
    ("estimate_loss", "val_s"),
    ("save_checkpoint", "ckpt_s"),
    ("plot_loss", "plot_s"),
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


def flops_per_token(cfg: GPTConfig, params: int) -> float:
    """A training step's FLOPs per token for a model of `params` parameters (tied ones counted once),
    as PaLM's appendix B counts them: 6 per weight that multiplies (every parameter but the position
    table; the tied head counted once, as the token table it is) and 12 * layers * width * context for
    attention's two matrix products."""
    params -= cfg.context * cfg.d_model if cfg.positions == "learned" else 0
    return 6 * params + 12 * cfg.n_layer * cfg.d_model * cfg.context


def peak_tflops(device: torch.device, dtype: torch.dtype, given: float | None) -> float | None:
    """The peak MFU is measured against: --peak-tflops, else the GPU's dense bf16 peak (bf16 only)."""
    if given:
        return given
    if device.type != "cuda" or dtype != torch.bfloat16:
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


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
        reset_peak(device)
        seconds, loss = measure(model, logits_fn, batch, device, dtype, args.warmup, args.steps)
        tokens = args.batch_size * cfg.context
        peak, params = peak_tflops(device, dtype, args.peak_tflops), num_params(models[impl])
        rows.append(
            {
                "model": name,
                "impl": impl,
                "dtype": dtype_name(dtype) + (" compiled" if args.compile else ""),
                "device": describe(device),
                "params": params,
                "batch_size": args.batch_size,
                "seq_len": cfg.context,
                "tokens_per_s": tokens / seconds,
                "ms_per_step": seconds * 1e3,
                "loss": loss,
                "ratio": None,
                "mfu": flops_per_token(cfg, params) * tokens / seconds / (peak * 1e12) if peak else None,
                "peak_mib": peak_mib(device),
            }
        )
        del models[impl], model  # free its memory (and its optimizer's) before the next impl runs
        release(device)
    rows[0]["ratio"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    return rows


def e2e_model(name: str) -> GPTConfig:
    """The model of an end-to-end run: a preset, or 6x384 (its vocab_size follows the tokenizer)."""
    return model_config(name, 256) if name == "6x384" else GPTConfig.from_preset(name)


@contextlib.contextmanager
def timed_parts(seconds: dict[str, float]):
    """Add the time spent in each of LOOP_PARTS, while the training loop runs (not the step-0
    checkpoint before it), to seconds[column]."""
    inside = [False]

    def timer(f, column):
        @functools.wraps(f)
        def timed(*a, **kw):
            start = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                if inside[0]:
                    seconds[column] += time.perf_counter() - start

        return timed

    def the_loop(*a, **kw):
        inside[0] = True
        try:
            return real_loop(*a, **kw)
        finally:
            inside[0] = False

    saved = {name: getattr(loop_mod, name) for name, _ in LOOP_PARTS}
    real_loop = train_mod.loop
    try:
        for name, column in LOOP_PARTS:
            setattr(loop_mod, name, timer(saved[name], column))
        train_mod.loop = the_loop
        yield
    finally:
        for name, f in saved.items():
            setattr(loop_mod, name, f)
        train_mod.loop = real_loop


def run_e2e(model: GPTConfig, train: TrainConfig, out: Path) -> dict[str, float]:
    """One real run into `out` (its progress bar and printed lines to /dev/null): its seconds, in
    all and by part."""
    seconds: dict[str, float] = defaultdict(float)
    with (
        open(os.devnull, "w") as null,
        contextlib.redirect_stderr(null),
        contextlib.redirect_stdout(null),
        timed_parts(seconds),
    ):
        start = time.perf_counter()
        result = attnlab.train(out, model, train, DataConfig("stdlib"), progress=True)
        seconds["run_s"] = time.perf_counter() - start
    seconds["loop_s"] = result["train_seconds"]
    seconds["start_s"] = seconds["run_s"] - seconds["loop_s"]
    seconds["other_s"] = seconds["loop_s"] - sum(seconds[c] for _, c in LOOP_PARTS)
    return seconds


def bare_seconds(model: GPTConfig, train: TrainConfig, device: torch.device, dtype: torch.dtype, seed: int) -> float:
    """Seconds of train.max_steps bare steps: the run's model and optimizer, forward, loss, backward,
    AdamW step, on random ids of the run's batch shape."""
    torch.manual_seed(seed)
    gpt = GPT(model).to(device)
    gpt.train()
    opt = make_optimizer(gpt, train)
    ids = torch.randint(0, model.vocab_size, (train.batch_size, model.context + 1)).to(device)
    x, y = ids[:, :-1], ids[:, 1:]

    def step() -> float:
        with autocast(device, dtype):
            _, loss = gpt(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step()  # the first step allocates AdamW's moments
    synchronize(device)
    start = time.perf_counter()
    for _ in range(train.max_steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


def bench_e2e(name: str, dtype: torch.dtype, device: torch.device, args: argparse.Namespace) -> dict:
    """End-to-end runs and bare loops of one model in one dtype, alternating: one table row."""
    model = e2e_model(name)
    train = TrainConfig(
        **{
            **DEMO_TRAIN,
            "max_steps": args.e2e_steps,
            "batch_size": args.batch_size,
            "dtype": dtype_name(dtype),
            "device": str(device),
            "seed": args.seed,
        }
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "warmup"  # builds the token cache; gives the model's vocab_size
        run_e2e(model, TrainConfig(**{**asdict(train), "max_steps": 2}), first)
        model = GPTConfig(**read_run_config(first)["model"])
        for i in range(args.e2e_repeats):
            e2e = run_e2e(model, train, Path(tmp) / f"run{i}")
            bare = bare_seconds(model, train, device, dtype, args.seed)
            rows.append({**e2e, "bare_s": bare})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    steps = args.e2e_steps
    return {
        "model": name,
        "dtype": dtype_name(dtype),
        "device": describe(device),
        "batch_size": args.batch_size,
        "steps": steps,
        "bare_steps_per_s": steps / med["bare_s"],
        "e2e_steps_per_s": steps / med["loop_s"],
        "e2e_ratio": statistics.median(r["bare_s"] / r["loop_s"] for r in rows),
        "run_ratio": statistics.median(r["bare_s"] / r["run_s"] for r in rows),
        **{k: med[k] for _, k in LOOP_PARTS},
        "other_s": med["other_s"],
        "start_s": med["start_s"],
        "pairs": rows,
    }


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
    p.add_argument("--end-to-end", action="store_true", help="also: real runs against the bare loop (see above)")
    p.add_argument("--skip-peer", action="store_true", help="leave out the attnlab-vs-HF table")
    p.add_argument("--e2e-steps", type=int, default=300, help="steps of each end-to-end run and bare loop")
    p.add_argument("--e2e-repeats", type=int, default=3, help="end-to-end runs (and bare loops), alternating")
    p.add_argument("--peak-tflops", type=float, default=None, help="the peak for MFU (default: the GPU's bf16 one)")
    add_common_args(p)
    args = p.parse_args(argv)
    if min(args.steps, args.warmup, args.batch_size, args.e2e_steps, args.e2e_repeats) < 1:
        p.error("--steps, --warmup, --batch-size, --e2e-steps and --e2e-repeats must be at least 1")
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
        for dtype in args.dtypes if not args.skip_peer else []:
            rows += bench_pair(name, cfg, dtype, device, args)
    e2e = [bench_e2e(name, dtype, device, args) for name in configs for dtype in args.dtypes] if args.end_to_end else []
    if args.json:
        print(json.dumps(rows + e2e, indent=1))
        return
    if rows:
        print(format_table(rows, COLUMNS))
    if e2e:
        print(
            f"\nend-to-end (attnlab.train on stdlib, the demo's settings) against the bare loop, "
            f"median of {args.e2e_repeats} alternating pairs:"
        )
        print(format_table(e2e, E2E_COLUMNS))


if __name__ == "__main__":
    main()
