"""The intervention check of an attribution graph: does removing a feature move the target the way
the graph says?

Legend: n_f active features, B ablations run at once (one per batch row), T positions, N latents.

The graph's prediction for feature j: its signed total effect on the target metric, through every
path of the linear graph. With M[t, s] = A[t, s] / a_s (an edge per unit of the source's activation)
over the features, and r the logit's row of it,

    e = r (I - M)^-1        the target's change per unit of each feature's activation
    predicted(j) = -a_j e_j  the change when feature j goes from a_j to 0

which is exact in the linear graph. It is tested in two models, each feature ablated in its own row:
- the replacement model: attention patterns and norm scales frozen at the prompt's, each MLP its
  transcoder plus the (constant) error, every later feature recomputed by its encoder (topk and
  thresholds included), feature j set to 0 at its layer and position;
- the real model, nothing frozen: feature j's contribution a_j * decoder_j subtracted from its
  layer's MLP output at its position.
A sign is right when the measured change has the predicted sign.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.interpret.circuits import Attribution, frozen_run, metric
from attnlab.interpret.transcoder import Transcoder, mlps_replaced


def total_effects(attr: Attribution) -> Tensor:
    """a_j e_j for every feature, (n_f,): its signed total attribution to the target metric."""
    nf, s = attr.nodes.n_features, attr.nodes.slices()
    a = attr.nodes.act.double()
    A = attr.adjacency.double()
    M = A[:nf, :nf] / a[None, :]
    r = A[s["logit"].start, :nf] / a
    e = torch.linalg.solve((torch.eye(nf, dtype=M.dtype) - M).t(), r)
    return a * e


def _mask(attr: Attribution, chosen: Tensor, layer: int, width: int) -> Tensor:
    """(B, T, width) ones, with zero where row b's feature sits (if it is in `layer`)."""
    n = attr.nodes
    keep = torch.ones(len(chosen), n.n_pos, width, dtype=n.act.dtype)
    rows = (n.layer[chosen] == layer).nonzero().flatten()
    keep[rows, n.pos[chosen[rows]], n.index[chosen[rows]]] = 0
    return keep


@torch.no_grad()
def replacement_deltas(model: nn.Module, attr: Attribution, tcs: list[Transcoder], chosen: Tensor) -> Tensor:
    """The target's change in the replacement model when each chosen feature (one per row) is zeroed."""
    fz, B = attr.frozen, len(chosen)

    def ff(i: int, x: Tensor, out: Tensor, ablate: bool = True) -> Tensor:
        z = tcs[i].encode(x)  # (B, T, N)
        if ablate:
            z = z * _mask(attr, chosen, i, z.shape[-1])
        return tcs[i].decode(z) + attr.errors[i]

    with frozen_run(model, fz, 1, lambda i, x, o: ff(i, x, o, False)) as out:
        out["run"]()
        base = metric(model, out["hidden"], attr.target)
    with frozen_run(model, fz, B, ff) as out:
        out["run"]()
        return metric(model, out["hidden"], attr.target) - base


@torch.no_grad()
def real_deltas(model: nn.Module, attr: Attribution, tcs: list[Transcoder], chosen: Tensor) -> Tensor:
    """The target's change in the real model when each chosen feature's contribution is subtracted."""
    n, B = attr.nodes, len(chosen)
    hidden: list[Tensor] = []
    grab = model.readout()[1].register_forward_hook(lambda m, a, o: hidden.append(o))

    def ff(i: int, x: Tensor, out: Tensor) -> Tensor:
        rows = (n.layer[chosen] == i).nonzero().flatten()
        if not len(rows):
            return out
        j = chosen[rows]
        out = out.clone()
        out[rows, n.pos[j]] -= n.act[j, None] * tcs[i].decoder()[0][n.index[j]]
        return out

    try:
        model(attr.frozen.ids)
        with mlps_replaced(model, {i: lambda x, o, i=i: ff(i, x, o) for i in range(n.n_layers)}):
            model(attr.frozen.ids.expand(B, -1))
    finally:
        grab.remove()
    return metric(model, hidden[1], attr.target) - metric(model, hidden[0], attr.target)


def intervention_check(
    model: nn.Module, attr: Attribution, tcs: list[Transcoder], influence: Tensor, top: int = 10
) -> dict:
    """Ablate the `top` features of most influence on the target, one at a time, in the replacement
    model and in the real one; the share of signs the graph predicted right in each."""
    nf = attr.nodes.n_features
    chosen = influence[:nf].argsort(descending=True)[: min(top, nf)]
    if not len(chosen):
        return {"features": [], "replacement_right": None, "real_right": None}  # no feature to check (JSON null)
    predicted = -total_effects(attr)[chosen]
    repl = replacement_deltas(model, attr, tcs, chosen).double()
    real = real_deltas(model, attr, tcs, chosen).double()
    n = attr.nodes
    rows = [
        {
            "node": int(j),
            "layer": int(n.layer[j]),
            "pos": int(n.pos[j]),
            "feature": int(n.index[j]),
            "activation": float(n.act[j]),
            "predicted": float(p),
            "replacement": float(d),
            "real": float(r),
        }
        for j, p, d, r in zip(chosen, predicted, repl, real)
    ]
    right = lambda got: float((torch.sign(got) == torch.sign(predicted)).double().mean())
    return {"features": rows, "replacement_right": right(repl), "real_right": right(real)}
