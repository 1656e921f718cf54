"""Activation patching: which activation, copied from a clean run into a corrupted one, brings the
clean answer back.

Legend: B batch (patched copies run together), T positions, H heads, C model width, N sites.

Run the model on a clean input and on a corrupted one of the same length, keep the clean run's
activations, then run the corrupted input again with one activation (a site: one hook point, and
one position or one head of it, or all of it) replaced by its clean value, and read the metric m:

    effect = (m_patched - m_corrupt) / (m_clean - m_corrupt)

1 means that site alone carries everything the corruption changed, 0 that it carries nothing.
Sites come from the hook names every family shares (nn/hooks.py), never from the family:

    resid       {stack}.{i}.hook_resid_pre by position       (layer x position)
    heads       {stack}.{i}.attn.hook_head_out by head, all positions (cross.hook_head_out too);
                query heads, so a grouped-query model is patched head by head as it computes
    components  hook_attn_out, hook_cross_out, hook_ff_out and hook_resid_pre, each whole (by layer)

A stack is `blocks`, or `encoder` and `decoder` in the encoder-decoder. Many patched copies of the
corrupted input run as one batch; every baseline (m_clean, m_corrupt) is read from a batch of the
same size, each row against the same row unpatched, so a site patched with its own value changes
nothing, exactly (a matrix product may round differently at another batch size or row).
attribution.py estimates all of it from one backward pass.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.interpret.trace import trace
from attnlab.nn.hooks import Hook, hooks, taps

Metric = Callable[[Tensor], Tensor]  # the model's output (B, ...) -> one number per row (B,)

# The points patched, by the name after `{stack}.{layer}.`, and the component name they are reported by.
COMPONENTS = {
    "hook_resid_pre": "resid_pre",
    "attn.hook_head_out": "head",
    "cross.hook_head_out": "cross_head",
    "hook_attn_out": "attn_out",
    "hook_cross_out": "cross_out",
    "hook_ff_out": "mlp_out",
}
# What each granularity patches: the points, and how each is cut (by position, by head, or whole).
GRANULARITIES = {
    "resid": (("hook_resid_pre",), "position"),
    "heads": (("attn.hook_head_out", "cross.hook_head_out"), "head"),
    "components": (("hook_attn_out", "hook_cross_out", "hook_ff_out", "hook_resid_pre"), "whole"),
}
_POINT = re.compile(r"^(?P<stack>.+?)\.(?P<layer>\d+)\.(?P<leaf>" + "|".join(map(re.escape, COMPONENTS)) + r")$")
BATCH = 32  # patched copies run together: a 4-layer model's few hundred sites in a dozen passes


@dataclass(frozen=True)
class Site:
    """One patched activation: its hook point, and the part of it after the batch axis that is
    replaced (`index`: (t,) a position of a (B, T, C) stream, (h,) a head of (B, H, T, Dh), () all)."""

    point: str
    index: tuple[int, ...]
    stack: str
    layer: int
    component: str
    granularity: str
    head: int | None = None
    position: int | None = None

    def key(self) -> dict:
        """How JSON names it: component, stack, layer, head and position (null where not cut)."""
        return {
            "granularity": self.granularity,
            "component": self.component,
            "stack": self.stack,
            "layer": self.layer,
            "head": self.head,
            "position": self.position,
            "point": self.point,
        }


def sites(cache: dict[str, Tensor], granularities: Sequence[str] = tuple(GRANULARITIES)) -> list[Site]:
    """Every site of these granularities among the points a clean run recorded (in run order)."""
    unknown = [g for g in granularities if g not in GRANULARITIES]
    if unknown:
        raise AttnlabError(f"unknown granularity {unknown[0]!r}: one of {', '.join(GRANULARITIES)}")
    out = []
    for g in granularities:
        leaves, cut = GRANULARITIES[g]
        for name, x in cache.items():
            m = _POINT.match(name)
            if not m or m["leaf"] not in leaves:
                continue
            base = dict(
                point=name, stack=m["stack"], layer=int(m["layer"]), component=COMPONENTS[m["leaf"]], granularity=g
            )
            if cut == "position":
                out += [Site(index=(t,), position=t, **base) for t in range(x.shape[1])]  # x (B, T, C)
            elif cut == "head":
                out += [Site(index=(h,), head=h, **base) for h in range(x.shape[1])]  # x (B, H, T, Dh)
            else:
                out.append(Site(index=(), **base))
    return out


@dataclass
class Patching:
    """What patching measured: each site's change of the metric (m_patched - m_corrupt, or its
    first-order estimate), the two baselines, and each stack's position labels."""

    method: str  # "activation" or "attribution"
    sites: list[Site]
    changes: Tensor  # (N,) float64
    clean: float  # m_clean
    corrupted: float  # m_corrupt
    labels: dict[str, list[str]] = field(default_factory=dict)  # stack -> its positions' labels
    answer: dict = field(default_factory=dict)  # what the metric reads: metric, target, wrong, position

    @property
    def total(self) -> float:
        return self.clean - self.corrupted

    def effects(self) -> list[float | None]:
        """Each change over the total; where clean and corrupted agree (no total), 0 for no change
        and None (JSON null) for a change the total cannot scale."""
        if self.total == 0:
            return [0.0 if float(c) == 0 else None for c in self.changes]
        return [float(c) / self.total + 0.0 for c in self.changes]  # + 0.0: no -0.0

    def grid(self, granularity: str, component: str, stack: str) -> Tensor:
        """One component's effects as a (L, T), (L, H) or (L, 1) table (NaN where not measured)."""
        chosen = [
            (s, e)
            for s, e in zip(self.sites, self.effects())
            if (s.granularity, s.component, s.stack) == (granularity, component, stack)
        ]
        if not chosen:
            raise AttnlabError(f"no {granularity} {component} effects of {stack!r} were measured")
        cols = max(s.index[0] if s.index else 0 for s, _ in chosen) + 1
        out = torch.full((max(s.layer for s, _ in chosen) + 1, cols), float("nan"))
        for s, e in chosen:
            out[s.layer, s.index[0] if s.index else 0] = float("nan") if e is None else e
        return out

    def tables(self) -> list[tuple[str, str, str]]:
        """The (granularity, component, stack) tables measured, in the order measured."""
        return list(dict.fromkeys((s.granularity, s.component, s.stack) for s in self.sites))

    def as_json(self) -> dict:
        effects = [
            {**s.key(), "effect": None if e is None else round(e, 6), "change": round(float(c), 6)}
            for s, e, c in zip(self.sites, self.effects(), self.changes)
        ]
        return {
            "method": self.method,
            **self.answer,
            "m_clean": round(self.clean, 6),
            "m_corrupt": round(self.corrupted, 6),
            "total": round(self.total, 6),
            "positions": self.labels,
            "effects": effects,
        }


def check_pair(clean: tuple, corrupted: tuple) -> None:
    """Patching swaps activations position by position: both inputs must have the same shapes."""
    if len(clean) != len(corrupted):
        raise AttnlabError(f"the clean input has {len(clean)} tensors and the corrupted {len(corrupted)}")
    for a, b in zip(clean, corrupted):
        if a.shape != b.shape:
            raise AttnlabError(
                f"the clean input is {_size(a)} and the corrupted {_size(b)}: patching copies "
                "activations position by position, so give inputs of the same length"
            )
        if a.shape[0] != 1:
            raise AttnlabError(f"patching reads one clean and one corrupted example, got a batch of {a.shape[0]}")


def _size(x: Tensor) -> str:
    return f"{x.shape[1]} tokens" if x.dim() == 2 else "shaped " + " x ".join(map(str, x.shape[1:]))


def check_points(model: nn.Module) -> None:
    if not any(_POINT.match(name) for name in taps(model)):
        raise AttnlabError(
            f"this model ({type(model).__name__}) has no Transformer hook points (blocks' "
            "resid_pre, attn.hook_head_out, ...): patching reads a Transformer"
        )


def cuttable(model: nn.Module, inputs: tuple) -> dict[str, Tensor]:
    """The activations of every point patching can cut, from one trace."""
    return {k: v for k, v in trace(model, *inputs).activations.items() if _POINT.match(k)}


@torch.no_grad()
def record(model: nn.Module, inputs: tuple, points: set[str]) -> tuple[Any, dict[str, Tensor]]:
    """The model's output and the activations of `points` (only those hooked: trace's `points`)."""
    t = trace(model, *inputs, points=points)
    return t.output, t.activations


def repeat(inputs: tuple, n: int) -> tuple:
    return tuple(x.expand(n, *x.shape[1:]).contiguous() for x in inputs)  # (1, ...) -> (n, ...)


def _writer(clean: Tensor, rows: list[tuple[int, tuple[int, ...]]]) -> Hook:
    """A hook that writes, into each listed row of the batch, the clean value of its part."""

    def fn(x: Tensor) -> Tensor:
        x = x.clone()
        for r, index in rows:
            x[(r, *index)] = clean[(r, *index)].to(x.dtype)
        return x

    return fn


@torch.no_grad()
def activation_patching(
    model: nn.Module,
    clean: tuple,
    corrupted: tuple,
    metric: Metric,
    granularities: Sequence[str] = tuple(GRANULARITIES),
    batch: int = BATCH,
) -> Patching:
    """Patch every site of `granularities` from the clean run into the corrupted one, `batch` patched
    copies a forward pass; clean and corrupted are the model's inputs (each (1, ...), same shapes)."""
    check_pair(clean, corrupted)
    check_points(model)
    model.eval()
    found = sites(cuttable(model, clean), granularities)
    n = max(1, min(batch, len(found)))
    # The clean values row by row from a batch of n, as each patched row computes: a clean value from
    # a batch of 1 may differ in the last bit, and a site patched with its own value must change nothing.
    out, cache = record(model, repeat(clean, n), {s.point for s in found})
    m_clean = float(metric(out)[0])
    # Each row's own baseline: a row's rounding can depend on where it sits in the batch.
    base = metric(model(*repeat(corrupted, n))).double().cpu()  # (n,)
    changes = []
    for start in range(0, len(found), n):
        chunk = found[start : start + n]
        rows: dict[str, list] = defaultdict(list)
        for r, s in enumerate(chunk):
            rows[s.point].append((r, s.index))
        with hooks(model, {p: _writer(cache[p], rs) for p, rs in rows.items()}):
            m = metric(model(*repeat(corrupted, n))).double()  # (n,): a full batch, as the baselines'
        changes.append(m[: len(chunk)].cpu() - base[: len(chunk)])
    changes_t = torch.cat(changes) if changes else torch.zeros(0, dtype=torch.float64)
    return Patching("activation", found, changes_t, m_clean, float(base[0]))
