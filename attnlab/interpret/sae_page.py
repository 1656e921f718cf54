"""`attnlab sae show DIR`: a self-contained page of an SAE's features.

Legend: B windows, T positions, S features shown, m contexts kept per feature, W a context's width.

For each feature shown: its density (how often it fires, from the evaluation in sae.json), its top
activating contexts from the run's validation split (each token shaded by the feature's activation
there), and its logit effects: the decoder row (times the SAE's scale) read through the model's
final norm's gain and the unembedding, centred over the vocabulary: the tokens it promotes and
suppresses most when added to the residual stream. The page is one HTML file (no script, no CDN).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.batches import windows
from attnlab.errors import AttnlabError
from attnlab.interpret.own_data import block_of
from attnlab.interpret.sae import SavedSAE
from attnlab.interpret.sae_train import check_run, read_point
from attnlab.interpret.views import token_labels
from attnlab.io import write_text
from attnlab.models.protocols import ReadOut
from attnlab.runs.run import Run
from attnlab.viz.html import page, static_text

LEFT, RIGHT = 24, 6  # tokens shown before and after the one the feature fires on


@dataclass
class TopContexts:
    features: list[int]  # the S features, by index
    values: Tensor  # (S, m) their highest activations
    acts: Tensor  # (S, m, W) the feature's activation on each context token
    ids: Tensor  # (S, m, W) the context's token ids (-1: outside the window)


def pick_features(density: list[float], count: int) -> list[int]:
    """`count` live features spread evenly over the density ranking (rare to common), by index."""
    d = np.asarray(density)
    live = np.argsort(d)[(d[np.argsort(d)] > 0)]
    if len(live) <= count:
        return sorted(live.tolist())
    return sorted(live[np.linspace(0, len(live) - 1, count).round().astype(int)].tolist())


def _merge(best: TopContexts | None, new: TopContexts, m: int) -> TopContexts:
    if best is None:
        return new
    values = torch.cat([best.values, new.values], 1)  # (S, 2m)
    top = values.topk(min(m, values.shape[1]), dim=1).indices  # (S, m)
    pick = top.unsqueeze(-1).expand(-1, -1, best.acts.shape[-1])
    acts, ids = torch.cat([best.acts, new.acts], 1).gather(1, pick), torch.cat([best.ids, new.ids], 1).gather(1, pick)
    return TopContexts(best.features, values.gather(1, top), acts, ids)


def _batch_tops(z: Tensor, ids: Tensor, features: list[int], m: int) -> TopContexts:
    """The top m positions of each feature in one batch z (B, T, S) and their contexts."""
    B, T, S = z.shape
    vals, flat = z.permute(2, 0, 1).reshape(S, B * T).topk(min(m, B * T), dim=1)  # (S, m)
    b, t = flat // T, flat % T
    span = t.unsqueeze(-1) + torch.arange(LEFT + RIGHT + 1)  # (S, m, W) positions in the padded window
    zp = F.pad(z, (0, 0, LEFT, RIGHT))  # (B, LEFT + T + RIGHT, S)
    idp = F.pad(ids, (LEFT, RIGHT), value=-1)
    feat = torch.arange(S).view(S, 1, 1)
    return TopContexts(features, vals, zp[b.unsqueeze(-1), span, feat], idp[b.unsqueeze(-1), span])


@torch.no_grad()
def top_contexts(
    run: Run,
    saved: SavedSAE,
    features: list[int],
    tokens: int = 65536,
    m: int = 8,
    batch: int = 8,
    reader: Callable[[Run, str, Tensor], Tensor] = read_point,
) -> TopContexts:
    """Each feature's m highest activations over the first `tokens` tokens of the validation split;
    reader: what reads the SAE's input at its hook (a transcoder's reads an MLP's input)."""
    hook, sae = saved.info["hook"], saved.sae
    data = check_run(run, hook)
    split = "val" if len(data.splits["val"]) > block_of(run) else "train"
    arr = np.asarray(data.splits[split])[: tokens + 1]
    block = min(block_of(run), len(arr) - 1)
    chosen, best = torch.tensor(features, device=run.device), None
    for xy in windows(arr, block, batch):
        ids = torch.from_numpy(xy[:, :-1]).to(run.device)  # (B, T)
        z = sae.encode(reader(run, hook, ids))[..., chosen]  # (B, T, S)
        best = _merge(best, _batch_tops(z.cpu(), ids.cpu(), features, m), m)
    if best is None:
        raise AttnlabError("the run's data has no tokens to find the features' contexts in")
    return best


@torch.no_grad()
def direct_logits(model: ReadOut, rows: Tensor) -> Tensor:
    """What directions written into the final stream do to the logits, (S, D) -> (S, V): through the
    final norm's gain and the head, centred (a constant on every logit changes nothing)."""
    _, norm, head = model.readout()
    gain = getattr(norm, "weight", None)
    effect = head((rows * gain) if gain is not None else rows).float()  # (S, V)
    return effect - effect.mean(-1, keepdim=True)


@torch.no_grad()
def logit_effects(run: Run, saved: SavedSAE, features: list[int], n: int = 8) -> dict[int, dict] | None:
    """Each feature's top promoted and suppressed tokens, or None when the hook is not on the stream
    the model's head reads."""
    model = run.model
    if not isinstance(model, ReadOut):
        return None
    stack, norm, head = model.readout()
    if not saved.info["hook"].startswith(stack + "."):
        return None
    effect = direct_logits(model, saved.sae.W_dec[features] * saved.sae.scale)  # the features' raw directions
    out = {}
    for f, row in zip(features, effect):
        up, down = row.topk(n), (-row).topk(n)
        out[f] = {
            "promoted": [(int(i), float(v)) for v, i in zip(up.values, up.indices)],
            "suppressed": [(int(i), -float(v)) for v, i in zip(down.values, down.indices)],
        }
    return out


def _context_html(tok, acts: Tensor, ids: Tensor, peak: float) -> str:
    spans = []
    for a, i in zip(acts.tolist(), ids.tolist()):
        if i < 0:
            continue
        alpha = 0.0 if peak <= 0 else max(0.0, min(1.0, a / peak))
        text = html.escape(token_labels(tok, [i])[0])
        spans.append(f'<span class="t" style="background:rgba(255,140,0,{alpha:.2f})" title="{a:.3f}">{text}</span>')
    return "".join(spans)


def _feature_html(run: Run, f: int, k: int, tops: TopContexts, density: float, effects: dict | None) -> str:
    peak = float(tops.values[k, 0])
    parts = [
        f'<div class="feature" id="f{f}"><h2>feature {f} <span class="density">fires on '
        f"{density:.3%} of tokens (1 in {1 / density:,.0f}); top activation {peak:.3f}</span></h2>"
    ]
    if effects is not None:
        for name, cls in (("promoted", "up"), ("suppressed", "down")):
            words = ", ".join(
                f"{html.escape(token_labels(run.tokenizer, [i])[0])} ({v:+.2f})" for i, v in effects[f][name]
            )
            parts.append(f'<div class="logits {cls}">{name}: {words}</div>')
    for j in range(tops.values.shape[1]):
        if float(tops.values[k, j]) <= 0:
            break
        ctx = _context_html(run.tokenizer, tops.acts[k, j], tops.ids[k, j], peak)
        parts.append(f'<div class="ctx"><span class="v">{float(tops.values[k, j]):.3f}</span>{ctx}</div>')
    return "\n".join(parts) + "</div>"


def _summary_html(saved: SavedSAE, shown: int) -> str:
    info, m = saved.info, saved.info.get("metrics", {})
    names = ("explained_variance", "l0", "ce_loss_recovered", "kl_div", "dead_fraction")
    rows = "".join(f"<tr><td>{n}</td><td>{m[n]:.4f}</td></tr>" for n in names if isinstance(m.get(n), float | int))
    cfg = info["config"]
    head = (
        f"<p>{cfg['kind']} SAE, {cfg['latents']:,} latents over <code>{html.escape(info['hook'])}</code> of "
        f"<code>{html.escape(str(info.get('run', '')))}</code>; {shown} live features shown, spread from rare "
        f"to common.</p><table class='metrics'>{rows}</table>"
    )
    hist = m.get("density_histogram")
    if not hist or not hist["counts"]:
        return head
    top = max(hist["counts"]) or 1
    bars = "".join(f'<div style="height:{80 * c / top:.0f}px" title="{c} latents"></div>' for c in hist["counts"])
    labels = "".join(f"<span>{e:g}</span>" for e in hist["log10_edges"][:-1])
    return (
        head + f"<p>feature density (log10 of firing frequency; {hist['dead']} dead):</p>"
        f'<div class="hist">{bars}</div><div class="histlabels">{labels}</div>'
    )


def write_page(run: Run, saved: SavedSAE, out: str | Path, count: int = 48, tokens: int = 65536) -> Path:
    """The feature page of `saved` on `run`, written to `out`."""
    density = saved.info.get("metrics", {}).get("density")
    if not density:
        raise AttnlabError("sae.json holds no feature densities: train the SAE with attnlab sae train")
    features = pick_features(density, count)
    if not features:
        raise AttnlabError("every latent of this SAE is dead: there is no feature to show")
    tops = top_contexts(run, saved, features, tokens)
    effects = logit_effects(run, saved, features)
    body = "\n".join(_feature_html(run, f, k, tops, density[f], effects) for k, f in enumerate(features))
    title = f"SAE features: {Path(saved.info.get('run', '')).name} {saved.info['hook']}"
    summary, style = _summary_html(saved, len(features)), static_text("page.css") + static_text("sae.css")
    text = page("sae.html", {"TITLE": html.escape(title), "STYLE": style, "SUMMARY": summary, "FEATURES": body})
    path = Path(out)
    write_text(path, text)
    return path
