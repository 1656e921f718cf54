"""Muon: momentum orthogonalized by Newton-Schulz, for the hidden weight matrices of a network.

Legend: g gradient, m momentum buffer, d update direction (before orthogonalizing), u update.

Keller Jordan's Muon (2024, "MomentUm Orthogonalized by Newton-Schulz") takes SGD momentum and
replaces each matrix's update direction by the nearest semi-orthogonal matrix, U V^T from its
reduced SVD U S V^T. The gradient of a weight matrix is dominated by a few large singular
directions; orthogonalizing sets every singular value of the update to 1, so rare directions
learn as fast as common ones instead of being swamped. The SVD itself is slow on a GPU, so a few
Newton-Schulz matrix multiplies approximate it in bfloat16.

Muon is for 2-D hidden weights only (or conv kernels, taken as matrices of fan-out x fan-in).
Embeddings, the LM head, norms and biases stay with AdamW: the caller splits the parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# Quintic Newton-Schulz coefficients from the Muon write-up: chosen to push small singular values
# up fast rather than to converge to exactly 1, so 5 steps leave them in roughly [0.7, 1.2].
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """An approximation of U V^T for g = U S V^T (reduced SVD), of g's shape and dtype.

    A tensor of more than 2 dims (a conv kernel) is taken as a matrix of its first dim by all the
    others, and the result is reshaped back. Runs in bfloat16 on CUDA, where it is fast and the
    iteration tolerates it, and in float32 elsewhere (bfloat16 matmuls on a CPU without bf16
    instructions are emulated, far slower: docs/log.md, "Precision").
    """
    if g.dim() < 2:
        raise ValueError(f"orthogonalize needs a matrix; got a tensor of shape {tuple(g.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = g.reshape(g.shape[0], -1)  # (rows, cols)
    x = x.to(torch.bfloat16 if x.is_cuda else torch.float32)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # work on the smaller Gram matrix x x^T: (min, min)
    # The iteration converges only for singular values <= 1; the Frobenius norm bounds the largest.
    x = x / (x.norm() + eps)
    for _ in range(steps):
        gram = x @ x.T  # (min, min)
        # x <- a x + b (x x^T) x + c (x x^T)^2 x: an odd quintic applied to each singular value
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = x.T
    return x.reshape(g.shape).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """SGD momentum with each matrix's update orthogonalized, for hidden weight matrices.

    Per step, for a parameter p of shape (rows, cols...) with gradient g:
        m = momentum * m + g
        d = g + momentum * m  (Nesterov, the default), or d = m
        u = orthogonalize(d) * max(1, rows / cols) ** 0.5
        p = p * (1 - lr * weight_decay) - lr * u

    The scale: an orthogonalized (rows, cols) matrix has RMS 1/sqrt(max(rows, cols)), so the
    factor max(1, rows / cols) ** 0.5 gives every shape an update of RMS 1/sqrt(cols), that is
    one that changes the layer's output RMS by the same amount per unit of input RMS whether the
    matrix is square, tall (an MLP's up projection) or wide (its down projection). cols is the
    fan-in (torch's Linear weight is (out, in)); a conv kernel counts all its trailing dims.

    Weight decay is decoupled as in AdamW. The state of each parameter is its momentum buffer
    alone, so state_dict() / load_state_dict() resume a run exactly.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or not 0 <= momentum < 1 or ns_steps < 1 or weight_decay < 0:
            raise ValueError(
                f"Muon needs lr >= 0, 0 <= momentum < 1, ns_steps >= 1 and weight_decay >= 0; got lr={lr}, "
                f"momentum={momentum}, ns_steps={ns_steps}, weight_decay={weight_decay}"
            )
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps}
        super().__init__(params, {**defaults, "weight_decay": weight_decay})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, but refusing vectors and scalars, which Muon cannot orthogonalize."""
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)  # a generator is read once
        for p in params:
            if p.dim() < 2:
                raise ValueError(
                    f"Muon takes weight matrices only; got a {p.dim()}-D parameter of shape {tuple(p.shape)}: "
                    "give biases, norms and other vectors (and embeddings, the LM head) to AdamW"
                )
        super().add_param_group({**param_group, "params": params})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; returns closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, beta = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["momentum_buffer"]
                m.mul_(beta).add_(g)
                d = g.add(m, alpha=beta) if group["nesterov"] else m
                rows, cols = p.shape[0], p[0].numel()
                u = orthogonalize(d, steps=group["ns_steps"]) * max(1.0, rows / cols) ** 0.5
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(u, alpha=-lr)
        return loss
