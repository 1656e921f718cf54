"""Training: AdamW, warmup + cosine schedule, clipping, accumulation, checkpoints, resume.

train(out, GPTConfig(...), TrainConfig(...), DataConfig(...))
  -> prepare the run directory, tokenizer and token cache
  -> loop: train_step (forward/backward over micro-batches, clip, AdamW step)
           every eval_interval: validation loss, metrics, plot, checkpoint
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from attnlab.engine import rundir as ck
from attnlab.engine import distributed
from attnlab.config import from_dict, option
from attnlab.data import DataConfig, TokenData, build_token_cache, read_texts, resolve_sources, workers_for
from attnlab.data.batches import Batches, Windows
from attnlab.engine.device import autocast, pick_dtype
from attnlab.engine.distributed import Dist
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.engine.optim import apply_settings, lr_at, make_optimizer
from attnlab.data.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from attnlab.viz.curves import plot_loss, read_metrics


@dataclass
class TrainConfig:
    max_steps: int = option(2000, "optimizer steps to train for")
    batch_size: int = option(32, "sequences per optimizer step (the global batch)")
    grad_accum: int = option(1, "micro-batches per step, each of batch_size / grad_accum sequences")
    block_size: int | None = option(None, "tokens per training sequence (default: the model's context)")
    lr: float = option(3e-3, "peak learning rate")
    min_lr: float | None = option(None, "learning rate at the end of the cosine decay (default lr / 10)")
    warmup_steps: int = option(100, "steps of linear warmup from 0 to lr")
    schedule: str = option("cosine", "after warmup: cosine decay to min_lr, or the Transformer paper's "
                           "inverse square root of the step", ("cosine", "inverse_sqrt"))  # fmt: skip
    weight_decay: float = option(0.1, "AdamW weight decay, on weight matrices only")
    beta1: float = option(0.9, "AdamW beta1")
    beta2: float = option(0.95, "AdamW beta2")
    grad_clip: float = option(1.0, "clip the gradients' global norm to this (0 = off)")
    eval_interval: int = option(250, "steps between validation-loss estimates and checkpoints")
    eval_batches: int = option(20, "batches per validation-loss estimate")
    seed: int = option(1337, "random seed (initialization, batches, dropout)")
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps")
    parallel: str = option("ddp", "with several processes: replicate the model (ddp) or shard it (fsdp)",
                           ("ddp", "fsdp"))  # fmt: skip
    compile: bool = option(False, "run the model through torch.compile (slower first steps, faster after)")
    grad_checkpoint: bool = option(False, "recompute activations in backward: less memory, ~1/3 more compute")
    dtype: str = option("auto", "auto (bf16 where fast), float32 or bfloat16", ("auto", "float32", "bfloat16"))

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_steps < 0 or self.warmup_steps < 0 or self.lr <= 0:
            raise ValueError("max_steps and warmup_steps must be >= 0 and lr > 0")
        if self.schedule not in ("cosine", "inverse_sqrt"):
            raise ValueError(f"schedule must be cosine or inverse_sqrt, got {self.schedule!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")


@dataclass
class Session:
    """Everything the loop needs, prepared by `prepare`."""

    run: Path
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: Batches
    cfg: TrainConfig
    device: torch.device
    dtype: torch.dtype
    rng: np.random.Generator
    step: int = 0
    interrupted: bool = False  # Ctrl-C arrived while it could not be acted on
    dist: Dist = field(default_factory=Dist)
    raw: nn.Module | None = None  # the model itself, without the DDP or compile wrappers
    command: str = "lm"  # the `attnlab train` subcommand that continues this run


def train_step(s: Session) -> float:
    """One optimizer step over grad_accum micro-batches; returns the mean loss."""
    s.model.train()
    micro = s.cfg.batch_size // s.cfg.grad_accum  # sequences per micro-batch, all processes together
    total = 0.0
    for i in range(s.cfg.grad_accum):
        batch = s.data.batch("train", micro, s.rng, (s.dist.rank, s.dist.world))
        batch = [t.to(s.device, non_blocking=True) for t in batch]
        # Under DDP, gradients are averaged across processes only after the last micro-batch.
        last = i == s.cfg.grad_accum - 1
        if s.cfg.parallel == "fsdp":
            s.raw.set_requires_gradient_sync(last)
        ddp = s.dist.enabled and s.cfg.parallel == "ddp"
        with s.model.no_sync() if ddp and not last else contextlib.nullcontext():
            with autocast(s.device, s.dtype):
                _, loss = s.model(*batch)  # every model: forward(inputs..., labels) -> (output, loss)
            (loss / s.cfg.grad_accum).backward()
        total += loss.item()
    if s.cfg.grad_clip > 0:
        clip_gradients(list(s.model.parameters()), s.cfg.grad_clip)
    for group in s.optimizer.param_groups:
        group["lr"] = lr_at(s.step, s.cfg)
    with deferred_interrupt(s):  # the update and the step count change together, or not at all
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        s.step += 1
    return distributed.mean(s.dist, total / s.cfg.grad_accum, s.device)


def clip_gradients(params: list[nn.Parameter], max_norm: float) -> float:
    """Scale gradients so that their global norm is at most max_norm; returns that norm.

    Under FSDP each process holds a shard of every gradient, and the norm must be taken over
    all shards (the full tensor), not over this process's part.
    """
    norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm.item()


@contextlib.contextmanager
def deferred_interrupt(s: Session):
    """Hold back Ctrl-C during the block: it sets s.interrupted, which the loop acts on once
    the step is logged (main thread only; elsewhere Ctrl-C is not ours to catch)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *a: setattr(s, "interrupted", True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@torch.no_grad()
def estimate_loss(s: Session, split: str = "val") -> float:
    """Mean loss over eval_batches random batches, drawn from a fixed seed so that every
    estimate in a run looks at the same text (and the training RNG is left alone)."""
    s.model.eval()
    rng = np.random.default_rng(s.cfg.seed + 1)
    losses = []
    part = (s.dist.rank, s.dist.world)
    for _ in range(s.cfg.eval_batches):
        batch = s.data.batch(split, s.cfg.batch_size // s.cfg.grad_accum, rng, part)
        with autocast(s.device, s.dtype):
            _, loss = s.model(*[t.to(s.device) for t in batch])
        losses.append(loss.item())
    return distributed.mean(s.dist, sum(losses) / len(losses), s.device)


def _check_dir(out: Path, resume: bool, force: bool) -> None:
    if resume:
        ck.check_run_dir(out)
        return
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise AttnlabError(f"run directory {out} already exists: use --resume to continue it or --force to replace it")
    if not (out / ck.CONFIG).is_file():  # --force replaces runs, never other folders
        raise AttnlabError(f"{out} is not an attnlab run directory: refusing to replace it; choose another --out")


def _fresh_dir(out: Path) -> None:
    """Called once the new run is ready to be written, so a failed start never costs an old run."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    out.mkdir(parents=True)


def prepare(
    out: str | Path,
    model_cfg: GPTConfig | None,
    cfg: TrainConfig,
    data: DataConfig,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    init: str | Path | None = None,
) -> Session:
    """Run directory, tokenizer, token cache, model and optimizer, ready for `loop`. Under
    torchrun, rank 0 writes every file and the other ranks read what it wrote. `init`: a GPT
    run to fine-tune, whose model config, weights and tokenizer the new run starts from."""
    world = distributed.world_size()
    if cfg.batch_size % (cfg.grad_accum * world):
        raise AttnlabError(
            f"batch_size {cfg.batch_size} does not split into {cfg.grad_accum} micro-batches on {world} processes"
        )
    if init is not None and resume:
        raise AttnlabError("--init starts a new run and --resume continues one: give only one of them")
    d, device = distributed.init(cfg.device)
    run = Path(out)
    _check_dir(run, resume, force)
    files = resolve_sources(data.data, data.glob)
    tok = None
    if resume:
        saved = ck.read_run_config(run)
        model_cfg, init = from_dict(GPTConfig, saved["model"], where="model config"), saved.get("init")
    elif init is not None:  # fine-tuning: the init run's model, and the tokens it learned
        model_cfg, tok = init_model(init, model_cfg), load_tokenizer(init)
        data = replace(data, tokenizer=tok.kind, vocab_size=tok.vocab_size)
        if tok.vocab_size > model_cfg.vocab_size:
            raise AttnlabError(
                f"--init {init}: its tokenizer has {tok.vocab_size} tokens, its model {model_cfg.vocab_size}"
            )
    model_cfg = model_cfg or GPTConfig()
    block_size = checked_block_size(cfg, model_cfg.context)  # before any slow work
    if not resume:
        # A fine-tuned model keeps its vocab_size (a checkpoint's may exceed its tokenizer's).
        sized = (lambda t: model_cfg) if tok is not None else (lambda t: replace(model_cfg, vocab_size=t.vocab_size))
        new_run(run, files, data, d, progress, lambda t: _config(sized(t), cfg, data, init), tok)
        model_cfg = from_dict(GPTConfig, ck.read_run_config(run)["model"], where="model config")
    _, tokens = run_tokens(run, files, data, d, progress)
    tokens.check(block_size)
    batches = Windows(tokens, block_size)
    weights = Path(init) / ck.WEIGHTS if init is not None and not resume else None  # a resume has its own
    build = partial(_build, model_cfg, weights)
    return start(run, build, batches, cfg, _config(model_cfg, cfg, data, init), d, device, resume)


def _build(model_cfg: GPTConfig, weights: Path | None) -> GPT:
    """A GPT initialized from the seed, or (fine-tuning) loaded from `weights`."""
    model = GPT(model_cfg)
    if weights is not None:
        ck.load_weights(model, weights)
    return model


def init_model(init: str | Path, model_cfg: GPTConfig | None = None) -> GPTConfig:
    """The model config of the GPT run `init`, with model_cfg's dropout; any other difference
    (but vocab_size, which the tokenizer sets) is an error: the weights have their shape."""
    config = ck.read_run_config(ck.check_run_dir(init))
    if config["family"] != "gpt":
        what = config.get("task", {}).get("kind") or config["family"]
        raise AttnlabError(f"--init {init} is a {what} run: fine-tuning a language model needs a gpt run")
    base = from_dict(GPTConfig, config["model"], where=f"{Path(init) / ck.CONFIG} model")
    if model_cfg is None:
        return base
    changed = [k for k, v in asdict(model_cfg).items() if k not in ("dropout", "vocab_size") and v != getattr(base, k)]
    if changed:
        raise AttnlabError(f"the model of --init {init} is fixed (only dropout can change), not {', '.join(changed)}")
    return replace(base, dropout=model_cfg.dropout)


def checked_block_size(cfg: TrainConfig, context: int) -> int:
    """Tokens per training sequence: --block-size, or the model's whole context (never beyond it)."""
    block_size = cfg.block_size or context
    if block_size > context:
        raise AttnlabError(f"block size {block_size} is beyond the model's context of {context}")
    return block_size


def new_run(
    run: Path,
    files: list[Path],
    data: DataConfig,
    d: Dist,
    progress: bool,
    config_for: Callable[[Tokenizer], dict],
    tok: Tokenizer | None = None,
) -> None:
    """Start a run directory on a corpus: train the tokenizer (unless given one: fine-tuning keeps
    its model's) and build the token cache (both may fail, so before --force replaces an old run),
    then write tokenizer.json and config.json (config_for(tokenizer)). Rank 0 does the work; the
    other processes wait for it."""
    with distributed.main_first(d):
        if d.main:
            if tok is None:
                texts = read_texts(files, "reading the corpus" if progress else None)
                tok = train_tokenizer(data.tokenizer, texts, data.vocab_size, workers_for(files))
            build_token_cache(files, tok, data.val_fraction, progress)
            _fresh_dir(run)
            ck.write_text(run / ck.TOKENIZER, tok.to_json())
            ck.write_json(run / ck.CONFIG, config_for(tok))


def run_tokens(run: Path, files: list[Path], data: DataConfig, d: Dist, progress: bool) -> tuple[Tokenizer, TokenData]:
    """The run's tokenizer, and the token cache of `files` under it (built by rank 0 if missing;
    for a run that new_run just started, found at once)."""
    tok = load_tokenizer(run)
    with distributed.main_first(d):
        return tok, TokenData(build_token_cache(files, tok, data.val_fraction, progress and d.main))


def _config(model_cfg: GPTConfig, cfg: TrainConfig, data: DataConfig, init: str | Path | None = None) -> dict:
    config = {"family": "gpt", "model": asdict(model_cfg), "train": asdict(cfg), "data": asdict(data)}
    return {**config, "init": str(init)} if init is not None else config  # the run it was fine-tuned from


def start(
    run: Path,
    build: Callable[[], nn.Module],
    data: Batches,
    cfg: TrainConfig,
    config: dict,
    d: Dist,
    device: torch.device,
    resume: bool,
    command: str = "lm",
) -> Session:
    """What every task shares once its data is ready: the model (built from the seed, or the
    run's checkpoint), sharding, optimizer, the step-0 checkpoint, DDP and compile wrappers.
    `config` is written as the run's config.json (family, model, train and the task's data)."""
    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    model = build().to(device)
    model.grad_checkpoint = cfg.grad_checkpoint
    rng = np.random.default_rng(cfg.seed)
    state = ck.load_train_state(run / ck.STATE, rng) if resume else None
    if state is not None:
        ck.load_state(model, state.weights, run / ck.STATE)  # whole weights, before any sharding
    if cfg.parallel == "fsdp":  # each process keeps 1/world of every block's parameters
        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
    s = Session(run, model, make_optimizer(model, cfg), data, cfg, device,
                pick_dtype(cfg.dtype, device), rng, dist=d, raw=model, command=command)  # fmt: skip
    if state is not None:
        if state.optimizer["state"]:  # empty at step 0: a fresh optimizer is that state
            options = StateDictOptions(full_state_dict=True)
            set_optimizer_state_dict(model, s.optimizer, state.optimizer, options=options)
        apply_settings(s.optimizer, cfg)
        s.step = state.step
    if d.main and resume:
        _truncate_metrics(run / "metrics.jsonl", s.step)
    if d.main:
        ck.write_json(run / ck.CONFIG, config)  # the settings in force (a resume may change some)
    if not resume:
        save_checkpoint(s)  # step 0: from here on the run directory is complete and resumable
    if d.enabled and cfg.parallel == "ddp":  # gradients averaged over processes in backward
        s.model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        s.model = torch.compile(s.model)
    return s


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the checkpoint we resume from, so curves do not double back."""
    rows = [r for r in read_metrics(path) if r["step"] <= step]
    ck.write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def save_checkpoint(s: Session) -> None:
    """Whole weights and optimizer state (every process takes part in gathering them under
    FSDP); rank 0 writes them, as a run any number of processes can load or resume."""
    weights = ck.model_weights(s.raw)
    if s.optimizer.state:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer = get_optimizer_state_dict(s.raw, s.optimizer, options=options)
    else:  # before the first step; asking torch would run a zero step and shift AdamW's step count
        names = {id(p): n for n, p in s.raw.named_parameters()}
        groups = [{**g, "params": [names[id(p)] for p in g["params"]]} for g in s.optimizer.param_groups]
        optimizer = {"state": {}, "param_groups": groups}
    if s.dist.main:
        ck.save_train_state(s.run / ck.STATE, ck.TrainState(s.step, weights, optimizer), s.rng)
        ck.write_weights(weights, s.run / ck.WEIGHTS, metadata={"step": str(s.step)})
    distributed.barrier(s.dist)


def _log(s: Session, row: dict) -> None:
    if s.dist.main:
        with open(s.run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def _evaluate(s: Session, bar: tqdm, recent: list[float]) -> float | None:
    val = estimate_loss(s) if s.data.has("val") else None
    train = sum(recent) / len(recent) if recent else float("nan")
    if val is not None:
        _log(s, {"step": s.step, "val_loss": val})
    if s.dist.main:
        bar.write(f"step {s.step:>6} | train loss {train:.4f} | val loss {val if val is None else round(val, 4)}")
        plot_loss(s.run / "metrics.jsonl", s.run / "loss.png")
    save_checkpoint(s)
    return val


def rng_snapshot(s: Session) -> dict:
    state = {"step": s.step, "numpy": s.rng.bit_generator.state, "torch": torch.get_rng_state()}
    if s.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(s.device)
    return state


def restore_rng(s: Session, state: dict) -> None:
    s.rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], s.device)


def loop(s: Session, progress: bool = True) -> dict:
    """Train from s.step to max_steps; on Ctrl-C save a checkpoint and stop cleanly."""
    cfg = s.cfg
    n_params = sum(p.numel() for p in s.model.parameters())
    procs = f" x {s.dist.world} processes" if s.dist.enabled else ""
    if s.dist.main:
        print(
            f"model {n_params / 1e6:.2f}M parameters | {s.data.describe()} | "
            f"{s.device.type}{procs} {str(s.dtype).removeprefix('torch.')} | batch {cfg.batch_size}",
            file=sys.stderr,
        )
    bar = tqdm(total=cfg.max_steps, initial=s.step, desc="training", unit="step",
               disable=not (progress and s.dist.main), dynamic_ncols=True)  # fmt: skip
    items, unit = s.data.per_example  # tokens (or examples) in each sequence of a batch
    items_per_step = cfg.batch_size * items
    recent: list[float] = []
    val = None
    # RNG states after the last completed step: if Ctrl-C lands mid-step, that step is undone.
    snapshot = rng_snapshot(s)
    try:
        while s.step < cfg.max_steps:
            t0 = time.perf_counter()
            loss = train_step(s)
            dt = time.perf_counter() - t0
            snapshot = rng_snapshot(s)
            recent = (recent + [loss])[-50:]
            _log(s, {"step": s.step, "loss": loss, "lr": lr_at(s.step - 1, cfg), f"{unit}_per_s": items_per_step / dt})
            bar.set_postfix({"loss": f"{loss:.3f}", f"{unit[:3]}/s": f"{items_per_step / dt:,.0f}"}, refresh=False)
            bar.update(1)
            if s.step % cfg.eval_interval == 0 or s.step == cfg.max_steps:
                val = _evaluate(s, bar, recent)
            if s.interrupted:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        bar.close()
        if snapshot["step"] == s.step:  # interrupted before the update: forget the partial step
            restore_rng(s, snapshot)
        s.optimizer.zero_grad(set_to_none=True)
        save_checkpoint(s)
        if s.dist.main:
            plot_loss(s.run / "metrics.jsonl", s.run / "loss.png")
        raise AttnlabError(
            f"interrupted at step {s.step}; saved. Continue with: attnlab train {s.command} --out {s.run} --resume"
        ) from None
    bar.close()
    return {"step": s.step, "val_loss": val, "train_loss": sum(recent) / max(1, len(recent))}


def train(
    out: str | Path,
    model: GPTConfig | None = None,
    train: TrainConfig | None = None,
    data: DataConfig | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    init: str | Path | None = None,
) -> dict:
    """Train a GPT language model into the run directory `out`; returns final losses.

    The same dataclasses the command line is generated from: GPTConfig, TrainConfig, DataConfig.
    `init`: fine-tune the GPT run there (its model config, weights and tokenizer; `model`, if
    given, may differ from its config in dropout only).
    """
    if resume:  # settings not given are the run's own
        saved = ck.read_run_config(ck.check_run_dir(out))
        train = train or from_dict(TrainConfig, saved["train"], where="train config")
        data = data or from_dict(DataConfig, saved["data"], where="data config")
    s = prepare(out, model, train or TrainConfig(), data or DataConfig(), resume, force, progress, init)
    try:
        return loop(s, progress)
    finally:
        distributed.shutdown(s.dist)
