"""Influence, circuit-tracer's two scores, and pruning of an attribution graph (circuits.py builds it).

Legend: n nodes (features, errors, embeddings, the logit, in that order), A[t, s] the edge s -> t.

    An[t, s] = |A[t, s]| / sum_s' |A[t, s']|      each node's inputs as shares (the bias left out)
    I = w (An + An^2 + An^3 + ...)                 influence on the logit through paths of any length;
                                                   w is 1 on the logit, 0 elsewhere
    replacement_score  = I(embeddings) / (I(embeddings) + I(errors))
                         the share of the end-to-end influence from the inputs that reaches the logit
                         through features rather than through error nodes
    completeness_score = sum_t c(t) (I(t) + w(t)) / sum_t (I(t) + w(t)),  t over the features and the logit,
                         c(t) = sum over non-error sources s of An[t, s]
                         the share of the attribution into the target and the features (weighted by how
                         much each matters to the target) that comes from non-error nodes

As circuit-tracer's, except that the completeness sums over the nodes that have inputs (circuit-tracer
counts the input nodes too, each as complete). Pruning, as circuit-tracer's: keep the fewest features
whose influence reaches `node_threshold` (0.8) of all features' influence; score each remaining edge by
An[t, s] (I(t) + w(t)) and keep the fewest edges that reach `edge_threshold` (0.98) of the total;
then drop, repeatedly, features left with no edge in or out and inputs with no edge out. After
pruning, An keeps the full graph's row sums, so a dropped edge counts as missing: the pruned scores
are what the pruned graph alone explains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.interpret.circuits import Attribution


def normalised(adjacency: Tensor) -> Tensor:
    a = adjacency.abs().double()
    return a / a.sum(1, keepdim=True).clamp_min(1e-30)


def influence(an: Tensor, w: Tensor) -> Tensor:
    """w (An + An^2 + ...), (n,): the graph is acyclic (layers, then positions), so the sum ends."""
    total, x = torch.zeros_like(w), w
    for _ in range(len(w)):
        x = x @ an
        if not bool(x.any()):
            break
        total = total + x
    return total


def scores(attr: Attribution, an: Tensor) -> dict[str, float]:
    """replacement_score and completeness_score of the graph whose shares are `an` (see the top)."""
    s = attr.nodes.slices()
    w = torch.zeros(len(an), dtype=an.dtype)
    w[s["logit"]] = 1.0
    inf = influence(an, w)
    emb, err = float(inf[s["embeddings"]].sum()), float(inf[s["errors"]].sum())
    rows = torch.cat([torch.arange(s["features"].stop), torch.tensor([s["logit"].start])])
    non_error = an[rows].sum(1) - an[rows][:, s["errors"]].sum(1)
    weight = (inf + w)[rows]
    return {
        "replacement_score": emb / (emb + err) if emb + err > 0 else float("nan"),
        "completeness_score": float((non_error * weight).sum() / weight.sum()),
    }


@dataclass
class Pruned:
    nodes: Tensor  # (n,) bool: kept
    edges: Tensor  # (n, n) bool: kept, [target, source]
    influence: Tensor  # (n,) every node's influence on the logit in the full graph
    before: dict[str, float]
    after: dict[str, float]


def _fewest(values: Tensor, share: float) -> Tensor:
    """A mask of the fewest entries of `values` (>= 0) whose sum reaches `share` of the total."""
    flat = values.flatten()
    total = float(flat.sum())
    if total <= 0:
        return torch.zeros_like(values, dtype=torch.bool)
    order = flat.argsort(descending=True)
    cum = flat[order].cumsum(0) / total
    count = min(len(flat), int((cum < share).sum()) + 1)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[order[:count]] = True
    return keep.view_as(values) & (values > 0)


def prune(attr: Attribution, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The nodes and edges that carry most of the influence on the logit (see the top)."""
    s = attr.nodes.slices()
    an = normalised(attr.adjacency)
    w = torch.zeros(len(an), dtype=an.dtype)
    w[s["logit"]] = 1.0
    inf = influence(an, w)
    keep = torch.ones(len(an), dtype=torch.bool)
    keep[s["features"]] = _fewest(inf[s["features"]], node_threshold)
    an_n = an * keep[:, None] * keep[None, :]
    edges = _fewest(an_n * (influence(an_n, w) + w)[:, None], edge_threshold)
    inputs = torch.zeros(len(an), dtype=torch.bool)
    inputs[s["errors"].start : s["embeddings"].stop] = True
    logit = torch.arange(len(an)) == s["logit"].start
    while True:  # drop what is left hanging
        has_in, has_out = edges.any(1), edges.any(0)
        now = keep & ((has_out & (has_in | inputs)) | logit)
        edges = edges & now[:, None] & now[None, :]
        if torch.equal(now, keep):
            break
        keep = now
    return Pruned(keep, edges, inf, scores(attr, an), scores(attr, an * edges))
