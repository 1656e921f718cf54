"""Path patching: a sender head's effect through named receiver heads only (Wang et al. 2022,
"Interpretability in the Wild"; Goldowsky-Dill et al. 2023).

Legend: B batch, H heads, T positions, Dh head size.

Activation patching a head measures everything downstream of it at once. Path patching keeps only the
paths that go from the sender straight (through the residual stream) into the receivers:
  1. run clean and corrupted, keeping every head's output and every feed-forward's output;
  2. run the corrupted input with the sender's heads set to their clean values and every other head
     and feed-forward frozen at its corrupted value, except the receivers, which compute freely: they
     now see the sender's clean output and nothing else changed; keep what they write;
  3. run the corrupted input with only the receivers' outputs replaced by what step 2 kept, and read
     the metric. effect = (m_3 - m_corrupt) / (m_clean - m_corrupt), as activation patching's.
Heads are named as --remove names them (interpret/head_select.py): "1.2" layer 1 head 2, "2" all of
layer 2, "cross:1.2" an encoder-decoder's cross-attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.interpret.head_select import parse_heads
from attnlab.interpret.patching import _POINT, Metric, check_pair, check_points, record
from attnlab.nn.hooks import Hook, hooks, taps

FROZEN = ("attn.hook_head_out", "cross.hook_head_out", "hook_ff_out")  # what step 2 holds at its corrupted value


def _frozen_points(model: nn.Module) -> list[str]:
    return [n for n in taps(model) if (m := _POINT.match(n)) and m["leaf"] in FROZEN]


def _step2(bad: Tensor, clean: Tensor, send: set[int], receive: set[int], keep: Callable[[Tensor], None]) -> Hook:
    """The frozen corrupted value, with the sender's heads clean and the receivers' heads live (kept)."""

    def fn(x: Tensor) -> Tensor:
        y = bad.clone()
        for h in send:
            y[:, h] = clean[:, h]  # (B, T, Dh) of head h
        for h in receive:
            y[:, h] = x[:, h]
        if receive:
            keep(x)
        return y

    return fn


def _step3(kept: Tensor, receive: set[int]) -> Hook:
    def fn(x: Tensor) -> Tensor:
        y = x.clone()
        for h in receive:
            y[:, h] = kept[:, h]
        return y

    return fn


@torch.no_grad()
def path_patching(
    model: nn.Module, clean: tuple, corrupted: tuple, metric: Metric, sender: str, receivers: str
) -> dict:
    """The effect of the `sender` heads on the metric through the `receivers` heads alone (see the
    module's docstring): {m_clean, m_corrupt, m_patched, effect, sender, receivers} (points -> heads)."""
    check_pair(clean, corrupted)
    check_points(model)
    model.eval()
    send, receive = parse_heads(sender, model), parse_heads(receivers, model)
    if both := {(p, h) for p, hs in send.items() for h in hs} & {(p, h) for p, hs in receive.items() for h in hs}:
        raise AttnlabError(f"a head cannot be both sender and receiver ({len(both)} are): name them apart")
    points = set(_frozen_points(model))
    out_clean, good = record(model, clean, points)
    out_bad, bad = record(model, corrupted, points)
    m_clean, m_corrupt = float(metric(out_clean)[0]), float(metric(out_bad)[0])
    kept: dict[str, Tensor] = {}
    keep = lambda p: lambda x: kept.__setitem__(p, x.detach().clone())  # noqa: E731
    step2 = {
        p: _step2(bad[p], good[p], send.get(p, set()), receive.get(p, set()), keep(p)) for p in bad
    }  # the points that ran
    with hooks(model, step2):
        model(*corrupted)
    with hooks(model, {p: _step3(kept[p], hs) for p, hs in receive.items()}):
        m = float(metric(model(*corrupted))[0])
    total = m_clean - m_corrupt
    effect = (m - m_corrupt) / total if total else (0.0 if m == m_corrupt else None)
    named = lambda d: {p: sorted(hs) for p, hs in d.items()}  # noqa: E731
    return {
        "m_clean": m_clean,
        "m_corrupt": m_corrupt,
        "m_patched": m,
        "effect": effect,
        "sender": named(send),
        "receivers": named(receive),
    }
