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

The weight-streaming bound (row "matvec chain"): a decode step of batch 1 must read every weight
matrix once, so it can be no faster than the bare chain of matrix-vector products x @ W^T over the
model's own matrices, with nothing else: the 4 per block (the stacked Q/K/V projection, W_O and the
feed-forward's two) and the LM head (tied to the token embedding here), each given a fixed random x of
its input width. Embedding and position lookups (one row each), norms, biases and attention over the
cache are left out. Bound tokens/s = 1 / seconds per pass, the median of samples of --bound-passes
passes; one sample is taken after each timed call of every method, so the bound is measured
interleaved with what it bounds, under the same load. "of bound" = a batch-1 attnlab row's tokens/s
over the bound's. With more rows the weights are read once for the whole batch, so batched rows can
pass it: they get no "of bound".

Default shape: 6 layers, 384 wide, 6 heads, context 1024 (so prompt + 512 new tokens fit: HF's
GPT-2 cannot go past its context), vocab 256. --dtype bfloat16 runs both under torch.autocast
(weights stay float32); attnlab's stream() gets the same precision through its dtype argument.

Run from the repository root:

    .venv/bin/python benchmarks/generate_speed.py                    # 512 tokens, float32
    .venv/bin/python benchmarks/generate_speed.py --dtype bfloat16 --device cuda
    .venv/bin/python benchmarks/generate_speed.py --new-tokens 16    # smoke test
    .venv/bin/python benchmarks/generate_speed.py --threads 1        # see below

Threads: at batch 1 a second CPU thread does not speed up the matrix-vector products (they are
bound by memory bandwidth), while every op that opens a parallel region (the fused attention
kernel, for one) waits for that thread to be scheduled; on a CPU shared with other work that wait can
cost a scheduler time slice per op. Compare a run with --threads 1 on such machines.
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
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runtime.device import autocast

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
    ("of_bound", "of bound", ".2f"),
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


def streamed_matrices(model: GPT) -> list[torch.Tensor]:
    """The weight matrices one decode step reads in full: each block's 2-D weights, then the LM head."""
    return [p.detach() for p in model.blocks.parameters() if p.dim() == 2] + [model.head.weight.detach()]


def matvec_chain(matrices: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    """One pass of the bound: x @ W^T for every matrix, x (1, in) fixed and random; no other work."""
    xs = {w.shape[1]: torch.randn(1, w.shape[1], device=device) for w in matrices}

    def run() -> None:
        with torch.inference_mode(), autocast(device, dtype):
            for w in matrices:
                xs[w.shape[1]] @ w.T

    return run


def bound_sampler(chain: Callable[[], None], passes: int, device: torch.device) -> Callable[[], None]:
    """A function that times `passes` passes of the chain and keeps the seconds per pass in .samples."""

    def sample() -> None:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(passes):
            chain()
        synchronize(device)
        sample.samples.append((time.perf_counter() - start) / passes)

    sample.samples = []
    return sample


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
    generate: Generator,
    prompt: list[int],
    n: int,
    args: argparse.Namespace,
    device: torch.device,
    between: Callable[[], None],
) -> tuple[float, list[int]]:
    """(median seconds over --repeats calls making n new tokens, the tokens), after an untimed
    warmup call of --warmup-tokens tokens; `between` runs after each timed call."""
    generate(prompt, args.warmup_tokens)
    times = []
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        tokens = generate(prompt, n)
        synchronize(device)
        times.append(time.perf_counter() - start)
        between()
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
    p.add_argument("--bound-passes", type=int, default=10, help="matvec-chain passes per sample of the bound")
    add_common_args(p)
    args = p.parse_args(argv)
    if min(args.new_tokens, args.prompt_tokens, args.warmup_tokens, args.repeats, args.bound_passes) < 1:
        p.error("--new-tokens, --prompt-tokens, --warmup-tokens, --repeats and --bound-passes must be at least 1")
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
    matrices = streamed_matrices(gpt)
    chain = matvec_chain(matrices, args.dtype, device)
    bound = bound_sampler(chain, args.bound_passes, device)
    for _ in range(3):  # warm up the chain and the allocator
        chain()
    rows, outputs = [], {}
    for (impl, cache), generate in methods.items():
        seconds, outputs[impl, cache] = timed(generate, prompt, args.new_tokens, args, device, between=bound)
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
    per_pass = statistics.median(bound.samples)
    rows.append(
        {
            "impl": "matvec chain",
            "cache": "bound",
            "rows": 1,
            "dtype": dtype_name(args.dtype),
            "tokens_per_s": 1 / per_pass,
            "ms_per_token": per_pass * 1e3,
        }
    )
    hf_row = next(r for r in rows if r["impl"] == "hf-gpt2")
    for row in rows:
        row["ratio"] = row["tokens_per_s"] / hf_row["tokens_per_s"]
        if row["impl"] != "hf-gpt2" and row["rows"] == 1:
            row["of_bound"] = row["tokens_per_s"] * per_pass
    streamed = {
        "matrices": len(matrices),
        "megabytes": sum(w.numel() * w.element_size() for w in matrices) / 1e6,
        "includes": "every 2-D weight of the blocks and the LM head (tied to the token embedding)",
        "samples": len(bound.samples),
        "passes_per_sample": args.bound_passes,
    }
    for b in batches:  # greedy: every row of a batch is the one-sequence text
        if outputs["attnlab", f"kv-cache x{b}"] != outputs["attnlab", "kv-cache"]:
            print(f"batch of {b}: its first row differs from the one-sequence greedy text")
    cache_diff = first_difference(outputs["attnlab", "kv-cache"], outputs["attnlab", "none"])
    hf_diff = first_difference(outputs["attnlab", "kv-cache"], outputs["hf-gpt2", "kv-cache"])
    report(args, device, num_params(gpt), rows, streamed, cache_diff, hf_diff)
    return 0 if cache_diff is None else 1


def report(
    args: argparse.Namespace,
    device: torch.device,
    params: int,
    rows: list[dict],
    streamed: dict,
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
                    "bound": streamed,
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
    print(
        f"bound: x @ W^T over {streamed['matrices']} matrices ({streamed['megabytes']:.1f} MB: the blocks' 2-D "
        f"weights and the LM head), median of {streamed['samples']} samples of {streamed['passes_per_sample']} passes"
    )
    print(f"attnlab cached == uncached greedy output: {_verdict(cache_diff)}")
    print(f"hf-gpt2 == attnlab greedy output:         {_verdict(hf_diff)}")


def _verdict(diff: int | None) -> str:
    return "identical" if diff is None else f"DIFFERENT (first at new token {diff})"


if __name__ == "__main__":
    raise SystemExit(main())
