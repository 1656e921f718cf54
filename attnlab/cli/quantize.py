"""`attnlab quantize RUN --to int8|int4|bf16 --out DIR`, and the note that --quantize prints on the
commands that take it (sample, chat, eval, serve)."""

from __future__ import annotations

import json
import sys

from attnlab.cli.options import QuantizeOptions
from attnlab.runs.quantized import describe
from attnlab.runs.quantized_run import quantize_run
from attnlab.runs.run import Run


def note_quantized(run: Run) -> Run:
    """On stderr, what --quantize packed (before any text the command prints on stdout)."""
    if run.quantization is not None:
        print(f"[{run.path.name}: {describe(run.quantization)}]", file=sys.stderr)
    return run


def run_quantize(opts: QuantizeOptions) -> int:
    summary = quantize_run(opts.run, opts.to, opts.out, force=opts.force, every_layer=opts.every_layer)
    print(
        json.dumps(summary)
        if opts.json
        else f"{opts.out}: {opts.run} with {summary['summary']}. Every command loads it: attnlab sample {opts.out} ..."
    )
    return 0  # fmt: skip
