"""Generation speed: greedy decoding, batch 1, attnlab against HuggingFace's GPT-2 generate().

Generates --new-tokens tokens (default 512) from a short random prompt, three ways:
- attnlab `stream(..., temperature=0, use_cache=True)`: prompt once, then one position per step;
- attnlab `stream(..., use_cache=False)`: every step re-runs the whole sequence;
- HF `GPT2LMHeadModel.generate(max_new_tokens=N, min_new_tokens=N, do_sample=False,
  use_cache=True)`, SDPA attention, holding the same (random) weights as attnlab's model.
tokens/s = N / wall time of the whole call (prompt included), median of --repeats calls, after
one untimed short warmup call per method. The script checks that attnlab's cached and uncached
outputs are identical (exit status 1 if not) and reports whether HF's greedy tokens match attnlab's (expected in
float32; bf16 rounding may flip near-ties).

Default shape: 6 layers, 384 wide, 6 heads, context 1024 (so prompt + 512 new tokens fit: HF's
GPT-2 cannot go past its context), vocab 256. --dtype bfloat16 runs both under torch.autocast
(weights stay float32); attnlab's stream() gets the same precision through its dtype argument.

Run from the repository root:

    .venv/bin/python benchmarks/generate_speed.py                    # 512 tokens, float32
    .venv/bin/python benchmarks/generate_speed.py --dtype bfloat16 --device cuda
    .venv/bin/python benchmarks/generate_speed.py --new-tokens 16    # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from common import (
    add_common_args,
    build_pair,
    describe,
    dtype_name,
    format_table,
    num_params,
    parse_dtype,
    setup,
    synchronize,
)
from transformers import GPT2LMHeadModel

from attnlab.decoding.sampling import stream, stream_rows
from attnlab.engine.device import autocast
from attnlab.models.gpt import GPT, GPTConfig

Generator = Callable[[list[int], int], list[int]]  # (prompt ids, new tokens) -> new token ids

COLUMNS = [
    ("impl", "impl", ""),
    ("cache", "cache", ""),
    ("rows", "rows", ","),
    ("dtype", "dtype", ""),
    ("new_tokens", "new tokens", ","),
    ("seconds", "seconds", ",.2f"),
    ("tokens_per_s", "tokens/s", ",.1f"),
    ("ms_per_token", "ms/token", ",.2f"),
    ("ratio", "vs hf-gpt2", ".2f"),
]


def attnlab_generator(model: GPT, dtype: torch.dtype, use_cache: bool) -> Generator:
    def run(prompt: list[int], n: int) -> list[int]:
        name = str(dtype).removeprefix("torch.")
        return list(stream(model, prompt, n, temperature=0.0, use_cache=use_cache, dtype=name))

    return run


def batch_generator(model: GPT, dtype: torch.dtype, rows: int) -> Generator:
    """`rows` sequences as one batch (--num-samples): the first row's tokens are returned."""

    def run(prompt: list[int], n: int) -> list[int]:
        name = str(dtype).removeprefix("torch.")
        return [int(t[0]) for t in stream_rows(model, prompt, rows, n, temperature=0.0, dtype=name)]

    return run


def hf_generator(model: GPT2LMHeadModel, dtype: torch.dtype, device: torch.device) -> Generator:
    def run(prompt: list[int], n: int) -> list[int]:
        ids = torch.tensor([prompt], device=device)
        with autocast(device, dtype):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    model.eval()
    return run


def timed(
    generate: Generator, prompt: list[int], n: int, args: argparse.Namespace, device: torch.device
) -> tuple[float, list[int]]:
    """(median seconds over --repeats calls making n new tokens, the tokens), after an untimed
    warmup call of --warmup-tokens tokens."""
    generate(prompt, args.warmup_tokens)
    times = []
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        tokens = generate(prompt, n)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where the two token lists differ; None if identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--layers", type=int, default=6, help="Transformer blocks")
    p.add_argument("--d-model", type=int, default=384, help="model width")
    p.add_argument("--heads", type=int, default=6, help="attention heads")
    p.add_argument("--context", type=int, default=1024, help="positions; prompt + new tokens must fit")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size")
    p.add_argument("--new-tokens", type=int, default=512, help="tokens to generate (greedy)")
    p.add_argument("--prompt-tokens", type=int, default=8, help="length of the random prompt")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of the untimed warmup call per method")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per method; the median is reported")
    p.add_argument("--dtype", default="float32", type=parse_dtype, help="float32 or bfloat16 (autocast)")
    p.add_argument("--batches", default="4,16", help="also time attnlab with these many rows at once (--num-samples)")
    add_common_args(p)
    args = p.parse_args(argv)
    if min(args.new_tokens, args.prompt_tokens, args.warmup_tokens, args.repeats) < 1:
        p.error("--new-tokens, --prompt-tokens, --warmup-tokens and --repeats must be at least 1")
    if args.prompt_tokens + max(args.new_tokens, args.warmup_tokens) > args.context:
        p.error(f"prompt + new tokens exceed --context {args.context} (HF's GPT-2 cannot go past it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = setup(args)
    cfg = GPTConfig(
        n_layer=args.layers, n_head=args.heads, d_model=args.d_model, context=args.context, vocab_size=args.vocab
    )
    gpt, hf = build_pair(cfg, device, args.seed, args.hf_activation)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, args.vocab, (args.prompt_tokens,), generator=gen).tolist()
    methods = {
        ("attnlab", "kv-cache"): attnlab_generator(gpt, args.dtype, use_cache=True),
        ("attnlab", "none"): attnlab_generator(gpt, args.dtype, use_cache=False),
        ("hf-gpt2", "kv-cache"): hf_generator(hf, args.dtype, device),
    }
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    for b in batches:
        methods["attnlab", f"kv-cache x{b}"] = batch_generator(gpt, args.dtype, b)
    rows, outputs = [], {}
    for (impl, cache), generate in methods.items():
        seconds, outputs[impl, cache] = timed(generate, prompt, args.new_tokens, args, device)
        n, width = args.new_tokens, int(cache.split("x")[-1]) if " x" in cache else 1
        rows.append(
            {
                "impl": impl,
                "cache": cache,
                "rows": width,
                "dtype": dtype_name(args.dtype),
                "new_tokens": n * width,
                "seconds": seconds,
                "tokens_per_s": n * width / seconds,
                "ms_per_token": seconds / (n * width) * 1e3,
            }
        )
    hf_row = next(r for r in rows if r["impl"] == "hf-gpt2")
    for row in rows:
        row["ratio"] = row["tokens_per_s"] / hf_row["tokens_per_s"]
    for b in batches:  # greedy: every row of a batch is the one-sequence text
        if outputs["attnlab", f"kv-cache x{b}"] != outputs["attnlab", "kv-cache"]:
            print(f"batch of {b}: its first row differs from the one-sequence greedy text")
    cache_diff = first_difference(outputs["attnlab", "kv-cache"], outputs["attnlab", "none"])
    hf_diff = first_difference(outputs["attnlab", "kv-cache"], outputs["hf-gpt2", "kv-cache"])
    report(args, device, num_params(gpt), rows, cache_diff, hf_diff)
    return 0 if cache_diff is None else 1


def report(
    args: argparse.Namespace,
    device: torch.device,
    params: int,
    rows: list[dict],
    cache_diff: int | None,
    hf_diff: int | None,
) -> None:
    shape = {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "context": args.context,
        "vocab": args.vocab,
        "params": params,
        "prompt_tokens": args.prompt_tokens,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "device": describe(device),
                    "shape": shape,
                    "rows": rows,
                    "attnlab_cached_equals_uncached": cache_diff is None,
                    "cache_first_difference": cache_diff,
                    "hf_equals_attnlab": hf_diff is None,
                    "hf_first_difference": hf_diff,
                },
                indent=1,
            )
        )
        return
    print(f"device {describe(device)}; " + ", ".join(f"{k} {v:,}" for k, v in shape.items()))
    print(format_table(rows, COLUMNS))
    print(f"attnlab cached == uncached greedy output: {_verdict(cache_diff)}")
    print(f"hf-gpt2 == attnlab greedy output:         {_verdict(hf_diff)}")


def _verdict(diff: int | None) -> str:
    return "identical" if diff is None else f"DIFFERENT (first at new token {diff})"


if __name__ == "__main__":
    raise SystemExit(main())
