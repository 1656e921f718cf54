"""Commands that move models between attnlab and the rest of the ecosystem: convert (from a local
HuggingFace directory or a GGUF file), export (to a HuggingFace directory, a PEFT adapter folder, ONNX
or GGUF) and merge (a LoRA run's adapters folded into its base: a full run, which exports)."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.cli.options import ConvertOptions, ExportOptions, MergeOptions
from attnlab.interop.adapter_runs import export_peft
from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import export_gguf
from attnlab.interop.onnx import check_target, export_onnx
from attnlab.runs.folder import read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.merge import merge_run
from attnlab.runs.run import load


def run_convert(opts: ConvertOptions) -> int:
    source = Path(opts.source or opts.from_hf)
    if source.is_file():  # a model file: GGUF (the reader says in one line if it is not one)
        summary = convert_from_gguf(source, opts.out, force=opts.force)
        what = f"GGUF tensors {', '.join(f'{n} {kind}' for kind, n in summary['types'].items())}; "
    else:
        summary, what = convert_from_hf(source, opts.out, force=opts.force), ""
    try_next = "sample" if kind_of(read_run_config(Path(opts.out))).generates else "predict"  # images: RUN image.png
    print(
        json.dumps(summary)
        if opts.json
        else f"{opts.out}: {summary['family']} run from {summary['architecture']} "
        f"({what}{summary['parameters']:,} parameters). Try: attnlab {try_next} {opts.out} ..."
    )
    return 0


def _to_hf(opts: ExportOptions) -> dict:
    return export_hf(opts.run, opts.out, force=opts.force)


def _to_onnx(opts: ExportOptions) -> dict:
    check_target(Path(opts.out), opts.force)  # before loading the run
    return export_onnx(load(opts.run, device="cpu"), opts.out, force=opts.force)


def _to_peft(opts: ExportOptions) -> dict:
    return export_peft(opts.run, opts.out, force=opts.force)


def _to_gguf(opts: ExportOptions) -> dict:
    return export_gguf(opts.run, opts.out, opts.type or "f32", force=opts.force)


EXPORTS = {"hf": _to_hf, "peft": _to_peft, "onnx": _to_onnx, "gguf": _to_gguf}  # --to


def run_export(opts: ExportOptions) -> int:
    print(json.dumps(EXPORTS[opts.to](opts), default=str))
    return 0


def run_merge(opts: MergeOptions) -> int:
    summary = merge_run(opts.run, opts.out, force=opts.force)
    quantized = summary["quantized_base"]
    note = (
        f" It trained over its base quantized to {quantized}: the adapters are folded into the float base."
        if quantized
        else ""
    )
    print(
        json.dumps(summary)
        if opts.json
        else f"{opts.out}: {opts.run}'s adapters folded into its base ({summary['merged']} matrices; "
        f"{summary['parameters']:,} parameters), a full run.{note} Export it with: attnlab export "
        f"{opts.out} --to hf DIR"
    )
    return 0
