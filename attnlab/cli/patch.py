"""`attnlab patch RUN --clean TEXT --corrupted TEXT`: activation or attribution patching of a run
(interpret/patching_run.py), printed, drawn (--out .png/.svg) or written as numbers (--out .json, --json)."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.cli.options import PatchOptions
from attnlab.errors import AttnlabError
from attnlab.interpret.patching import GRANULARITIES
from attnlab.interpret.patching_plot import draw_patching
from attnlab.interpret.patching_run import edge_lines, patch, patch_edges, patch_path, path_lines, summary
from attnlab.io import write_json
from attnlab.runs.run import load

SUFFIXES = (".png", ".svg", ".json")
EDGES = ("eap", "eap-ig")  # the methods that score edges (interpret/attribution.edge_attribution)


def run_patch(opts: PatchOptions) -> int:
    if opts.out is not None and Path(opts.out).suffix.lower() not in SUFFIXES:
        raise AttnlabError(f"--out {opts.out}: write a picture (.png, .svg) or the numbers (.json)")
    if (opts.sender is None) != (opts.receivers is None):
        raise AttnlabError("path patching needs both --sender HEADS and --receivers HEADS")
    run = load(opts.run, device=opts.device)
    if opts.sender is not None:
        return run_path(run, opts)
    if opts.method in EDGES:
        return run_edges(run, opts)
    chosen = tuple(dict.fromkeys(opts.granularity)) or tuple(GRANULARITIES)
    result = patch(run, opts.clean, opts.corrupted, opts.metric, opts.target, opts.wrong, opts.method, chosen)
    data = {"run": run.path.name, "clean": opts.clean, "corrupted": opts.corrupted, **result.as_json()}
    lines = summary(result)
    if opts.out:
        if Path(opts.out).suffix.lower() == ".json":
            write_json(opts.out, data)
        else:
            draw_patching(result, opts.out, f"{run.path.name}: {opts.clean!r} vs {opts.corrupted!r}")
        lines.append(f"wrote {opts.out}")
    print(json.dumps(data, ensure_ascii=False) if opts.json else "\n".join(lines))
    return 0


def run_path(run, opts: PatchOptions) -> int:
    """--sender and --receivers: one path patching, printed (or --json, --out FILE.json)."""
    result = patch_path(
        run, opts.clean, opts.corrupted, opts.sender, opts.receivers, opts.metric, opts.target, opts.wrong
    )
    return _numbers(run, opts, result, path_lines(result), "path patching measures one number")


def run_edges(run, opts: PatchOptions) -> int:
    """--method eap or eap-ig: every edge of the residual graph, printed (or --json, --out FILE.json)."""
    steps = opts.steps if opts.method == "eap-ig" else 0
    result = patch_edges(run, opts.clean, opts.corrupted, opts.metric, opts.target, opts.wrong, steps)
    return _numbers(run, opts, result, edge_lines(result), "edge attribution gives a list of edges")


def _numbers(run, opts: PatchOptions, result: dict, lines: list[str], what: str) -> int:
    if opts.out is not None and Path(opts.out).suffix.lower() != ".json":
        raise AttnlabError(f"--out {opts.out}: {what}; write it as .json")
    data = {"run": run.path.name, "clean": opts.clean, "corrupted": opts.corrupted, **result}
    if opts.out:
        write_json(opts.out, data)
        lines.append(f"wrote {opts.out}")
    print(json.dumps(data, ensure_ascii=False) if opts.json else "\n".join(lines))
    return 0
