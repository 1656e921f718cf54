"""A mixture-of-experts feed-forward (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021;
Mixtral, Jiang et al. 2024).

Legend: B batch, T time, N = B*T tokens, C model width, E experts, k experts per token.

    router logits = x W_r                (N, E)      a linear layer, no bias
    p = softmax(logits)                  (N, E)
    the k largest p per token: gates g, experts e   (N, k)
    g = g / sum(g)                       renormalised over the chosen k (Mixtral)
    y = sum_i g_i * expert_{e_i}(x)      each token runs k experts only

So the model holds E feed-forwards but each token pays for k: parameters grow without the
compute per token. Two things keep the experts in use:
- the load-balancing loss, aux = E * sum_e f_e * P_e, f_e the share of the N*k assignments that
  went to expert e and P_e its mean router probability; it is 1 when the routing is uniform and
  grows as it concentrates (Switch's loss; HuggingFace's Mixtral loss is k times this one). The
  training engine adds aux_loss_weight * aux of every MoE layer to the training loss (`aux_loss`).
- an optional capacity: each expert takes at most ceil(capacity_factor * N * k / E) assignments,
  first choices before second ones, in token order; an assignment past it is dropped (that
  expert's share of the token is zero: the residual connection carries the token on), and
  counted in `dropped`.

`forward` runs each expert on its own tokens (the routed path); `forward_dense` runs every expert
on every token and masks by the routing, and the tests hold the two equal.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.dense import dense_feedforward
from attnlab.nn.hooks import Tap

if TYPE_CHECKING:
    from attnlab.nn.options import BlockConfig


class MixtureOfExperts(nn.Module):
    """E dense feed-forwards and a router choosing k of them per token."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int = 4,
        k: int = 2,
        expert: str = "mlp",
        activation: str = "gelu",
        bias: bool = True,
        capacity_factor: float | None = None,
        aux_weight: float = 0.01,
    ):
        super().__init__()
        if not 1 <= k <= n_experts:
            raise ValueError(f"experts per token must be between 1 and the {n_experts} experts, got {k}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be above 0, got {capacity_factor}")
        self.n_experts, self.k, self.capacity_factor, self.aux_weight = n_experts, k, capacity_factor, aux_weight
        self.router = nn.Linear(d_model, n_experts, bias=False)  # W_r: (C -> E)
        experts = (dense_feedforward(expert, d_model, d_ff, activation, bias) for _ in range(n_experts))
        self.experts = nn.ModuleList(experts)
        self.hook_router = Tap()  # (N, E) router probabilities, tokens in (batch, time) order; nn/hooks.py
        # What the last forward routed (set by every call; read by the engine and the pictures).
        self.aux: Tensor | None = None  # the balancing loss, with its graph
        self.load: Tensor | None = None  # (E,) share of the kept assignments each expert got
        self.dropped: Tensor | None = None  # () share of the N*k assignments dropped by the capacity
        self.choice: Tensor | None = None  # (B, T, k) the experts each token chose, best first
        self.choice_gates: Tensor | None = None  # (B, T, k) their renormalised gates

    @classmethod
    def from_block(cls, c: BlockConfig) -> MixtureOfExperts:
        return cls(
            c.d_model,
            c.ff_width,
            c.n_experts,
            c.experts_per_token,
            c.expert_ff,
            c.activation,
            c.bias,
            c.capacity_factor,
            c.aux_loss_weight,
        )

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, C) -> gates (N, k) renormalised, experts (N, k), kept (N, k) bool; sets the statistics."""
        probs = self.hook_router(torch.softmax(self.router(x).float(), dim=-1))  # (N, E), float32 whatever the autocast
        gates, experts = probs.topk(self.k, dim=-1)  # (N, k) each, best first
        gates = gates / gates.sum(-1, keepdim=True)
        kept = self._within_capacity(experts)
        chosen = F.one_hot(experts, self.n_experts)  # (N, k, E): 1 at each assignment's expert
        share = chosen.sum((0, 1)).float() / (x.shape[0] * self.k)  # (E,) f_e, summing to 1
        self.aux = self.n_experts * (share * probs.mean(0)).sum()
        kept_per_expert = (chosen * kept[..., None]).sum((0, 1)).float()  # (E,)
        self.load = (kept_per_expert / kept_per_expert.sum().clamp(min=1)).detach()
        self.dropped = (1 - kept.float().mean()).detach()
        return gates, experts, kept

    def _within_capacity(self, experts: Tensor) -> Tensor:
        """(N, k) bool: which assignments fit in their expert's capacity (all, without one)."""
        if self.capacity_factor is None:
            return torch.ones_like(experts, dtype=torch.bool)
        n = experts.shape[0]
        capacity = math.ceil(self.capacity_factor * n * self.k / self.n_experts)
        # Priority: every token's first choice (in token order), then every second choice.
        order = F.one_hot(experts.T.reshape(-1), self.n_experts)  # (k*N, E), choice-major
        rank = (order.cumsum(0) * order).sum(-1) - 1  # (k*N,) place in its expert's queue
        return (rank < capacity).view(self.k, n).T  # (N, k)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, C), each token through its k experts only."""
        b, t, c = x.shape
        flat = x.reshape(-1, c)  # (N, C)
        gates, experts, kept = self.route(flat)
        self.choice, self.choice_gates = experts.view(b, t, self.k).detach(), gates.view(b, t, self.k).detach()
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            # The assignments to e. An expert given none still runs, on zero rows: its weights then get
            # zero gradients rather than none, which DDP requires of every parameter at every step.
            token, slot = torch.where((experts == e) & kept)
            y = expert(flat[token]) * gates[token, slot, None].to(flat.dtype)  # (n_e, C)
            out.index_add_(0, token, y.to(out.dtype))
        return out.view(b, t, c)

    def forward_dense(self, x: Tensor) -> Tensor:
        """The same output the slow way: every expert on every token, weighted by a (N, E) matrix
        holding each token's gates at its chosen, kept experts and zero elsewhere."""
        b, t, c = x.shape
        flat = x.reshape(-1, c)
        gates, experts, kept = self.route(flat)
        weight = torch.zeros(flat.shape[0], self.n_experts, device=x.device)  # (N, E)
        weight.scatter_add_(1, experts, gates * kept)
        every = torch.stack([expert(flat) for expert in self.experts], dim=1)  # (N, E, C)
        return (weight[..., None].to(every.dtype) * every).sum(1).view(b, t, c)


def moe_layers(model: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def inactive_params(model: nn.Module) -> int:
    """Parameters a token does not use: in each MoE layer, the experts it is not routed to."""
    return sum((m.n_experts - m.k) * sum(p.numel() for p in m.experts[0].parameters()) for m in moe_layers(model))


def aux_loss(model: nn.Module) -> Tensor | None:
    """sum over the MoE layers of aux_weight * aux from their last forward (None without any):
    what the engine adds to the training loss."""
    terms = [m.aux_weight * m.aux for m in moe_layers(model) if m.aux is not None and m.aux_weight]
    return torch.stack(terms).sum() if terms else None


def routing_stats(model: nn.Module) -> dict[str, float | list[list[float]]]:
    """The last forward's routing, for metrics.jsonl: mean balancing loss, dropped share, and each
    layer's expert load ({} without MoE layers)."""
    layers = [m for m in moe_layers(model) if m.aux is not None]
    if not layers:
        return {}
    return {
        "moe_aux": float(torch.stack([m.aux.detach() for m in layers]).mean()),
        "moe_dropped": float(torch.stack([m.dropped for m in layers]).mean()),
        "expert_load": [[round(float(v), 4) for v in m.load] for m in layers],
    }
