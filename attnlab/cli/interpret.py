"""`attnlab inspect RUN INPUT --what lens|heads|ablate|rollout|flow|over-training`: what a model's
layers and heads do (the numbers come from interpret/report.py; this file prints and writes them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.lens import Lens, plot_lens
from attnlab.interpret.over_training import over_training, plot_over_training
from attnlab.interpret.report import inspect, tables_json
from attnlab.runs.run import load
from attnlab.viz.alignment import plot_alignment
from attnlab.viz.heads import plot_head_tables
from attnlab.viz.report_html import write_report_html

WHAT = ("lens", "heads", "ablate", "rollout", "flow", "over-training")
SUFFIXES = (".png", ".svg", ".html", ".json")


def _check_out(out: str | None) -> None:

    if out is not None and Path(out).suffix.lower() not in SUFFIXES:
        raise AttnlabError(f"--out {out}: write a picture (.png, .svg), a page (.html) or the numbers (.json)")


def cmd_inspect(args: argparse.Namespace) -> int:

    _check_out(args.out)
    run = load(args.run, device=args.device)
    if args.what == "over-training":
        return _over_training(run, args.out)
    result = inspect(run, args.text, args.what, args.on)
    lines = _summary(result)
    if args.out:
        on = (
            {"repeats": "random tokens repeated", "val": "the validation split"}[args.on]
            if args.text is None
            else repr(args.text)
        )
        _write(result, args.out, f"{run.path.name}, {args.what}: {on}")
        lines.append(f"wrote {args.out}")
    print("\n".join(lines))
    return 0


def _summary(result: dict) -> list[str]:
    """What the terminal shows: the lens's confidence by depth, the tables, each rollout's last row."""
    if result["kind"] == "lens":
        mean = [sum(row) / len(row) for row in result["target_prob"]]  # how likely the next token was, by depth
        return [f"{name:>9}: p(actual next token) {p:.3f}" for name, p in zip(result["layers"], mean)]
    if result["kind"] == "tables":
        lines = [result["title"] + (f" (loss {result['loss']:.4f})" if "loss" in result else "")]
        for name, table in result["tables"].items():
            lines.append(f"{name} (layer x head, both from 1):")
            lines += ["  " + " ".join(f"{v:7.3f}" for v in row) for row in table]
        return lines
    lines = []
    for v in result["views"]:
        row = v["weights"][0][0][-1] if "weights" in v else None
        if row is None:
            continue
        top = sorted(range(len(row)), key=lambda j: -row[j])[:5]
        shares = ", ".join(f"{v['keys'][j]!r} {row[j]:.2f}" for j in top)
        lines.append(f"{v['name']}: the last position {v['queries'][-1]!r} draws on {shares}")
    return lines


def _write(result: dict, out: str, title: str) -> None:
    suffix = Path(out).suffix.lower()
    if suffix == ".json":
        Path(out).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    elif suffix == ".html":
        write_report_html(result, out, title)
    else:
        _draw(result, out, title)


def _draw(result: dict, out: str, title: str) -> None:

    if result["kind"] == "lens":
        lens = Lens(result["tokens"], result["layers"], result["top"], torch.tensor(result["prob"]), None)
        plot_lens(lens, out)
    elif result["kind"] == "tables":
        tables = {name: torch.tensor(t) for name, t in result["tables"].items()}
        plot_head_tables(tables, out, result["title"], result.get("diverging", False))
    else:
        v = result["views"][-1]  # the cross-attention of a translation, the only view of the others
        plot_alignment(np.asarray(v["weights"]), v["keys"], v["queries"], Path(out), f"{title}: {v['name']}")


def _over_training(run, out: str | None) -> int:

    result = over_training(run)
    data = {**result, "scores": {k: [tables_json({"": s})[""] for s in v] for k, v in result["scores"].items()}}
    if out and out.endswith(".json"):
        Path(out).write_text(json.dumps(data, indent=1))
    elif out and out.endswith(".html"):
        raise AttnlabError("--what over-training draws a .png or .svg, or writes .json")
    elif out:
        plot_over_training(result, out)
    lines = [f"{'step':>8} {'repeat loss':>12} {'best induction':>15} {'best previous-token':>20}"]
    for i, step in enumerate(result["steps"]):
        ind, prev = result["scores"]["induction"][i], result["scores"]["previous-token"][i]
        lines.append(
            f"{step:>8} {result['repeat_loss'][i]:>12.4f} {float(ind.max()):>15.3f} {float(prev.max()):>20.3f}"
        )
    print("\n".join(lines + ([f"wrote {out}"] if out else [])))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("inspect", help="logit lens, head detectors, head ablation, rollout/flow, heads over training",
                       description="lens: a GPT's next-token prediction read after each layer; heads: "
                       "previous-token, first-token, duplicate-token and induction scores of every head; ablate: "
                       "the loss change on the input when each head is zeroed (with no input: on the repeated half of "
                       "random tokens repeated twice); rollout / flow: how much each "
                       "position draws on each input token through all the layers (any run; flow is slow past "
                       "64 tokens); over-training: detector scores and the loss on repeated tokens at every "
                       "weight snapshot (train with --snapshot-every N).")  # fmt: skip
    p.add_argument("run", help="run directory (lens, heads, ablate, over-training: attnlab train lm; rollout, "
                   "flow: any run with attention)")  # fmt: skip
    p.add_argument("text", nargs="?", default=None, help="input text, or an image file for image runs (not needed "
                   "for over-training, optional for ablate)")  # fmt: skip
    p.add_argument("--what", required=True, choices=WHAT, help="what to compute")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="by suffix: a picture (.png, .svg), a page (.html) or the numbers (.json)")  # fmt: skip
    p.add_argument("--on", default="repeats", choices=("repeats", "val"), help="ablate with no text: random "
                   "tokens repeated twice, the loss of their repeated half (default), or the run's validation "
                   "split")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default: cpu)")
    p.set_defaults(func=cmd_inspect)
