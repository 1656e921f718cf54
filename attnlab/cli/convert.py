"""Commands that move models between attnlab and the rest of the ecosystem: convert (from a local
HuggingFace directory) and export (to a HuggingFace directory, or to ONNX)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.interop.onnx import check_target, export_onnx
from attnlab.runs.run import load


def cmd_convert(args: argparse.Namespace) -> int:

    summary = convert_from_hf(args.from_hf, args.out, force=args.force)
    try_next = "sample" if summary["family"] == "gpt" else "predict"  # images: predict RUN image.png
    print(json.dumps(summary) if args.json else
          f"{args.out}: {summary['family']} run from {summary['architecture']} "
          f"({summary['parameters']:,} parameters). Try: attnlab {try_next} {args.out} ...")  # fmt: skip
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.to == "hf":
        summary = export_hf(args.run, args.out, force=args.force)
    else:
        check_target(Path(args.out), args.force)  # before loading the run
        summary = export_onnx(load(args.run, device="cpu"), args.out, force=args.force)
    print(json.dumps(summary, default=str))
    return 0


def add_commands(sub) -> None:
    """Add `convert` and `export` to the parser's subcommands."""
    desc = ("Read a local HuggingFace model directory (config.json, model.safetensors or pytorch_model.bin, "
            "tokenizer.json) and write an attnlab run that every command works on. Nothing is downloaded.")  # fmt: skip
    cv = sub.add_parser("convert", help="a local HuggingFace checkpoint (GPT-2, BERT, ViT) -> an attnlab run",
                        description=desc)  # fmt: skip
    cv.add_argument("--from-hf", required=True, metavar="DIR", help="HuggingFace-format model directory")
    cv.add_argument("--out", required=True, metavar="RUN", help="run directory to create")
    cv.add_argument("--force", action="store_true", help="replace --out if it is an attnlab run")
    cv.add_argument("--json", action="store_true", help="print one JSON object")
    cv.set_defaults(func=cmd_convert)

    desc = ("Write a run in another format: --to hf, a directory that transformers' from_pretrained loads "
            "(GPT runs as GPT-2, encoder runs as BERT); --to onnx, a file with dynamic batch and length, "
            "checked with onnxruntime (GPT runs).")  # fmt: skip
    ex = sub.add_parser("export", help="a run -> a HuggingFace directory or an ONNX file", description=desc)
    ex.add_argument("run", help="run directory")
    ex.add_argument("--to", required=True, choices=("hf", "onnx"), help="target format")
    ex.add_argument("out", metavar="OUT", help="directory (hf) or .onnx file (onnx) to write")
    ex.add_argument(
        "--force",
        action="store_true",
        help="replace OUT if it is a HuggingFace model folder (hf) or an .onnx file (onnx)",
    )
    ex.set_defaults(func=cmd_export)
