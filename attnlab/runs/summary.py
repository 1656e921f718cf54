"""What a loaded run is, in a few facts: `Run.__repr__` (a terminal) and `Run._repr_html_` (a notebook
shows the facts and the loss curve of metrics.jsonl, drawn inline by viz/cards.py).

    >>> attnlab.load("runs/demo")
    Run runs/demo
      task       lm
      model      gpt: 4 layers x 4 heads, width 128
      size       814,336 parameters
      ...
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.io import read_metrics
from attnlab.runs.folder import METRICS
from attnlab.viz.cards import curve_svg, facts_html, facts_text

if TYPE_CHECKING:
    from attnlab.runs.run import Run


def losses(path: Path, max_rows: int | None = None) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) pairs of a run's metrics.jsonl (none if missing);
    max_rows thins the training rows as read_metrics does (every validation row is kept)."""
    rows = [r for r in read_metrics(Path(path) / METRICS, max_rows) if "step" in r]
    train = [(r["step"], float(r["loss"])) for r in rows if isinstance(r.get("loss"), (int, float))]
    val = [(r["step"], float(r["val_loss"])) for r in rows if isinstance(r.get("val_loss"), (int, float))]
    return train, val


def _model(config: dict) -> str:
    """ "gpt: 2 layers x 2 heads, width 32", from what config.json's model section has of these."""
    m = config.get("model", {})
    shape = [f"{m[k]} {word}" for k, word in (("n_layer", "layers"), ("n_head", "heads")) if k in m]
    size = " x ".join(shape) + (f", width {m['d_model']}" if "d_model" in m else "")
    return f"{config.get('family', '?')}" + (f": {size}" if size else "")


def _loss(train: list, val: list) -> str:
    parts = [f"train {train[0][1]:.3f} -> {train[-1][1]:.3f}"] if train else []
    parts += [f"validation {val[-1][1]:.3f} (step {val[-1][0]})"] if val else []
    return ", ".join(parts) or f"none logged (no {METRICS} rows)"


def facts(run: Run) -> dict[str, str]:
    """The run's task, model, size in parameters, steps, device, tokenizer and losses, as text."""
    n = sum(p.numel() for p in run.model.parameters())
    planned = run.config.get("train", {}).get("max_steps")
    tok = run.tokenizer
    out = {
        "task": run.task.name or run.config.get("task", "?"),
        "model": _model(run.config),
        "size": f"{n:,} parameters",
        "steps": f"{run.step:,}" + (f" of {planned:,}" if isinstance(planned, int) else ""),
        "device": str(run.device),
        "tokenizer": "none (it reads images)" if tok is None else f"{tok.kind}, {tok.vocab_size:,} tokens",
    }
    if run.quantization is not None:
        out["weights"] = f"{run.quantization.kind} (quantized for inference)"
    out["loss"] = _loss(*losses(run.path))
    return out


def run_text(run: Run) -> str:
    return facts_text(f"Run {run.path}", facts(run))


def run_html(run: Run) -> str:
    """The facts beside the loss curve (inline SVG), or a line saying the run has no metrics."""
    curve = curve_svg(*losses(run.path))
    if not curve:
        curve = f"<em>no loss curve: {METRICS} has no losses yet</em>"
    return facts_html(f"Run {run.path}", facts(run), curve, css_class="attnlab-card attnlab-run")
