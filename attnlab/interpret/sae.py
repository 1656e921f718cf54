"""Sparse autoencoders: a layer's activations split into many sparse, nameable features.

Legend: B tokens in a batch, D the activation's width, N latents (features), k active latents per token.

    x_n = (x - mean) / scale                      centred, scaled to unit mean norm (both saved)
    pre = (x_n - b_dec) W_enc + b_enc             (B, N)
    z   = act(pre)                                 sparse codes, by kind (below)
    x_n' = z W_dec + b_dec                         (B, D): each row of W_dec (a decoder "column" in the
                                                   papers' D x N notation) is a feature's direction
Kinds of act:
    relu       relu(pre), trained with an L1 penalty on z (the first SAEs; SAELens' "standard")
    topk       the k largest of relu(pre) per token, the rest zero (OpenAI, Gao et al. 2024)
    batchtopk  the B*k largest over the whole batch (Bussmann et al. 2024); at inference a threshold,
               the running mean of the smallest value kept in training, so a token's L0 may vary
    jumprelu   pre where pre > theta (a learned threshold per latent), trained with an L0 penalty;
               theta gets its gradient through a straight-through rectangle kernel of width
               `bandwidth` (Rajamanoharan et al. 2024, as in Anthropic's and GemmaScope's)
Decoder rows are kept at unit norm: the gradient part along each row is removed before a step and
the rows renormalised after it, so a latent's size lives in z alone (an L1 penalty cannot shrink W_dec
instead). Dead latents are revived by AuxK (OpenAI): the error x_n - x_n' is reconstructed by the
k_aux largest pre-activations of latents that have not fired for `dead_after` tokens, and that
reconstruction's loss (weight aux_weight) pulls them back toward what the live ones miss.
Training and metrics are in sae_train.py; synthetic ground truth in sae_synthetic.py; the feature page
in sae_page.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import check_types, option
from attnlab.errors import AttnlabError
from attnlab.io import read_json, read_safetensors, write_json, write_safetensors

KINDS = ("topk", "batchtopk", "jumprelu", "relu")
WEIGHTS, META = "sae.safetensors", "sae.json"


@dataclass
class SAEConfig:
    """What an SAE is and how it trains (the command line's `attnlab sae train` flags)."""

    latents: int = option(1024, "number of latents (features) the SAE learns", at_least=1)
    kind: str = option(
        "topk", "how codes are made sparse: topk (OpenAI), batchtopk, jumprelu (Anthropic) or relu (L1 penalty)", KINDS
    )
    k: int = option(32, "topk / batchtopk: active latents per token (batchtopk: on average)", at_least=1)
    l1: float = option(0.3, "relu: the L1 penalty's weight (on z times the decoder rows' norms)")
    l0: float = option(0.05, "jumprelu: the L0 penalty's weight (per active latent)")
    bandwidth: float = option(0.05, "jumprelu: width of the straight-through kernel for the threshold")
    lr: float = option(1e-3, "Adam's learning rate")
    tokens: int = option(4_000_000, "training tokens (activations) to stream through the SAE", at_least=1)
    batch: int = option(4096, "activations per SAE step", at_least=1)
    aux_k: int = option(256, "AuxK: dead latents used to reconstruct the error (0: no revival)", at_least=0)
    aux_weight: float = option(1 / 32, "AuxK: the auxiliary loss's weight")
    dead_after: int = option(1_000_000, "a latent is dead (for AuxK) after this many tokens without firing", at_least=1)
    seed: int = option(0, "random seed of the initial weights and of the data drawn")

    def __post_init__(self):
        check_types(self)
        if self.kind not in KINDS:
            raise AttnlabError(f"unknown SAE kind {self.kind!r}: choose {', '.join(KINDS)}")
        if self.kind in ("topk", "batchtopk") and self.k > self.latents:
            raise AttnlabError(f"--k {self.k} is more than --latents {self.latents}")


class _JumpReLU(torch.autograd.Function):
    """pre * H(pre - theta): the gradient to pre is exact where it passes; to theta a rectangle kernel."""

    @staticmethod
    def forward(ctx, pre: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return pre * (pre > theta)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pre, theta = ctx.saved_tensors
        near = ((pre - theta).abs() < ctx.bandwidth / 2).to(grad.dtype)  # the kernel K((pre - theta) / eps)
        d_theta = -(theta / ctx.bandwidth) * near * grad
        return grad * (pre > theta), d_theta.sum(0), None


class _Step(torch.autograd.Function):
    """H(pre - theta), whose gradient to theta is the same kernel: what an L0 penalty trains theta by."""

    @staticmethod
    def forward(ctx, pre: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return (pre > theta).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pre, theta = ctx.saved_tensors
        near = ((pre - theta).abs() < ctx.bandwidth / 2).to(grad.dtype)
        return None, (-(1.0 / ctx.bandwidth) * near * grad).sum(0), None


class SparseAutoencoder(nn.Module):
    """An SAE over D-wide activations; `encode`, `decode` and `forward` take and give the raw
    activations (the centring and scaling are inside)."""

    def __init__(self, dim: int, cfg: SAEConfig):
        super().__init__()
        self.cfg, self.dim = cfg, dim
        g = torch.Generator().manual_seed(cfg.seed)
        w = torch.randn(cfg.latents, dim, generator=g)
        self.W_dec = nn.Parameter(w / w.norm(dim=1, keepdim=True))  # (N, D) unit rows
        self.W_enc = nn.Parameter(self.W_dec.detach().t().clone())  # (D, N): tied at the start (OpenAI)
        self.b_enc = nn.Parameter(torch.zeros(cfg.latents))
        self.b_dec = nn.Parameter(torch.zeros(dim))
        self.log_theta = nn.Parameter(torch.full((cfg.latents,), -3.0), requires_grad=cfg.kind == "jumprelu")
        self.register_buffer("mean", torch.zeros(dim))  # of the raw activations
        self.register_buffer("scale", torch.ones(()))  # their mean norm once centred
        self.register_buffer("threshold", torch.zeros(()))  # batchtopk at inference

    # ---- the normalisation, set once from the first activations --------------------------------

    @torch.no_grad()
    def fit_norm(self, x: Tensor) -> None:
        """Mean and scale from a sample of activations (B, D)."""
        self.mean.copy_(x.mean(0))
        self.scale.copy_((x - self.mean).norm(dim=-1).mean().clamp_min(1e-8))

    def normalise(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.scale

    # ---- codes ---------------------------------------------------------------------------------

    def pre_acts(self, xn: Tensor) -> Tensor:
        return (xn - self.b_dec) @ self.W_enc + self.b_enc  # (B, N)

    def sparse(self, pre: Tensor) -> Tensor:
        """The codes z (B, N) from pre-activations, by kind (training or inference as self.training)."""
        kind = self.cfg.kind
        if kind == "relu":
            return torch.relu(pre)
        if kind == "jumprelu":
            return _JumpReLU.apply(pre, self.log_theta.exp(), self.cfg.bandwidth)
        if kind == "batchtopk" and not self.training:  # at inference: one threshold for every token
            return torch.relu(pre) * (pre > self.threshold)
        rows, cols, vals = self.kept(pre)
        return torch.zeros_like(pre).index_put((rows, cols), vals)

    def kept(self, pre: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """topk and batchtopk (training): the codes kept, as (rows, cols, values), rows ascending."""
        B, N = pre.shape
        if self.cfg.kind == "topk":
            top = pre.topk(self.cfg.k, dim=-1)  # the k largest of relu(pre) are relu of pre's k largest
            rows = torch.arange(B, device=pre.device).repeat_interleave(self.cfg.k)
            return rows, top.indices.flatten(), torch.relu(top.values).flatten()
        top = pre.flatten().topk(min(self.cfg.k * B, pre.numel()))  # batchtopk: over the whole batch
        with torch.no_grad():  # the running mean of the smallest value kept: the inference threshold
            self.threshold.lerp_(top.values[-1].clamp_min(0), 0.01)
        order = top.indices.argsort()
        flat = top.indices[order]
        return flat // N, flat % N, torch.relu(top.values[order])

    def decode_kept(self, rows: Tensor, cols: Tensor, vals: Tensor, batch: int) -> Tensor:
        """sum over kept codes of value x decoder row, (B, D): a gather, never the dense (B, N) product."""
        offsets = torch.zeros(batch, dtype=torch.long, device=rows.device)
        offsets[1:] = torch.bincount(rows, minlength=batch).cumsum(0)[:-1]
        return F.embedding_bag(cols, self.W_dec, offsets, mode="sum", per_sample_weights=vals) + self.b_dec

    def encode_normalised(self, xn: Tensor) -> Tensor:
        return self.sparse(self.pre_acts(xn))

    def decode_normalised(self, z: Tensor) -> Tensor:
        return z @ self.W_dec + self.b_dec  # (B, D)

    def encode(self, x: Tensor) -> Tensor:
        """Raw activations (..., D) -> codes (..., N)."""
        z = self.encode_normalised(self.normalise(x.reshape(-1, x.shape[-1])))  # (B, N) for B = all leading dims
        return z.view(*x.shape[:-1], z.shape[-1])

    def decode(self, z: Tensor) -> Tensor:
        """Codes (..., N) -> raw activations (..., D)."""
        return self.decode_normalised(z) * self.scale + self.mean

    def forward(self, x: Tensor) -> Tensor:
        """The reconstruction of raw activations x (..., D)."""
        return self.decode(self.encode(x))

    # ---- the loss ------------------------------------------------------------------------------

    def loss(
        self, xn: Tensor, dead: Tensor | None = None, target: Tensor | None = None
    ) -> tuple[Tensor, dict[str, float], Tensor]:
        """The training loss on normalised activations xn (B, D): mean squared error (summed over D,
        averaged over tokens) + the kind's sparsity penalty + AuxK on `dead` latents (N,) bool; with its
        parts and which latents fired (N,). target: what the decoder should give instead of xn itself
        (a transcoder's normalised MLP output)."""
        B, N = len(xn), self.cfg.latents
        pre = self.pre_acts(xn)
        if self.cfg.kind in ("topk", "batchtopk"):  # k codes a token: decoded by a gather
            rows, cols, vals = self.kept(pre)
            recon, on = self.decode_kept(rows, cols, vals, B), vals > 0
            fired = torch.zeros(N, dtype=torch.bool, device=xn.device).index_fill_(0, cols[on], True)
            l0 = on.sum() / B
        else:
            z = self.sparse(pre)
            recon, fired, l0 = self.decode_normalised(z), (z > 0).any(0), (z > 0).sum() / B
        err = (xn if target is None else target) - recon
        mse = err.pow(2).sum(-1).mean()
        total, parts = mse, {"mse": mse.item(), "l0": l0.item()}
        if self.cfg.kind == "relu":
            total = total + self.cfg.l1 * (z * self.W_dec.norm(dim=1)).sum(-1).mean()
        elif self.cfg.kind == "jumprelu":
            total = total + self.cfg.l0 * _Step.apply(pre, self.log_theta.exp(), self.cfg.bandwidth).sum(-1).mean()
        if dead is not None and self.cfg.aux_k and bool(dead.any()):
            aux = self._aux_loss(pre, dead, err.detach())
            total = total + self.cfg.aux_weight * aux
            parts["aux"] = aux.item()
        return total, parts, fired

    def _aux_loss(self, pre: Tensor, dead: Tensor, err: Tensor) -> Tensor:
        """AuxK: how well the top aux_k dead latents reconstruct the live ones' error, relative to the
        error's own variance (so its size does not fall as the SAE improves). Tried on synthetic features
        (1,024 in 128 dims): the raw pre-activations instead of relu's gave more dead latents, a weight
        of 1 instead of 1/32 no fewer (docs/log.md, "Sparse autoencoders")."""
        idx = dead.nonzero().flatten()  # (n_dead,)
        top = torch.relu(pre[:, idx]).topk(min(self.cfg.aux_k, len(idx)), dim=-1)  # (B, k_aux)
        rows = torch.arange(len(pre), device=pre.device).repeat_interleave(top.indices.shape[1])
        guess = self.decode_kept(rows, idx[top.indices].flatten(), top.values.flatten(), len(pre)) - self.b_dec
        return (err - guess).pow(2).sum(-1).mean() / err.var(0).sum().clamp_min(1e-8)

    # ---- unit decoder rows ---------------------------------------------------------------------

    @torch.no_grad()
    def remove_parallel_grad(self) -> None:
        """Drop the part of each decoder row's gradient along the row: a step then only turns it."""
        if self.W_dec.grad is not None:
            w = self.W_dec
            w.grad -= (w.grad * w).sum(-1, keepdim=True) * w

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        self.W_dec /= self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8)


@dataclass
class SavedSAE:
    """An SAE read back from DIR, with what sae.json says of it (hook, run, metrics, ...)."""

    sae: SparseAutoencoder
    info: dict = field(default_factory=dict)


def save_sae(sae: SparseAutoencoder, folder: str | Path, info: dict) -> Path:
    """DIR/sae.safetensors (the weights and the normalisation) and DIR/sae.json (config, width and
    `info`: the hook, the run, the metrics)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in sae.state_dict().items()}
    write_safetensors(out / WEIGHTS, tensors, {"format": "attnlab-sae"})
    meta = {"config": asdict(sae.cfg), "dim": sae.dim, "scale": float(sae.scale), **info}
    write_json(out / META, meta)
    return out


def load_sae(
    folder: str | Path, device: str | torch.device = "cpu", cls: type[SparseAutoencoder] = SparseAutoencoder
) -> SavedSAE:
    """An SAE folder written by save_sae (safetensors and JSON: nothing is unpickled); cls: the class
    it was saved from (a Transcoder, whose output's normalisation is saved too)."""
    p = Path(folder)
    if not (p / WEIGHTS).is_file() or not (p / META).is_file():
        raise AttnlabError(f"{p} is not an SAE folder: it needs {WEIGHTS} and {META} (attnlab sae train writes them)")
    try:
        meta = read_json(p / META)
        sae = cls(int(meta["dim"]), SAEConfig(**meta["config"]))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise AttnlabError(f"{p / META} is not an SAE's description: {e}") from None
    tensors, _ = read_safetensors(p / WEIGHTS)
    missing = set(sae.state_dict()) - set(tensors)
    if missing:
        raise AttnlabError(f"{p / WEIGHTS} lacks {', '.join(sorted(missing))}")
    sae.load_state_dict({k: tensors[k] for k in sae.state_dict()})
    return SavedSAE(sae.to(device).eval(), meta)
