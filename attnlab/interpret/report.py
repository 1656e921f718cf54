"""One entry point for `attnlab inspect`, the explorer's "Inside the model" views and the Python API:
inspect(run, text, what) -> the numbers, as JSON-ready dicts.

    lens      the logit lens of a GPT or a translation decoder: {tokens, layers, top (L+1, T), prob
              (L+1, T), target_prob}
    heads     detector scores per head: {kind: "tables", tables: {name: (L, H)}, title}
    ablate    the loss change when each head is zeroed: {kind: "tables", tables, title, loss}; with no
              text, on random tokens repeated twice, the loss of the repeated half (induction's job),
              or with on="val" the run's validation split (its first VAL_TOKENS tokens)
    rollout   attention rollout (or `flow`) of every attention: {kind: "views", views: views_json}
    over-training  detector scores and the repeated half's loss at every weight snapshot: {kind:
              "over-training", steps, scores: {detector: (S, L, H)}, repeat_loss, val_loss, chance}
INSPECTIONS holds them by name; a new one is a function and one line there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.data.batches import windows
from attnlab.errors import AttnlabError
from attnlab.interpret.ablation import head_ablation
from attnlab.interpret.detectors import head_scores, repeated_tokens
from attnlab.interpret.lens import logit_lens
from attnlab.interpret.over_training import over_training
from attnlab.interpret.own_data import block_of, own_tokens
from attnlab.interpret.rollout import run_rollouts
from attnlab.interpret.trace import trace
from attnlab.models.protocols import CausalLM
from attnlab.runs.run import Run
from attnlab.viz.html import views_json

VAL_TOKENS = 8192  # enough windows for a stable loss, few enough to zero every head in seconds


def _ids(run, text: str) -> torch.Tensor:
    if not isinstance(run.model, CausalLM):
        raise AttnlabError(
            "lens, heads and ablate read a language-model run (attnlab train lm); rollout and flow read any run"
        )
    ids = torch.tensor([run.tokenizer.encode(text)], device=run.device)[:, : run.model.cfg.context]  # (1, T)
    if ids.shape[1] < 2:
        raise AttnlabError("give an input of at least two tokens")
    return ids


def tables_json(tables: dict[str, torch.Tensor]) -> dict[str, list]:
    return {name: [[round(float(v), 4) for v in row] for row in t] for name, t in tables.items()}


@torch.no_grad()
def inspect(run: Run, text: str | None, what: str, on: str | None = None) -> dict:
    """What `what` (a key of INSPECTIONS) finds in `run` (attnlab.load) on `text` (see the module's
    docstring). `on`: what an inspection of TAKES_ON reads when no text is given (default: repeats);
    given to any other inspection, or beside a text, it would be ignored, so it is refused."""
    if what not in INSPECTIONS:
        raise AttnlabError(f"--what {what!r}: one of {', '.join(INSPECTIONS)}")
    if on is not None:
        if on not in ABLATION_INPUTS:
            raise AttnlabError(f"--on {on!r}: one of {', '.join(ABLATION_INPUTS)}")
        if what not in TAKES_ON:
            raise AttnlabError(
                f"--on {on} does not apply to --what {what}, which reads "
                f"{'the given input' if what not in FROM_SNAPSHOTS else 'the weight snapshots'}; "
                f"--on chooses the data of --what {' or '.join(TAKES_ON)} with no text"
            )
        if text is not None:
            raise AttnlabError(f"--on {on} reads {ON_WHAT[on]} in place of a text: give the text or --on, not both")
    run.model.eval()
    return INSPECTIONS[what](run, text, on or "repeats")


def needs_text(text: str | None, what: str) -> str:
    if text is None:
        raise AttnlabError(f"--what {what} needs an input (a text; an image file for image runs)")
    return text


def _lens(run: Run, text: str | None, on: str) -> dict:
    ids, src, decode = run.task.lens_input(run, needs_text(text, "lens"))
    return {"kind": "lens", "what": "lens", **logit_lens(run.model, ids, decode, src=src).as_json()}


def _heads(run: Run, text: str | None, on: str) -> dict:
    tables = tables_json(detector_tables(run, _ids(run, needs_text(text, "heads"))))
    return {
        "kind": "tables",
        "what": "heads",
        "tables": tables,
        "title": "head detectors (previous, first, duplicate: on the input; induction: repeated random tokens)",
    }


def _ablate(run: Run, text: str | None, on: str) -> dict:
    """The loss change of zeroing each head on `text`; with no text, on repeated random tokens or the
    validation split (`on`)."""
    if text is None:
        return ABLATION_INPUTS[on](run)
    ids = _ids(run, text)
    x, y = ids[:, :-1], ids[:, 1:]
    loss = lambda: run.model(x, y)[1]
    table = head_ablation(run.model, loss, (x,), "zero")
    return {
        "kind": "tables",
        "what": "ablate",
        "tables": tables_json({"loss change when zeroed": table}),
        "title": "head ablation: loss with the head zeroed minus the loss",
        "loss": round(float(loss()), 4),
        "diverging": True,
    }


def _through(method: str) -> Callable[[Run, str | None, str], dict]:
    """Attention rollout or flow of every attention of the run (interpret/rollout.py)."""

    def views(run: Run, text: str | None, on: str) -> dict:
        return {"kind": "views", "what": method, **views_json(run_rollouts(run, needs_text(text, method), method))}

    return views


def _over_training(run: Run, text: str | None, on: str) -> dict:
    """Detector scores and the repeated half's loss at every weight snapshot (interpret/over_training.py)."""
    result = over_training(run)
    scores = {k: [tables_json({"": s})[""] for s in v] for k, v in result["scores"].items()}
    return {"kind": "over-training", "what": "over-training", **result, "scores": scores}


@torch.no_grad()
def repeated_ablation(run, batch: int = 8) -> dict:
    """Head ablation on random tokens repeated twice, scored by the loss of the repeated half: the
    part only copying from the first occurrence can predict, so it shows which heads do induction."""

    if not isinstance(run.model, CausalLM):
        raise AttnlabError("ablation on repeated tokens reads a language-model run (attnlab train lm)")
    n = min(run.model.cfg.context // 2, 50)
    ids, half = repeated_tokens(run.tokenizer.vocab_size, n, batch)
    ids = ids.to(run.device)

    def loss() -> torch.Tensor:  # predictions of the repeated tokens after the first
        logits = run.model(ids)[:, half:-1]
        return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, half + 1 :].flatten())

    on = f"{batch} random sequences of {n} tokens repeated twice: the loss of the repeated half"
    return _ablated(run, loss, (ids,), on)


@torch.no_grad()
def split_ablation(run, tokens: int = VAL_TOKENS) -> dict:
    """Head ablation on the first `tokens` tokens of the run's own validation split, in full windows."""

    data = run.config.get("data", {})
    if not isinstance(run.model, CausalLM) or "data" not in data:
        raise AttnlabError("ablation on the validation split reads a language-model run (attnlab train lm)")
    arr = np.asarray(own_tokens(run).splits["val"])[: tokens + 1]
    block = block_of(run)
    n = (len(arr) - 1) // block
    if n < 1:
        raise AttnlabError(f"the validation split has {len(arr)} tokens, less than one window of {block}")
    xy = torch.from_numpy(next(windows(arr, block, n))).to(run.device)  # (n, block + 1)

    def loss() -> torch.Tensor:
        return F.cross_entropy(run.model(xy[:, :-1]).flatten(0, 1).float(), xy[:, 1:].flatten())

    return _ablated(run, loss, (xy[:, :-1],), f"{n * block:,} tokens of the validation split: the loss")


def _ablated(run, loss: Callable[[], torch.Tensor], inputs: tuple, on: str) -> dict:
    """The report of zeroing each head in turn: `loss` with the head zeroed minus `loss`, measured `on`."""
    table = head_ablation(run.model, loss, inputs, "zero")
    return {
        "kind": "tables",
        "what": "ablate",
        "tables": tables_json({"loss change when zeroed": table}),
        "title": f"head ablation on {on} with the head zeroed minus the loss",
        "loss": round(float(loss()), 4),
        "diverging": True,
    }


def detector_tables(run, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every detector's (L, H) scores: previous, first and duplicate token on `ids`, induction on
    random tokens repeated twice."""

    patterns = lambda x: trace(run.model, x).patterns().cpu()  # (B, L, H, T, T)
    scores = head_scores(patterns(ids), ids.cpu())
    n = min(run.model.cfg.context // 2, 50)
    rep, half = repeated_tokens(run.tokenizer.vocab_size, n, batch=8)
    scores["induction"] = head_scores(patterns(rep.to(run.device)), rep, half)["induction"]
    return scores


# What `attnlab inspect --what` computes, by name (each: run, text or None, `on` -> a JSON-ready dict
# whose "kind" says how it is shown: lens, tables, views or over-training).
INSPECTIONS: dict[str, Callable[[Run, str | None, str], dict]] = {
    "lens": _lens,
    "heads": _heads,
    "ablate": _ablate,
    "rollout": _through("rollout"),
    "flow": _through("flow"),
    "over-training": _over_training,
}
FROM_SNAPSHOTS = {"over-training"}  # reads the run's weight snapshots, not an input
WHAT = tuple(name for name in INSPECTIONS if name not in FROM_SNAPSHOTS)  # what reads an input (the explorer's)
ABLATION_INPUTS = {"repeats": repeated_ablation, "val": split_ablation}  # --on, with no text
ON_WHAT = {"repeats": "random tokens repeated twice", "val": "the run's validation split"}
TAKES_ON = ("ablate",)  # the inspections that read ABLATION_INPUTS[on] when given no text
