"""Commands that move models between attnlab and the rest of the ecosystem: convert (from a local
HuggingFace directory) and export (to a HuggingFace directory, or to ONNX)."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.cli.options import ConvertOptions, ExportOptions
from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.interop.onnx import check_target, export_onnx
from attnlab.runs.folder import read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.run import load


def run_convert(opts: ConvertOptions) -> int:
    summary = convert_from_hf(opts.from_hf, opts.out, force=opts.force)
    try_next = "sample" if kind_of(read_run_config(Path(opts.out))).generates else "predict"  # images: RUN image.png
    print(json.dumps(summary) if opts.json else
          f"{opts.out}: {summary['family']} run from {summary['architecture']} "
          f"({summary['parameters']:,} parameters). Try: attnlab {try_next} {opts.out} ...")  # fmt: skip
    return 0


def _to_hf(opts: ExportOptions) -> dict:
    return export_hf(opts.run, opts.out, force=opts.force)


def _to_onnx(opts: ExportOptions) -> dict:
    check_target(Path(opts.out), opts.force)  # before loading the run
    return export_onnx(load(opts.run, device="cpu"), opts.out, force=opts.force)


EXPORTS = {"hf": _to_hf, "onnx": _to_onnx}  # --to


def run_export(opts: ExportOptions) -> int:
    print(json.dumps(EXPORTS[opts.to](opts), default=str))
    return 0
