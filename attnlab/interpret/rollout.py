"""Attention rollout and attention flow: how much each output draws on each input token through all
the layers, not only through one (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Legend: L layers, H heads, T tokens of one self-attention stack (queries and keys are the same
positions), Tt target and Ts source tokens of a translation.

Both read one layer l as A_l = residual * I + (1 - residual) * mean over heads of W_l, rows
renormalized: the residual connection hands each position on unchanged beside what it attended to.
  rollout  A_L @ ... @ A_1, (T, T): the share of output i that came from input j, summed over
           every path through the layers. Rows sum to 1. One matrix product per layer.
  flow     the layered graph with nodes (layer 0..L) x positions and capacity A_l[i, j] on the
           edge (l - 1, j) -> (l, i); entry (i, j) is the max flow from input j (layer 0) to
           output i (layer L). Paths share edges, so this is not a sum over paths: it is what
           the narrowest cut between j and i lets through. Each entry lies in [0, 1] and is at
           least the rollout's; rows do not sum to 1. T^2 max-flow problems (see flow()).

run_rollouts(run, text) applies either to every family's attention (see its docstring).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.views import TRANSLATION_VIEWS, views
from attnlab.viz.html import AttentionView, Views

if TYPE_CHECKING:
    import torch

FLOW_MAX_TOKENS = 64  # T^2 max-flow problems on an (L + 1) * T node graph: ~4k of them at 64 tokens
FLOW_SCALE = 1_000_000  # scipy's max-flow takes integer capacities: weights are counted in millionths


def as_array(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """A float array from an array or a torch tensor (which may need grad or live on a GPU)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def stack_layers(weights: np.ndarray | torch.Tensor | list) -> np.ndarray:
    """L arrays (H, T, T), one (L, H, T, T) array, or one layer's (H, T, T): an (L, H, T, T) array."""
    w = np.stack([as_array(x) for x in weights]) if isinstance(weights, (list, tuple)) else as_array(weights)
    if w.ndim == 3:
        w = w[None]  # one layer
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"attention weights should be L arrays of shape (H, T, T); got shape {w.shape}")
    return w


def mixed_layers(weights: np.ndarray | torch.Tensor | list, residual: float = 0.5) -> np.ndarray:
    """Each layer's A = residual * I + (1 - residual) * mean_heads(W), rows renormalized: (L, T, T)."""
    if not 0 <= residual <= 1:
        raise AttnlabError(f"residual {residual}: give the share of the residual path, between 0 and 1")
    w = stack_layers(weights)  # (L, H, T, T)
    a = residual * np.eye(w.shape[-1]) + (1 - residual) * w.mean(1)  # (L, T, T)
    # a fully masked row (all zeros, residual 0) stays zero instead of becoming NaN
    return a / np.maximum(a.sum(-1, keepdims=True), np.finfo(float).tiny)


def rollout(weights: np.ndarray | torch.Tensor | list, residual: float = 0.5) -> np.ndarray:
    """Attention rollout of one self-attention stack, weights (L, H, T, T) (or L arrays (H, T, T),
    numpy or torch): (T, T), row i = the share of output i drawn from input token j; rows sum to 1."""
    return _chain(mixed_layers(weights, residual))


def _chain(a: np.ndarray) -> np.ndarray:
    """A_L @ ... @ A_1 of a (L, T, T)."""
    out = np.eye(a.shape[-1])
    for layer in a:
        out = layer @ out  # a later layer acts on everything before it: it goes on the left
    return out


def scipy_sparse() -> ModuleType:
    """scipy.sparse with its graph algorithms (max-flow), imported on first use."""
    import scipy.sparse.csgraph  # scipy's sparse graphs: 0.4 s to import, paid by attention flow alone

    return scipy.sparse


def _layered_graph(a: np.ndarray):
    """The capacities of a (L, T, T) as a sparse graph over (L + 1) * T nodes: node l * T + i is
    position i after layer l (l = 0: the input tokens), edge (l, j) -> (l + 1, i) holds a[l, i, j]."""
    sparse = scipy_sparse()
    n_layer, t, _ = a.shape
    n = (n_layer + 1) * t
    # scipy's maximum_flow accepts integer capacities only, so each weight is scaled by FLOW_SCALE
    # and rounded: a flow value is then off by at most half a millionth per edge of its minimum
    # cut, far below anything a picture or a ranking of tokens shows.
    cap = np.rint(a * FLOW_SCALE).astype(np.int32)  # (L, T, T)
    layer, i, j = np.nonzero(cap)  # zero-capacity edges (a causal mask, weights < 5e-7) are left out
    return sparse.csr_array((cap[layer, i, j], (layer * t + j, (layer + 1) * t + i)), shape=(n, n))


def flow(
    weights: np.ndarray | torch.Tensor | list, residual: float = 0.5, max_tokens: int = FLOW_MAX_TOKENS
) -> np.ndarray:
    """Attention flow of one self-attention stack, weights (L, H, T, T): (T, T), entry (i, j) = the
    max flow from input token j to output position i through the layers' mixed attention, in [0, 1]
    (output i takes in at most its row of the last layer, which sums to 1).

    Cost: one max-flow problem per (i, j) pair, each on (L + 1) * T nodes and up to L * T^2 edges,
    so it grows like T^4 * L (Dinic's algorithm, in scipy's compiled code): about a second at T = 30
    and several at T = 64 on a small CPU (docs/log.md, "Attention flow").
    Above max_tokens it refuses and points to rollout, one matrix product per layer.
    """
    sparse = scipy_sparse()
    a = mixed_layers(weights, residual)  # (L, T, T)
    n_layer, t, _ = a.shape
    if t > max_tokens:
        raise AttnlabError(
            f"attention flow over {t} tokens is {t * t} max-flow problems; it is limited to {max_tokens} "
            "tokens: shorten the text or use rollout (method='rollout'), which costs one product per layer"
        )
    graph = _layered_graph(a)
    reach = _chain(a) > 0  # (T, T): without a path of non-zero edges the flow is 0
    out = np.zeros((t, t))
    for i, j in zip(*np.nonzero(reach)):
        out[i, j] = sparse.csgraph.maximum_flow(graph, int(j), int(n_layer * t + i)).flow_value / FLOW_SCALE
    return out


def _follow(view: AttentionView, method: str, residual: float) -> AttentionView:
    """One self-attention view (L, H, T, T) -> its rollout or flow as a view of shape (1, 1, T, T)."""
    through = METHODS[method]
    return AttentionView(f"{view.name} {method}", view.queries, view.keys, through(view.weights, residual)[None, None])


def _through_encoder(cross: AttentionView, encoder: AttentionView, method: str) -> AttentionView:
    """Cross-attention averaged over layers and heads (Tt, Ts), times the encoder's rollout or flow
    (Ts, Ts): how much each target position draws on each source token, the encoder's mixing of
    the source included. Every decoder layer reads the encoder's last output, so each layer's
    cross-attention sits on top of the whole encoder."""
    composed = cross.weights.mean((0, 1)) @ encoder.weights[0, 0]  # (Tt, Ts)
    name = f"{cross.name} through the encoder {method}"
    return AttentionView(name, cross.queries, cross.keys, composed[None, None])


def run_rollouts(run, text: str, method: str = "rollout", residual: float = 0.5) -> Views:
    """The rollout (or flow) of every attention of `run` (attnlab.load) on `text`, as views of shape
    (1, 1, Tq, Tk) that the PNG and HTML drawers show:
      gpt, encoder  "self-attention rollout" (T, T)
      image (ViT)   "self-attention rollout" (T, T), text = an image file; row 0 is [CLS]
      seq2seq       "encoder self-attention rollout" (Ts, Ts), "decoder self-attention rollout"
                    (Tt, Tt) and "cross-attention through the encoder rollout" (Tt, Ts): the cross-
                    attention averaged over layers and heads, times the encoder rollout
      rnn-seq2seq   "cross-attention" (Tt, Ts) as it is: one alignment, no self-attention to follow
    With method="flow" the same views end in "flow"; the cross view then uses the encoder flow, and
    its rows, like the flows', no longer sum to 1.
    """
    if method not in METHODS:
        raise AttnlabError(f"unknown method {method!r}: use {' or '.join(METHODS)}")

    found = views(run, text)  # an image run's views read an image file
    out = [_follow(v, method, residual) for v in found if v.name.endswith("self-attention")]
    cross = next((v for v in found if v.name == TRANSLATION_VIEWS["cross"]), None)
    if cross is not None:
        encoder = next((v for v in out if v.name.startswith(TRANSLATION_VIEWS["encoder"])), None)
        out.append(cross if encoder is None else _through_encoder(cross, encoder, method))
    return Views(out)  # a list a notebook shows inline


METHODS = {"rollout": rollout, "flow": flow}  # by name: what follows attention through the layers
