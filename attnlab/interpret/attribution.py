"""Attribution patching (AtP): every site of activation patching estimated from one forward and one
backward pass of the corrupted input (Nanda 2023; Kramar et al. 2024, "AtP*").

Legend: B batch, T positions, H heads, C model width, N sites.

To first order, copying a site's clean activation a_clean over the corrupted a_corrupt changes the
metric by

    m(a_clean) - m(a_corrupt) ~ (a_clean - a_corrupt) . dm/da at a_corrupt

summed over the site's part (one position, one head, or the whole point). One backward pass gives
dm/da at every point at once, so a model of any size costs one clean run, one corrupted run and one
backward pass, however many sites. Where m is linear in the activation (a linear model) the estimate
is exact, and since it is linear in the patch, the effects of a point's positions add up to the effect
of the whole point. Attention's softmax and the norms make it an approximation elsewhere: compare it
with activation_patching (benchmarks/patching.py measures the rank correlation on induction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.interpret.patching import (
    GRANULARITIES,
    Metric,
    Patching,
    check_pair,
    check_points,
    cuttable,
    record,
    sites,
)
from attnlab.nn.block import Block
from attnlab.nn.hooks import Hook, hooks, taps


def _opening(store: dict[str, tuple[Tensor, Tensor]], name: str) -> Hook:
    """A hook that adds a zero the gradient can reach: d metric / d zero = d metric / d activation."""

    def fn(x: Tensor) -> Tensor:
        zero = torch.zeros_like(x, requires_grad=True)
        store[name] = (x.detach(), zero)
        return x + zero

    return fn


def attribution_patching(
    model: nn.Module,
    clean: tuple,
    corrupted: tuple,
    metric: Metric,
    granularities: Sequence[str] = tuple(GRANULARITIES),
) -> Patching:
    """AtP's estimate of every site activation_patching measures (same arguments, same result type)."""
    check_pair(clean, corrupted)
    check_points(model)
    model.eval()
    found = sites(cuttable(model, clean), granularities)
    points = list(dict.fromkeys(s.point for s in found))
    out, cache = record(model, clean, set(points))
    m_clean = float(metric(out)[0])
    store: dict[str, tuple[Tensor, Tensor]] = {}
    with torch.enable_grad(), hooks(model, {p: _opening(store, p) for p in points}):
        m = metric(model(*corrupted))[0]
        # torch.autograd.grad: only the openings' gradients, none accumulated into the weights
        grads = torch.autograd.grad(m, [store[p][1] for p in points], allow_unused=True)
    grad = {p: torch.zeros_like(store[p][1]) if g is None else g for p, g in zip(points, grads)}
    changes = []
    for s in found:
        diff = cache[s.point][(0, *s.index)].double() - store[s.point][0][(0, *s.index)].double()
        changes.append(float((diff * grad[s.point][(0, *s.index)].double()).sum()))
    return Patching("attribution", found, torch.tensor(changes, dtype=torch.float64), m_clean, float(m.detach()))


# ---- edge attribution patching (EAP, EAP-IG) over the residual graph ----------------------------------
#
# In a block whose sublayers add to the stream (pre-norm: x_after = x_before + f(x_before)), each
# sublayer's input is the sum of everything written before it: the stack's input (the embedding) and
# every earlier sublayer's output. That is the residual graph: an edge from each output u to each later
# input v. To first order, patching edge u -> v alone (v reads u's clean output, everything else
# corrupted) changes the metric by (u_clean - u_corrupt) . dm/d(input of v), and the gradient into v's
# input is the stream's gradient before the sublayer minus after it (what flows through f alone); the
# stack's output (the logits' input) reads the last stream (Syed et al. 2023, "Attribution Patching
# Outperforms Automated Circuit Discovery"). EAP-IG (Hanna et al. 2024) averages that gradient over
# `steps` inputs on the straight line from the corrupted stack input to the clean one, which follows a
# curved metric better than one gradient. Edges stay within a stack: an encoder-decoder's memory edges
# (encoder -> cross-attention's keys and values) are not counted.

_STREAM_POINT = re.compile(r"^(?P<stack>.+?)\.(?P<layer>\d+)\.(?P<leaf>hook_\w+)$")
# Each sublayer: its output point, and the stream points before and after it (the first present).
SUBLAYERS = (
    ("attn", "hook_attn_out", ("hook_resid_pre",), "hook_resid_mid"),
    ("cross", "hook_cross_out", ("hook_resid_mid",), "hook_resid_cross"),
    ("ff", "hook_ff_out", ("hook_resid_cross", "hook_resid_mid"), "hook_resid_post"),
)


@dataclass
class Node:
    """A sublayer of the residual graph: where it writes, and the stream points around its input."""

    stack: str
    layer: int
    name: str  # attn, cross, ff
    output: str
    before: str
    after: str


def residual_graph(model: nn.Module, cache: dict[str, Tensor]) -> dict[str, list[Node]]:
    """Per stack, its sublayers in the order they run, from the points a run recorded."""
    graph: dict[str, list[Node]] = {}
    for point in cache:
        m = _STREAM_POINT.match(point)
        if not m or m["leaf"] != "hook_resid_pre":
            continue
        stack, layer = m["stack"], int(m["layer"])
        block = model.get_submodule(f"{stack}.{layer}")
        if isinstance(block, Block) and not block.pre_norm:
            raise AttnlabError(
                "edge attribution reads the residual graph of pre-norm blocks (each sublayer adds to "
                "the stream); this model normalizes after the residual (post-norm)"
            )
        at = lambda leaf, stack=stack, layer=layer: f"{stack}.{layer}.{leaf}"  # noqa: E731
        for name, out, before, after in SUBLAYERS:
            source = next((at(b) for b in before if at(b) in cache), None)
            if at(out) in cache and source is not None and at(after) in cache:
                graph.setdefault(stack, []).append(Node(stack, layer, name, at(out), source, at(after)))
    return graph


def _stream_grads(
    model: nn.Module,
    inputs: tuple,
    metric: Metric,
    points: list[str],
    starts: dict[str, tuple[Tensor, Tensor]],
    alpha: float | None,
) -> dict[str, Tensor]:
    """dm/d(stream) at each point; with alpha, each stack's input set to corrupt + alpha (clean - corrupt)."""
    zeros: dict[str, Tensor] = {}

    def opening(name: str) -> Hook:
        def fn(x: Tensor) -> Tensor:
            if alpha is not None and name in starts:
                bad, good = starts[name]
                x = bad + alpha * (good - bad)
            zeros[name] = torch.zeros_like(x, requires_grad=True)
            return x + zeros[name]

        return fn

    with torch.enable_grad(), hooks(model, {p: opening(p) for p in points}):
        m = metric(model(*inputs))[0]
        grads = torch.autograd.grad(m, [zeros[p] for p in points], allow_unused=True)
    return {p: torch.zeros_like(zeros[p]) if g is None else g.detach() for p, g in zip(points, grads)}


def edge_attribution(model: nn.Module, clean: tuple, corrupted: tuple, metric: Metric, steps: int = 0) -> dict:
    """EAP (steps 0) or EAP-IG (steps k >= 1) scores of every edge of the residual graph: {method, steps,
    m_clean, m_corrupt, total, edges: [{stack, from, to, score, effect}]}, `from` an output point (a
    stack's first hook_resid_pre: its input), `to` a sublayer ("blocks.1.attn") or "{stack}.out"."""
    if steps < 0:
        raise AttnlabError(f"EAP-IG's steps: a whole number from 1 (0: plain EAP), got {steps}")
    check_pair(clean, corrupted)
    check_points(model)
    model.eval()
    every = {n for n in taps(model) if _STREAM_POINT.match(n)}
    out_clean, good = record(model, clean, every)
    out_bad, bad = record(model, corrupted, every)
    m_clean, m_corrupt = float(metric(out_clean)[0]), float(metric(out_bad)[0])
    graph = residual_graph(model, bad)
    if not graph:
        raise AttnlabError(
            "edge attribution reads the residual stream around each sublayer (hook_resid_pre, "
            "hook_resid_mid, hook_resid_post); this model records none"
        )
    streams = sorted({p for nodes in graph.values() for n in nodes for p in (n.before, n.after)}, key=list(bad).index)
    starts = {
        f"{stack}.0.hook_resid_pre": (bad[f"{stack}.0.hook_resid_pre"], good[f"{stack}.0.hook_resid_pre"])
        for stack in graph
    }
    alphas = [None] if steps == 0 else [(i + 1) / steps for i in range(steps)]
    runs = [_stream_grads(model, corrupted, metric, streams, starts, a) for a in alphas]
    grad = {p: sum(r[p] for r in runs) / len(runs) for p in streams}
    total = m_clean - m_corrupt
    edges = []
    for stack, nodes in graph.items():
        first = f"{stack}.0.hook_resid_pre"
        senders = [(first, good[first] - bad[first])]
        for v in [*nodes, None]:  # None: the stack's output, which reads the last stream
            g = grad[nodes[-1].after] if v is None else grad[v.before] - grad[v.after]
            to = f"{stack}.out" if v is None else f"{stack}.{v.layer}.{v.name}"
            for name, diff in senders:
                score = float((diff.double() * g.double()).sum())
                edges.append(
                    {
                        "stack": stack,
                        "from": name,
                        "to": to,
                        "score": score,
                        "effect": score / total if total else (0.0 if score == 0 else None),
                    }
                )
            if v is not None:
                senders.append((v.output, good[v.output] - bad[v.output]))
    return {
        "method": "eap-ig" if steps else "eap",
        "steps": steps,
        "m_clean": m_clean,
        "m_corrupt": m_corrupt,
        "total": total,
        "edges": edges,
    }
