"""What a structured output costs: the per-token mask (median µs), a schema's compile time, a row's
matcher and the tokenizer's one-off index, for a character vocabulary and a byte-level BPE.

The mask is timed as the engine pays it: `apply_masks` on (B, V) logits (llguidance's mask, its
unpacking into a bool row and the masked fill) and, apart, llguidance's fill of the bitmask alone.
Tokens are drawn from random logits under the mask, so every step is a real state of the grammar;
a matcher whose value closes starts again. Give `--tokenizer` a tokenizer.json or a run folder (a
converted GPT-2 run has GPT-2's 50257-token vocabulary); without it a byte-level BPE is trained
on generated JSON-ish text to `--vocab-size`.

    .venv/bin/python benchmarks/structured_outputs.py --tokenizer runs/gpt2-small
    .venv/bin/python benchmarks/structured_outputs.py --vocab-size 8000 --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from common import columns, cpu_named, format_table

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.decoding.structured import apply_masks
from attnlab.decoding.structured.grammar import Grammar, source
from attnlab.decoding.structured.vocab import vocabulary

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
TOOL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}$"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
    "required": ["name", "arguments"],
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "number"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
        }
    },
    "$ref": "#/$defs/node",
}
SPECS = {"json_object": "json_object", "person": PERSON, "tool call": TOOL, "tree ($ref)": TREE}
COLUMNS = columns(
    "vocab:vocabulary; spec:constraint; compile_ms:compile (ms):.1f; "
    "matcher_us:matcher (µs):.1f; fill_us:fill (µs):.0f; mask1_us:mask B=1 (µs):.0f; "
    "mask16_us:mask B=16 (µs/row):.0f; p90_us:B=1 p90 (µs):.0f;"
)


def json_lines(n: int, seed: int = 0) -> list[str]:
    """Generated JSON-ish text to train a BPE on when no tokenizer is given."""
    rng = random.Random(seed)
    words = [f"w{rng.randint(0, 99999)}" for _ in range(4000)] + ["name", "age", "true", "false", "null", "café"]
    return [json.dumps({rng.choice(words): [rng.randint(-999, 99999), rng.choice(words)]}) for _ in range(n)]


def tokenizers(args) -> dict:
    if args.tokenizer:
        bpe = load_tokenizer(args.tokenizer)
    else:
        bpe = BPETokenizer.train(json_lines(args.vocab_size * 4), args.vocab_size)
    chars = CharTokenizer("".join(chr(c) for c in range(32, 127)) + "é")
    return {f"char ({chars.vocab_size})": chars, f"bpe ({bpe.vocab_size})": bpe}


def median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(times)


def walk(grammar: Grammar, tok, rows: int, steps: int, seed: int) -> tuple[list[float], list[float]]:
    """(µs of apply_masks per step, µs of the bitmask fill alone) over `steps` steps of `rows` rows."""
    gen = torch.Generator().manual_seed(seed)
    matchers = [grammar.matcher() for _ in range(rows)]
    words = torch.empty(matchers[0].words, dtype=torch.int32)
    masks, fills = [], []
    for _ in range(steps):
        logits = torch.randn(rows, tok.vocab_size, generator=gen) * 3
        t0 = time.perf_counter_ns()
        matchers[0].fill_bitmask(words)
        fills.append((time.perf_counter_ns() - t0) / 1e3)
        t0 = time.perf_counter_ns()
        apply_masks(logits, matchers)
        masks.append((time.perf_counter_ns() - t0) / 1e3)
        tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0].tolist()
        for r, t in enumerate(tokens):
            if t == tok.eot_id or matchers[r].done:
                matchers[r] = grammar.matcher()  # the value closed: a new request takes the row
            else:
                matchers[r].advance(t)
    return masks, fills


def measure(name: str, tok, spec, args) -> dict:
    vocab = vocabulary(tok)
    kind, text = source(spec)
    t0 = time.perf_counter()
    grammar = Grammar(vocab, text, kind)
    compile_ms = (time.perf_counter() - t0) * 1e3
    one, fills = walk(grammar, tok, 1, args.steps, args.seed)
    sixteen, _ = walk(grammar, tok, 16, max(args.steps // 4, 20), args.seed)
    row = {"vocab": name, "spec": next(k for k, v in SPECS.items() if v is spec), "compile_ms": compile_ms}
    row["matcher_us"] = median_us(grammar.matcher, 200)
    row["fill_us"], row["mask1_us"] = statistics.median(fills), statistics.median(one)
    row["mask16_us"] = statistics.median(sixteen) / 16
    row["p90_us"] = statistics.quantiles(one, n=10)[-1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a tokenizer.json or a run folder (default: train a BPE)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="the trained BPE's size, without --tokenizer")
    parser.add_argument("--steps", type=int, default=400, help="steps timed per constraint at batch 1")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, tok in tokenizers(args).items():
        t0 = time.perf_counter()
        vocabulary(tok)
        print(f"{name}: llguidance's index of the vocabulary built in {time.perf_counter() - t0:.2f} s", flush=True)
        rows += [measure(name, tok, spec, args) for spec in SPECS.values()]
    print(format_table(rows, COLUMNS))
    print(f"CPU: {cpu_named()}; load average {os.getloadavg()[0]:.2f}; torch threads 1")


if __name__ == "__main__":
    main()
