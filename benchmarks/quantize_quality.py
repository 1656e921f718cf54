"""What quantized weights cost in held-out loss (issue 34): each run's validation loss in float32 and
with its language model's block matrices and LM head packed int8, int4 and bf16 (runs/quantized.py,
quant/packed.py), every layer the kernel takes (load(..., every_layer=True)), on the same tokens.

    .venv/bin/python benchmarks/quantize_quality.py runs/demo
    .venv/bin/python benchmarks/quantize_quality.py runs/demo runs/gpt2 --max-tokens 50000 --json
    .venv/bin/python benchmarks/quantize_quality.py runs/converted --data stdlib  # a run without a data section

The loss is the one `attnlab eval RUN --quantize KIND` prints: the run's task evaluates it (tasks/
lm_eval.py) on the run's own validation split, the first --max-tokens tokens of it (default 200,000:
the comparison is paired, every precision predicting the same tokens, so its differences are much
steadier than the loss itself), in windows of the run's block size. Weight-only: the packed layers'
kernels take their activations in bfloat16 (quant/packed.py), so a packed row's change includes that
rounding as well as the weights'. The float32 row runs in whatever precision evaluation picks on
this machine (--dtype auto: bf16 where it measured faster); the header says which.

Columns: packed, the layers packed of those a decode step reads in full (inference_linears: the blocks'
matrices and the head; a layer whose input width is not a multiple of 32 stays float32 for int8 and
int4); MB, those layers as stored (float32 for the float32 row), and of it the packed layers alone;
loss in nats per token; bits per character; the change of the loss from float32's, in percent; eval s,
the evaluation's seconds (reading the corpus included; packed layers are decode kernels, slower than
float32 on a window of 256 rows here).

Measured on the 2-core Intel(R) Xeon(R) Processor (shared, nice 19), torch 2.13, float32 evaluation:
    demo (gpt-nano-fast, 4 x 128, characters, 200,000 of stdlib's val):   float32 1.2741 nats/char;
        int8 +0.004%, int4 +0.320%, bf16 +0.001% (the whole split, 600,014: +0.004, +0.335, +0.000)
    a GPT-2 block 6 x 384, BPE 4096, 5 minutes of training (58 steps), exported to GGUF and converted
        back (its whole val split, 172,031 tokens): float32 5.0506, equal to the run's before export;
        int8 +0.000%, int4 +0.001%, bf16 +0.001%: too little trained to tell the precisions apart
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from common import columns, cpu_name, format_table

from attnlab.quant import packed
from attnlab.quant.packed import KINDS, PackedLinear
from attnlab.runs.quantized import FLOAT, inference_linears
from attnlab.runs.run import Run, load
from attnlab.runtime.device import pick_dtype

PRECISIONS = (FLOAT, *KINDS)  # float32, int8, int4, bf16
TARGET = {"int8": 1.0}  # issue 34: int8 within 1% of float32's held-out loss; the others are reported
COLUMNS = columns(
    "run; precision; packed_text:packed; mb:MB:.2f; packed_mb:packed MB:.2f; "
    "loss:loss (nats/tok):.4f; bits_per_char:bits/char:.4f; change_pct:vs float32 %:+.3f; "
    "seconds:eval s:.0f;"
)


def linear_bytes(run: Run) -> tuple[int, int, int, int]:
    """(layers packed, layers looked at, bytes of all of them as stored, bytes of the packed ones)."""
    layers = [layer for *_, layer in inference_linears(run.model)]
    size = [sum(b.numel() * b.element_size() for b in (*layer.parameters(), *layer.buffers())) for layer in layers]
    packed = [isinstance(layer, PackedLinear) for layer in layers]
    return sum(packed), len(layers), sum(size), sum(s for s, p in zip(size, packed, strict=True) if p)


def measure(path: str, precision: str, args: argparse.Namespace) -> dict:
    """One row: the run loaded at `precision` and evaluated on its validation split."""
    quantize = None if precision == FLOAT else precision
    run = load(path, device=args.device, quantize=quantize, every_layer=True)
    n_packed, n_layers, size, packed_size = linear_bytes(run)
    options = {"max_tokens": args.max_tokens, "progress": False, "glob": args.glob}
    start = time.perf_counter()
    result = run.task.evaluate(run, args.data, "val", options)
    seconds = time.perf_counter() - start
    if "loss" not in result:
        raise SystemExit(f"{path}: its task's evaluation has no loss ({', '.join(result)}): a language model run?")
    # The precision the evaluation's matrix products ran in (lm_eval.py asks the same, answered once a process).
    dtype = pick_dtype("auto", run.device, run.model.cfg.d_model)
    return {
        "run": path,
        "precision": precision,
        "packed": n_packed,
        "layers": n_layers,
        "packed_text": f"{n_packed} of {n_layers}",
        "mb": size / 1e6,
        "packed_mb": packed_size / 1e6,
        "loss": result["loss"],
        "bits_per_char": result["bits_per_char"],
        "tokens": result["tokens"],
        "characters": result["characters"],
        "data": result["data"],
        "evaluation_dtype": str(dtype).removeprefix("torch."),
        "device": str(run.device),
        "seconds": seconds,
    }


def measure_run(path: str, args: argparse.Namespace) -> list[dict]:
    rows = []
    for precision in args.precisions:
        rows.append(measure(path, precision, args))
        gc.collect()  # one model in memory at a time
        if not args.json:
            print(f"  {path} {precision}: {rows[-1]['loss']:.4f} nats/token ({rows[-1]['seconds']:.0f} s)", flush=True)
    first = rows[0]
    for row in rows:  # the comparison is only fair on the same tokens
        if (row["tokens"], row["characters"]) != (first["tokens"], first["characters"]):
            raise SystemExit(
                f"{path}: {row['precision']} evaluated {row['tokens']} tokens, {first['precision']} "
                f"{first['tokens']}: not the same text"
            )
    base = next((r["loss"] for r in rows if r["precision"] == FLOAT), None)
    for row in rows:
        row["change_pct"] = None if base is None else (row["loss"] - base) / base * 100
        limit = TARGET.get(row["precision"])
        row["within_target"] = None if limit is None or base is None else abs(row["change_pct"]) <= limit
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="language-model run folders (float ones: each is quantized here)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=200_000,
        help="evaluate the first this many tokens of the validation split (default 200,000; 0: all of it)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=list(PRECISIONS),
        choices=PRECISIONS,
        help="the first one named float32 is the reference (default: all four)",
    )
    parser.add_argument("--data", default=None, help="the text to evaluate on (default: each run's own data)")
    parser.add_argument("--glob", default=None, help="which files of --data to read (default: the run's own)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... as attnlab.load takes it")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument(
        "--decode-kernels",
        action="store_true",
        help="every product through the kernels a decode step takes (attnlab's row operators at "
        "any row count: int4's rounds its activations to int8), not PyTorch's for windows",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.decode_kernels:  # a window's rows as a decode step's: no row count is too many
        packed.ROW_LIMIT = sys.maxsize
    header = f"CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if not args.json:
        print(header, flush=True)
    rows = [row for path in args.runs for row in measure_run(path, args)]
    if args.json:
        print(json.dumps({"machine": header, "max_tokens": args.max_tokens, "rows": rows}, indent=1))
        return
    print()
    for path in args.runs:
        mine = [r for r in rows if r["run"] == path]
        first = mine[0]
        print(
            f"{Path(path).name}: {first['data']} (val), {first['tokens']:,} tokens, {first['characters']:,} "
            f"characters; evaluated in {first['evaluation_dtype']} on {first['device']}"
        )
    print(format_table(rows, COLUMNS))
    for row in rows:
        if row["within_target"] is not None:
            verdict = "within" if row["within_target"] else "BEYOND"
            print(
                f"{row['run']}: {row['precision']} is {row['change_pct']:+.3f}% from float32, {verdict} the "
                f"issue's {TARGET[row['precision']]:g}%"
            )


if __name__ == "__main__":
    main()
