"""Tokens/s of the decoding engine with and without a JSON-schema constraint, at batch 1 and 16: what
the mask (decoding/structured, applied in the engine's draws) costs a served request, without HTTP.

b rows (distinct prompts, seeded, temperature 1) are submitted at once to one Engine running its own
thread; each draws --tokens tokens, free or under SCHEMA, whose values are long enough (an array of at
least 64 objects) that no row closes before its last token, so both sides draw the same number.
tokens/s = b x tokens / the wall time from the first submit to the last row's end; the two sides
alternate, --repeats rounds, the median reported. A character vocabulary (printable ASCII) on
untrained weights (speed only).

    .venv/bin/python benchmarks/structured_speed.py --shape 6x384 --batches 1,16
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch

from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.engine import Engine
from attnlab.decoding.rows import Ask
from attnlab.decoding.settings import Draw
from attnlab.decoding.structured import compile
from attnlab.models.gpt import GPT, GPTConfig

SHAPES = {
    "nano": dict(n_layer=4, n_head=4, d_model=128, context=64),
    "6x384": dict(n_layer=6, n_head=6, d_model=384, context=256),
}
ITEM = {  # each array item: a bounded string, a bounded integer and a short array of enums, all required
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
}
PERSON = {"type": "object", "properties": ITEM, "required": list(ITEM)}
SCHEMA = {"type": "array", "items": PERSON, "minItems": 64}


def rounds(engine: Engine, grammar, rows: int, tokens: int, seed: int) -> float:
    """tokens/s of `rows` rows submitted at once (grammar None: free)."""
    left, done = [rows], threading.Event()

    def emit(step):  # the engine's thread
        if step is None or isinstance(step, Exception):
            if isinstance(step, Exception):
                print("failed:", step)
            left[0] -= 1
            if left[0] == 0:
                done.set()

    t0 = time.perf_counter()
    for r in range(rows):
        ids = [3 + (seed + r) % 90, 10, 20, 30]  # distinct prompts: prefilled together, not twins
        matcher = None if grammar is None else grammar.matcher()
        engine.submit(ids, Draw(1.0, seed=seed + r), tokens, emit, Ask(matcher=matcher))
    done.wait()
    return rows * tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="6x384", choices=list(SHAPES))
    p.add_argument("--batches", default="1,16", help="rows submitted together, comma-separated")
    p.add_argument("--tokens", type=int, default=128, help="tokens per row")
    p.add_argument("--repeats", type=int, default=5, help="rounds of each side, alternated")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--no-compile", action="store_true", help="the eager step (default: the compiled one, as serve)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = CharTokenizer("".join(chr(c) for c in range(32, 127)))
    model = GPT(GPTConfig(**SHAPES[args.shape], vocab_size=tok.vocab_size)).eval()
    engine = Engine(model, max_batch=max(int(b) for b in args.batches.split(",")), compiled=not args.no_compile)
    t0 = time.perf_counter()
    grammar = compile(SCHEMA, tok)
    step = "eager" if args.no_compile else "compiled"
    print(
        f"{args.shape}, {step}, {args.tokens} tokens a row, torch threads {args.threads}, load {os.getloadavg()[0]:.2f}"
    )
    print(f"schema compiled in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    rounds(engine, None, 2, 8, 0)  # warm: the thread, calibration
    print("| batch | free (tokens/s) | schema (tokens/s) | schema / free |")
    print("|---:|---:|---:|---:|")
    for b in (int(b) for b in args.batches.split(",")):
        free, constrained = [], []
        for r in range(args.repeats):
            free.append(rounds(engine, None, b, args.tokens, 100 * r))
            constrained.append(rounds(engine, grammar, b, args.tokens, 100 * r))
        f, c = statistics.median(free), statistics.median(constrained)
        print(f"| {b} | {f:.0f} | {c:.0f} | {c / f:.3f} |", flush=True)
    engine.close(wait=5)
    print(f"load after: {os.getloadavg()[0]:.2f}; engine stats: {dict(engine.stats)}")


if __name__ == "__main__":
    main()
