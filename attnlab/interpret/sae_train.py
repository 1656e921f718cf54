"""Training an SAE on a run's activations, and the metrics SAELens names.

Legend: B sequences, T positions, C the point's width, N latents.

Activations are streamed: random windows of the run's own training split go through the model up to
the hook point, which raises to stop the forward pass there (the layers above are never run); each
window batch gives B*T activations, shuffled and handed to the SAE, then dropped. Nothing holds
more than one batch. Metrics are measured on the validation split with the reconstruction spliced
back in at the hook:

    explained_variance  1 - sum|x - x'|^2 / sum|x - mean x|^2
    l0                  mean number of latents active per token
    ce_loss_recovered   (CE_zero - CE_sae) / (CE_zero - CE_clean); CE_zero: the point's activation
                        replaced by zeros (zero ablation, as SAELens)
    kl_div              mean over tokens of KL(clean next-token distribution || spliced one)
    dead_fraction       latents that never fired on the evaluation tokens
    density             each latent's firing frequency; its histogram in log10 bins
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data import TokenData
from attnlab.data.batches import windows
from attnlab.errors import AttnlabError
from attnlab.interpret.own_data import block_of, own_tokens
from attnlab.interpret.sae import SAEConfig, SparseAutoencoder
from attnlab.models.protocols import CausalLM
from attnlab.nn.hooks import hooks, taps
from attnlab.progress import tqdm
from attnlab.runs.run import Run

SKIP = ("hook_pattern", "hook_head_out", "hook_router")  # points that are not (B, T, C)
DENSITY_BINS = np.arange(-7.0, 0.5, 0.5)  # log10 of a latent's firing frequency


class _Reached(Exception):
    """Raised by the hook to stop the forward pass once the point's activation is read."""


def point_names(model: torch.nn.Module) -> list[str]:
    """The model's (B, T, C) points: those an SAE can read."""
    return [name for name in taps(model) if not name.endswith(SKIP)]


def check_run(run: Run, hook: str) -> TokenData:
    """The run's own token data, after checking that an SAE can be trained on it at `hook`."""
    if not isinstance(run.model, CausalLM):
        raise AttnlabError(
            f"sae train reads a language-model run (attnlab train lm); {run.path} is a "
            f"{run.config.get('family', '?')} run"
        )
    names = point_names(run.model)
    if hook not in names:
        raise AttnlabError(f"no hook point {hook!r} in {run.path}; its points: {', '.join(names)}")
    data = run.config.get("data") or {}
    if not data.get("data"):
        raise AttnlabError(f"{run.path} names no training data in its config.json: an SAE reads the run's own data")
    try:
        return own_tokens(run)
    except AttnlabError as e:
        raise AttnlabError(f"an SAE reads the run's own data, and {e}") from None


@torch.no_grad()
def read_point(run: Run, hook: str, ids: Tensor) -> Tensor:
    """The activation at `hook` for ids (B, T): (B, T, C), the model run only up to it."""
    got: list[Tensor] = []

    def grab(x: Tensor) -> None:
        got.append(x.detach().float())
        raise _Reached

    try:
        with hooks(run.model, {hook: grab}):
            run.model(ids)
    except _Reached:
        pass
    if not got or got[0].dim() != 3:
        raise AttnlabError(f"{hook} gave no (batch, position, width) activation: pick a residual or sublayer point")
    return got[0]


def activations(
    run: Run,
    hook: str,
    tokens: TokenData,
    seqs: int,
    seed: int = 0,
    split: str = "train",
    reader: Callable[[Run, str, Tensor], Tensor] | None = None,
) -> Iterator[Tensor]:
    """Endless batches of (seqs * T, C) activations from random windows of the run's data, shuffled
    within the batch: a generator, so at most one batch is held at a time. reader: what reads them
    (default read_point; a transcoder's reads an MLP's input and output)."""
    reader = reader or read_point
    block = block_of(run)
    tokens.check(block, split)
    rng = np.random.default_rng(seed)
    run.model.eval()
    while True:
        x, _ = tokens.batch(split, seqs, block, rng)  # (B, T)
        acts = reader(run, hook, x.to(run.device)).flatten(0, 1)  # (B*T, C)
        yield acts[torch.from_numpy(rng.permutation(len(acts))).to(acts.device)]


def rebatch(source: Iterator[Tensor], size: int) -> Iterator[Tensor]:
    """Batches of exactly `size` rows from a source of batches of any size."""
    held, n = [], 0
    for x in source:
        held.append(x)
        n += len(x)
        while n >= size:
            cat = torch.cat(held)
            yield cat[:size]
            held, n = [cat[size:]], n - size


def fit(
    sae: SparseAutoencoder,
    batches: Iterator[Tensor],
    progress: bool = True,
    on_step: Callable[[int, dict], None] | None = None,
    desc: str = "training the SAE",
) -> dict:
    """Train `sae` on raw activation batches until cfg.tokens are seen: Adam, the learning rate
    constant then decayed linearly to 0 over the last fifth; the normalisation fit on the first batch."""
    cfg = sae.cfg
    first = next(batches)
    sae.fit_norm(first)
    sae.train()
    opt = torch.optim.Adam([p for p in sae.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.999))
    steps = max(1, math.ceil(cfg.tokens / cfg.batch))
    since_fired = torch.zeros(cfg.latents, dtype=torch.long, device=first.device)  # tokens since each fired
    start, parts = time.perf_counter(), {}
    bar = tqdm(total=steps, desc=desc, disable=not progress, unit="step")
    x = first
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, (steps - step) / (0.2 * steps))
        loss, parts, fired = sae.loss(sae.normalise(x), since_fired >= cfg.dead_after)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sae.remove_parallel_grad()
        opt.step()
        sae.normalise_decoder()
        since_fired = torch.where(fired, 0, since_fired + len(x))
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(mse=f"{parts['mse']:.4f}", l0=f"{parts['l0']:.1f}")
        if on_step is not None:
            on_step(step, parts)
        if step + 1 < steps:
            x = next(batches)
    bar.close()
    sae.eval()
    return {
        "steps": steps,
        "tokens": steps * cfg.batch,
        "seconds": round(time.perf_counter() - start, 2),
        "train_dead_fraction": float((since_fired >= cfg.dead_after).float().mean()),
        "final_mse": parts.get("mse"),
    }


def train_sae(run: Run, hook: str, cfg: SAEConfig, progress: bool = True) -> tuple[SparseAutoencoder, dict]:
    """An SAE trained on `hook` of the run, streamed from the run's own training split."""
    tokens = check_run(run, hook)
    probe = read_point(run, hook, torch.zeros(1, 1, dtype=torch.long, device=run.device))
    sae = SparseAutoencoder(probe.shape[-1], cfg).to(run.device)
    seqs = max(1, cfg.batch // block_of(run))
    info = fit(sae, rebatch(activations(run, hook, tokens, seqs, cfg.seed), cfg.batch), progress)
    return sae, info


def _kl(clean: Tensor, other: Tensor) -> Tensor:
    """KL(clean || other) of two logit tensors (..., V), summed over tokens."""
    p = clean.float().log_softmax(-1)
    return (p.exp() * (p - other.float().log_softmax(-1))).sum()


@torch.no_grad()
def evaluate_sae(
    run: Run, hook: str, sae: SparseAutoencoder, tokens: int = 32768, batch: int = 8, data: TokenData | None = None
) -> dict:
    """The SAELens metrics on the first `tokens` tokens of the run's validation split (full windows)."""
    data = data if data is not None else check_run(run, hook)
    split = "val" if len(data.splits["val"]) > block_of(run) else "train"
    arr = np.asarray(data.splits[split])[: tokens + 1]
    block = min(block_of(run), len(arr) - 1)
    model = run.model.eval()
    sums = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0, "kl": 0.0, "sse": 0.0, "l0": 0.0}
    xsum = xsq = 0.0
    count, fired = 0, torch.zeros(sae.cfg.latents, device=run.device)
    seen: dict[str, Tensor] = {}  # the last batch's activations and codes, as the splice saw them

    def splice(x: Tensor) -> Tensor:
        z = sae.encode(x.float())
        seen["x"], seen["z"] = x.float(), z
        return sae.decode(z).to(x.dtype)

    for xy in windows(arr, block, batch):
        if xy.shape[1] != block + 1:
            continue  # the shorter last window: every window the same length
        xy = torch.from_numpy(xy).to(run.device)
        ids, target = xy[:, :-1], xy[:, 1:].flatten()
        clean = model(ids)
        with hooks(model, {hook: splice}):
            spliced = model(ids)
        with hooks(model, {hook: torch.zeros_like}):
            zeroed = model(ids)
        x, z = seen["x"].flatten(0, 1), seen["z"].flatten(0, 1)
        for name, logits in (("ce_clean", clean), ("ce_sae", spliced), ("ce_zero", zeroed)):
            sums[name] += float(F.cross_entropy(logits.flatten(0, 1).float(), target, reduction="sum"))
        sums["kl"] += float(_kl(clean, spliced))
        sums["sse"] += float((x - sae.decode(z)).pow(2).sum())
        sums["l0"] += float((z > 0).sum())
        xsum, xsq = x.sum(0) + xsum, x.pow(2).sum(0) + xsq
        fired += (z > 0).sum(0)
        count += len(x)
    if not count:
        raise AttnlabError(f"the run's data has fewer than {block + 1} tokens: too few to measure the SAE")
    sst = float((xsq - xsum.pow(2) / count).sum())
    return metrics(sums, sst, fired, count)


def metrics(sums: dict, sst: float, fired: Tensor, count: int) -> dict:
    """SAELens' names, from the sums over the evaluation tokens."""
    ce = {k: sums[k] / count for k in ("ce_clean", "ce_sae", "ce_zero")}
    density = (fired / count).cpu()
    live = density[density > 0]
    hist, _ = np.histogram(np.log10(live.numpy()), bins=DENSITY_BINS) if len(live) else (np.zeros(0), None)
    return {
        "explained_variance": 1 - sums["sse"] / max(sst, 1e-12),
        "l0": sums["l0"] / count,
        "ce_loss_recovered": ce_loss_recovered(ce["ce_clean"], ce["ce_sae"], ce["ce_zero"]),
        "kl_div": sums["kl"] / count,
        "dead_fraction": float((density == 0).float().mean()),
        **ce,
        "tokens": count,
        "density_histogram": {
            "log10_edges": DENSITY_BINS.tolist(),
            "counts": hist.astype(int).tolist(),
            "dead": int((density == 0).sum()),
        },
        "density": [round(float(d), 7) for d in density],
    }


def ce_loss_recovered(clean: float, sae: float, zero: float) -> float:
    """(CE_zero - CE_sae) / (CE_zero - CE_clean): 1 when splicing costs nothing, 0 when the SAE is as
    bad as removing the activation."""
    return (zero - sae) / (zero - clean) if zero != clean else float("nan")
