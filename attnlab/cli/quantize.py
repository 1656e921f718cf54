"""`attnlab quantize RUN --to int8|int4|bf16 --out DIR`, and the note that --quantize prints on the
commands that take it (sample, chat, eval, serve)."""

from __future__ import annotations

import json
import sys

from attnlab.cli.options import QuantizeOptions
from attnlab.runs.folder import WEIGHTS
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
    if opts.json:
        print(json.dumps(summary))
        return 0
    files = f"{WEIGHTS} {summary['bytes_before'] / 1e6:.2f} MB -> {summary['bytes_after'] / 1e6:.2f} MB on disk"
    print(
        f"{opts.out}: {opts.run} with {summary['summary']}; {files}. Every command loads it: "
        f"attnlab sample {opts.out} ..."
    )
    return 0
