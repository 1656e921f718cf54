"""Heads as they form: detector scores and the loss on repeated text at every weight snapshot.

Legend: S snapshots, L layers, H heads.

A run trained with `--snapshot-every N` keeps its weights every N steps (RUN/snapshots/). Each is
loaded in turn and measured on the same random token sequences repeated twice: every head's
previous-token and induction scores, and the loss on the repeated half, where only a model that
copies from the first occurrence can do better than chance. An induction head appearing shows as
its score rising at the step where that loss falls (Olsson et al. 2022).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.engine.saving import SNAPSHOTS
from attnlab.errors import AttnlabError
from attnlab.interpret.detectors import head_scores, repeated_tokens
from attnlab.interpret.trace import trace
from attnlab.io import read_metrics
from attnlab.runs.weights import load_weights
from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture

DETECTED = ("previous-token", "induction")


@torch.no_grad()
def over_training(run, n: int | None = None, batch: int = 8) -> dict:
    """Scores (S, L, H) per detector, the repeated half's loss (S,) and the validation losses."""
    files = sorted((Path(run.path) / SNAPSHOTS).glob("step_*.safetensors"))
    if not files:
        raise AttnlabError(f"{run.path} has no weight snapshots: train with --snapshot-every N")
    model = run.model
    n = n or min(model.cfg.context // 2, 50)
    ids, half = repeated_tokens(run.tokenizer.vocab_size, n, batch)
    steps, scores, repeat_loss = [], {name: [] for name in DETECTED}, []
    for f in files:
        steps.append(int(load_weights(model, f).get("step", f.stem.split("_")[1])))
        t = trace(model, ids)
        found = head_scores(t.patterns(), ids, half)
        for name in DETECTED:
            scores[name].append(found[name])
        logits = t.output[:, half:-1]  # predictions of the repeated tokens after the first
        repeat_loss.append(float(F.cross_entropy(logits.flatten(0, 1), ids[:, half + 1 :].flatten())))
    rows = read_metrics(Path(run.path) / "metrics.jsonl")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    return {
        "steps": steps,
        "scores": {k: torch.stack(v) for k, v in scores.items()},
        "repeat_loss": repeat_loss,
        "val_loss": val,
        "chance": float(torch.log(torch.tensor(float(run.tokenizer.vocab_size)))),
    }


def plot_over_training(result: dict, path: str | Path) -> Picture:
    """Top: each layer's best head per detector against the step; bottom: the losses."""
    plt = pyplot()

    steps = result["steps"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=110, sharex=True)
    for name, style in zip(DETECTED, ("--", "-")):
        s = result["scores"][name]  # (S, L, H)
        for layer in range(s.shape[1]):
            best = s[:, layer].max(-1)
            head = int(best.indices[-1])
            top.plot(steps, best.values, style, label=f"{name}, layer {layer + 1} (best: head {head + 1})")
    top.set_ylabel("score")
    top.set_ylim(0, 1)
    top.legend(fontsize=8)
    top.set_title("head detectors on repeated random tokens, at each snapshot")
    bottom.plot(steps, result["repeat_loss"], label="loss on the repeated half")
    if result["val_loss"]:
        vs, vl = zip(*result["val_loss"])
        bottom.plot(vs, vl, label="validation loss")
    bottom.axhline(result["chance"], color="gray", lw=0.8, ls=":", label="chance on random tokens")
    bottom.set_xlabel("training step")
    bottom.set_ylabel("loss (nats)")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
