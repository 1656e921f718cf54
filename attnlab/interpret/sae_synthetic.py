"""Synthetic ground truth: activations built from known sparse features, so an SAE's features can be
checked against the true ones (proxy metrics such as explained variance need not say that).

Legend: F true features, D dimensions (F > D: superposition), N the SAE's latents.

F random unit directions in D dimensions; each fires independently with probability p (its magnitude
uniform in [0.5, 1.5]), and an activation is the sum of the active features times their magnitudes.
Options make firing less independent:
    correlated    features in groups of 4 that fire together more often: each draws a Gaussian that
                  shares `rho` of its variance with its group's, and fires above the (1 - p) quantile
                  (a Gaussian copula: every feature keeps its rate p)
    hierarchical  the first F / 5 features are parents with 4 children each; a child can fire only
                  with its parent, one child at a time (as SAELens' hierarchy)
mcc is the mean, over the true features, of the cosine to the decoder row Hungarian matching pairs it
with (scipy.optimize.linear_sum_assignment maximises the summed cosines).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from attnlab.config import check_types, option
from attnlab.errors import AttnlabError
from attnlab.interpret.sae import KINDS, SAEConfig, SparseAutoencoder
from attnlab.interpret.sae_train import fit

GROUP, CHILDREN = 4, 4


@dataclass
class SyntheticConfig:
    """The features' world (the command line's `attnlab sae synthetic` flags beside the SAE's)."""

    features: int = option(1024, "true features F", at_least=1)
    dim: int = option(128, "dimensions D the features live in (F > D: superposition)", at_least=1)
    p: float | None = option(None, "each feature's firing probability (default: 5 / F, about 5 active a token)")
    correlated: bool = option(False, "features fire together in groups of 4 (correlation rho)")
    rho: float = option(0.5, "--correlated: the share of a feature's firing noise its group shares")
    hierarchical: bool = option(False, "parents with 4 children each: a child fires only with its parent")
    seed: int = option(0, "seed of the features and the samples (and of the SAE, on the command line)")

    def __post_init__(self):
        check_types(self)
        if self.p is None:
            self.p = min(0.5, 5 / self.features)
        if not 0 < self.p < 1:
            raise AttnlabError(f"--p must lie between 0 and 1, got {self.p}")
        if self.hierarchical and self.features < 1 + CHILDREN:
            raise AttnlabError(f"--hierarchical needs at least {1 + CHILDREN} features")


class SyntheticFeatures:
    """F unit features in D dims and a sampler of their sparse sums."""

    def __init__(self, cfg: SyntheticConfig):
        self.cfg = cfg
        # an offset stream: with the SAE's own seed equal, its initial decoder would be these features
        self.gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        w = torch.randn(cfg.features, cfg.dim, generator=self.gen)
        self.features = w / w.norm(dim=1, keepdim=True)  # (F, D)
        self.parents = cfg.features // (1 + CHILDREN) if cfg.hierarchical else 0

    def firing(self, n: int) -> Tensor:
        """Which features fire in n samples, (n, F) bool."""
        cfg, F = self.cfg, self.cfg.features
        if cfg.correlated:
            shared = torch.randn(n, -(-F // GROUP), generator=self.gen).repeat_interleave(GROUP, 1)[:, :F]
            u = cfg.rho**0.5 * shared + (1 - cfg.rho) ** 0.5 * torch.randn(n, F, generator=self.gen)
            on = u > torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1 - cfg.p))
        else:
            on = torch.rand(n, F, generator=self.gen) < cfg.p
        if self.parents:
            on = self._hierarchy(on)
        return on

    def _hierarchy(self, on: Tensor) -> Tensor:
        """Children fire only with their parent, at most one (the one drawn), half the times it fires;
        parents fire at (1 + CHILDREN) p, so a child's rate is 5/8 p."""
        P, n = self.parents, len(on)
        parent = torch.rand(n, P, generator=self.gen) < min(1.0, self.cfg.p * (1 + CHILDREN))
        child = torch.randint(0, CHILDREN, (n, P), generator=self.gen)
        fires = torch.rand(n, P, generator=self.gen) < 0.5  # half the time a parent fires alone
        kids = torch.zeros(n, P, CHILDREN, dtype=torch.bool)
        kids.scatter_(2, child.unsqueeze(-1), (parent & fires).unsqueeze(-1))
        on = on.clone()
        on[:, :P] = parent
        on[:, P : P * (1 + CHILDREN)] = kids.flatten(1)
        return on

    def active(self, n: int) -> tuple[Tensor, Tensor]:
        """(sample, feature) index pairs of the features that fire in n samples, samples ascending."""
        cfg = self.cfg
        if cfg.correlated or self.parents:
            return self.firing(n).nonzero().unbind(1)
        # independent: as many firings as a binomial draws, at uniform places (repeats merged, a
        # 1e-3 effect at the default rate): no (n, F) table of random numbers to draw
        count = int(torch.binomial(torch.tensor(float(n * cfg.features)), torch.tensor(cfg.p), generator=self.gen))
        flat = torch.randint(n * cfg.features, (count,), generator=self.gen).unique()
        return flat // cfg.features, flat % cfg.features

    def sample(self, n: int) -> tuple[Tensor, Tensor]:
        """(n, D) activations and each sample's number of active features (n,)."""
        rows, cols = self.active(n)
        mags = 0.5 + torch.rand(len(rows), 1, generator=self.gen)
        x = torch.zeros(n, self.cfg.dim).index_add_(0, rows, mags * self.features[cols])
        return x, torch.bincount(rows, minlength=n)

    def batches(self, n: int) -> Iterator[Tensor]:
        while True:
            yield self.sample(n)[0]


def true_l0(world: SyntheticConfig, n: int = 4096) -> float:
    """Features active a sample on average (what --correlated and --hierarchical change): topk's k."""
    return float(SyntheticFeatures(world).sample(n)[1].float().mean())


def mcc(true: Tensor, learned: Tensor) -> float:
    """Mean cosine of each true feature (F, D) with the learned decoder row (N, D) Hungarian matching
    pairs it with (N >= F gives every true feature a partner; N < F: the unmatched count as 0)."""
    cos = (true / true.norm(dim=1, keepdim=True)) @ (learned / learned.norm(dim=1, keepdim=True)).t()  # (F, N)
    rows, cols = linear_sum_assignment(cos.numpy(), maximize=True)
    return float(cos[rows, cols].sum()) / len(true)


def run_synthetic(world: SyntheticConfig, sae_cfg: SAEConfig, progress: bool = True) -> dict:
    """Train an SAE on the synthetic features; mcc, dead_fraction, true vs learned L0, time."""
    if sae_cfg.kind not in KINDS:
        raise AttnlabError(f"unknown SAE kind {sae_cfg.kind!r}")
    torch.manual_seed(world.seed)
    data = SyntheticFeatures(world)
    sae = SparseAutoencoder(world.dim, sae_cfg)
    start = time.perf_counter()
    info = fit(sae, data.batches(sae_cfg.batch), progress)
    seconds = time.perf_counter() - start
    x, true_l0 = data.sample(32768)
    with torch.no_grad():
        z = sae.encode(x)
        err = (x - sae.decode(z)).pow(2).sum()
    fired = (z > 0).any(0)
    return {
        "mcc": mcc(data.features, sae.W_dec.detach()),
        "dead_fraction": float((~fired).float().mean()),
        "true_l0": float(true_l0.float().mean()),
        "learned_l0": float((z > 0).sum(-1).float().mean()),
        "explained_variance": float(1 - err / (x - x.mean(0)).pow(2).sum()),
        "seconds": round(seconds, 2),
        "steps": info["steps"],
        "world": asdict(world),
        "sae": asdict(sae_cfg),
    }
