"""`attnlab inspect RUN INPUT --what lens|heads|ablate|rollout|flow|over-training`: what a model's
layers and heads do. The numbers come from interpret/report.py; this file prints and writes them,
by the kind of result each inspection gives (lens, tables, views, over-training)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from attnlab.cli.options import InspectOptions
from attnlab.errors import AttnlabError
from attnlab.interpret.lens import Lens, plot_lens
from attnlab.interpret.over_training import plot_over_training
from attnlab.interpret.report import inspect
from attnlab.runs.run import load
from attnlab.viz.alignment import plot_alignment
from attnlab.viz.heads import plot_head_tables
from attnlab.viz.report_html import write_report_html

SUFFIXES = (".png", ".svg", ".html", ".json")
ON = {"repeats": "random tokens repeated", "val": "the validation split"}  # --on, in a title


def run_inspect(opts: InspectOptions) -> int:
    if opts.out is not None and Path(opts.out).suffix.lower() not in SUFFIXES:
        raise AttnlabError(f"--out {opts.out}: write a picture (.png, .svg), a page (.html) or the numbers (.json)")
    run = load(opts.run, device=opts.device)
    result = inspect(run, opts.text, opts.what, opts.on)
    lines = SUMMARIES[result["kind"]](result)
    if opts.out:
        on = ON[opts.on or "repeats"] if opts.text is None else repr(opts.text)
        write(result, opts.out, f"{run.path.name}, {opts.what}: {on}")
        lines.append(f"wrote {opts.out}")
    print("\n".join(lines))
    return 0


def write(result: dict, out: str, title: str) -> None:
    """By the suffix: the numbers (.json), a page (.html) or a picture (.png, .svg)."""
    suffix = Path(out).suffix.lower()
    if suffix == ".json":
        Path(out).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    elif suffix == ".html":
        write_report_html(result, out, title)
    else:
        DRAW[result["kind"]](result, out, title)


# ---- the terminal's lines, by kind of result ----------------------------------------------------


def _lens_lines(result: dict) -> list[str]:
    mean = [sum(row) / len(row) for row in result["target_prob"]]  # how likely the next token was, by depth
    return [f"{name:>9}: p(actual next token) {p:.3f}" for name, p in zip(result["layers"], mean)]


def _table_lines(result: dict) -> list[str]:
    lines = [result["title"] + (f" (loss {result['loss']:.4f})" if "loss" in result else "")]
    for name, table in result["tables"].items():
        lines.append(f"{name} (layer x head, both from 1):")
        lines += ["  " + " ".join(f"{v:7.3f}" for v in row) for row in table]
    return lines


def _view_lines(result: dict) -> list[str]:
    """Each view's last row: what the last position draws on most."""
    lines = []
    for v in result["views"]:
        row = v["weights"][0][0][-1]
        top = sorted(range(len(row)), key=lambda j: -row[j])[:5]
        shares = ", ".join(f"{v['keys'][j]!r} {row[j]:.2f}" for j in top)
        lines.append(f"{v['name']}: the last position {v['queries'][-1]!r} draws on {shares}")
    return lines


def _over_training_lines(result: dict) -> list[str]:
    lines = [f"{'step':>8} {'repeat loss':>12} {'best induction':>15} {'best previous-token':>20}"]
    for i, step in enumerate(result["steps"]):
        ind, prev = np.max(result["scores"]["induction"][i]), np.max(result["scores"]["previous-token"][i])
        lines.append(f"{step:>8} {result['repeat_loss'][i]:>12.4f} {ind:>15.3f} {prev:>20.3f}")
    return lines


SUMMARIES = {"lens": _lens_lines, "tables": _table_lines, "views": _view_lines, "over-training": _over_training_lines}


# ---- the pictures, by kind of result ------------------------------------------------------------


def _draw_lens(result: dict, out: str, title: str) -> None:
    plot_lens(Lens(result["tokens"], result["layers"], result["top"], torch.tensor(result["prob"]), None), out)


def _draw_tables(result: dict, out: str, title: str) -> None:
    tables = {name: torch.tensor(t) for name, t in result["tables"].items()}
    plot_head_tables(tables, out, result["title"], result.get("diverging", False))


def _draw_views(result: dict, out: str, title: str) -> None:
    v = result["views"][-1]  # the cross-attention of a translation, the only view of the others
    plot_alignment(np.asarray(v["weights"]), v["keys"], v["queries"], Path(out), f"{title}: {v['name']}")


def _draw_over_training(result: dict, out: str, title: str) -> None:
    scores = {name: torch.tensor(s) for name, s in result["scores"].items()}
    plot_over_training({**result, "scores": scores}, out)


DRAW = {"lens": _draw_lens, "tables": _draw_tables, "views": _draw_views, "over-training": _draw_over_training}
