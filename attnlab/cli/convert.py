"""Commands that move models between attnlab and the rest of the ecosystem: convert (from a local
HuggingFace directory), export (to a HuggingFace directory, a PEFT adapter folder, or ONNX) and merge
(a LoRA run's adapters folded into its base: a full run, which exports to HuggingFace)."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.cli.options import ConvertOptions, ExportOptions, MergeOptions
from attnlab.interop.adapter_runs import export_peft
from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.interop.onnx import check_target, export_onnx
from attnlab.runs.folder import read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.merge import merge_run
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


def _to_peft(opts: ExportOptions) -> dict:
    return export_peft(opts.run, opts.out, force=opts.force)


EXPORTS = {"hf": _to_hf, "peft": _to_peft, "onnx": _to_onnx}  # --to


def run_export(opts: ExportOptions) -> int:
    print(json.dumps(EXPORTS[opts.to](opts), default=str))
    return 0


def run_merge(opts: MergeOptions) -> int:
    summary = merge_run(opts.run, opts.out, force=opts.force)
    quantized = summary["quantized_base"]
    note = (f" It trained over its base quantized to {quantized}: the adapters are folded into the float base."
            if quantized else "")  # fmt: skip
    print(json.dumps(summary) if opts.json else
          f"{opts.out}: {opts.run}'s adapters folded into its base ({summary['merged']} matrices; "
          f"{summary['parameters']:,} parameters), a full run.{note} Export it with: attnlab export "
          f"{opts.out} --to hf DIR")  # fmt: skip
    return 0
