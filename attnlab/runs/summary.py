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

from typing import TYPE_CHECKING

from attnlab.nn.counting import ParameterCount, count_parameters
from attnlab.runs.folder import METRICS, losses
from attnlab.viz.cards import curve_svg, facts_html, facts_text

if TYPE_CHECKING:
    from attnlab.runs.run import Run


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
    planned = run.config.get("train", {}).get("max_steps")
    tok = run.tokenizer
    out = {
        "task": run.task.name or run.config.get("task", "?"),
        "model": _model(run.config),
        "size": _size(count_parameters(run.model)),
        "steps": f"{run.step:,}" + (f" of {planned:,}" if isinstance(planned, int) else ""),
        "device": str(run.device),
        "tokenizer": "none (it reads images)" if tok is None else f"{tok.kind}, {tok.vocab_size:,} tokens",
    }
    if run.quantization is not None:
        out["weights"] = f"{run.quantization.kind} (quantized for inference)"
    out["loss"] = _loss(*losses(run.path))
    return out


def _size(n: ParameterCount) -> str:
    """ "830,208 parameters", and for packed layers what they keep: their logical count and the bytes."""
    packed = f" ({n.packed:,} of them packed; {n.stored_bytes / 1e6:.2f} MB stored in all)" if n.packed else ""
    return f"{n.logical:,} parameters{packed}"


def run_text(run: Run) -> str:
    return facts_text(f"Run {run.path}", facts(run))


def run_html(run: Run) -> str:
    """The facts beside the loss curve (inline SVG), or a line saying the run has no metrics."""
    curve = curve_svg(*losses(run.path))
    if not curve:
        curve = f"<em>no loss curve: {METRICS} has no losses yet</em>"
    return facts_html(f"Run {run.path}", facts(run), curve, css_class="attnlab-card attnlab-run")
