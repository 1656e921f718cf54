"""Generation speed on a GPU: attnlab's decoding engine against HuggingFace `generate`, same weights.

For each --shape (6x384: 6 layers x 384, context 1024; gpt2-small: GPT-2 small, 124M) a GPT-2-block
model with random weights is built on the device and its weights copied into HuggingFace's
GPT2LMHeadModel (common.build_pair: the mapping `attnlab export --to hf` uses). Then, greedy, the
same prompt, --new-tokens tokens (no stop token), at each --dtype (float32; bfloat16 under autocast
for both):
- attnlab, batch 1: `stream(..., temperature=0)`, the engine every command decodes with; also with
  compile=True (the compiled decode step) unless --no-compile;
- attnlab, batch B: `stream_rows`, B copies of the prompt in one forward pass a step;
- HF: `model.generate(do_sample=False, min_new_tokens=N, max_new_tokens=N)` on a (B, P) batch.
tokens/s = B * new tokens / wall time of the whole call (the prompt's forward included, the device
synchronized), the best of --repeats rounds after an untimed warm-up of each; "peak MiB" is
torch.cuda.max_memory_allocated during the row's fastest call (weights included); "same tokens" says
whether batch 1's tokens equal HF's at the same dtype (bf16 may differ once two logits tie).

    python benchmarks/gpu_generate.py                       # both shapes, float32 and bfloat16
    python benchmarks/gpu_generate.py --shape 6x384 --dtypes float32 --new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from common import build_pair, columns, first_difference, format_table, peak_mib, release, reset_peak, synchronize
from random_run import SHAPES

from attnlab.decoding.sampling import stream, stream_rows
from attnlab.runtime.device import DTYPES, autocast

COLUMNS = columns(
    "shape; dtype; impl; batch::,; tokens_per_s:tokens/s:,.1f; ms_per_step:ms/step:,.2f; "
    "peak_mib:peak MiB:,.0f; vs_hf:vs HF:.2f; same_tokens:same tokens as HF;"
)


def methods(gpt, hf, prompt: list[int], args, dtype: str) -> list[tuple[dict, object]]:
    """(row so far, a call returning batch row 0's new tokens) for every row of one shape and dtype."""
    device, n, cast = next(gpt.parameters()).device, args.new_tokens, DTYPES[dtype]
    engine_dtype = "float32" if dtype == "float32" else "bfloat16"
    rows = []
    for compiled in (False, True) if args.compile else (False,):
        impl = "attnlab compiled" if compiled else "attnlab"
        call = lambda c=compiled: list(stream(gpt, prompt, n, temperature=0, dtype=engine_dtype, compile=c))
        rows.append(({"impl": impl, "batch": 1}, call))
    for b in args.batch:
        call = lambda b=b: [int(t[0]) for t in stream_rows(gpt, prompt, b, n, temperature=0, dtype=engine_dtype)]
        rows.append(({"impl": "attnlab", "batch": b}, call))

    def hf_call(b: int) -> list[int]:
        ids = torch.tensor([prompt] * b, device=device)
        with autocast(device, cast):
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    for b in [1, *args.batch]:
        rows.append(({"impl": "HF generate", "batch": b}, lambda b=b: hf_call(b)))
    return rows


def timed(call, device) -> tuple[float, list[int]]:
    synchronize(device)
    reset_peak(device)
    start = time.perf_counter()
    tokens = call()
    synchronize(device)
    return time.perf_counter() - start, tokens


def measure(shape: str, dtype: str, args, device: torch.device) -> list[dict]:
    gpt, hf = build_pair(SHAPES[shape], device, args.seed)
    gpt.eval(), hf.eval()
    seeded = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, SHAPES[shape].vocab_size, (args.prompt_tokens,), generator=seeded).tolist()
    rows = methods(gpt, hf, prompt, args, dtype)
    with torch.inference_mode():
        for _, call in rows:
            call()  # warm-up: compilation, cuBLAS handles, the allocator's pools
        for _ in range(args.repeats):  # rounds: a burst elsewhere falls on every row alike
            for r, call in rows:
                seconds, tokens = timed(call, device)
                rate = r["batch"] * args.new_tokens / seconds
                if rate > r.get("tokens_per_s", 0.0):
                    r.update(tokens_per_s=rate, ms_per_step=1e3 * seconds / args.new_tokens, tokens=tokens)
                    r["peak_mib"] = peak_mib(device)
    out = [dict(r, shape=shape, dtype=dtype) for r, _ in rows]
    hf_rows = {r["batch"]: r for r in out if r["impl"] == "HF generate"}
    for r in out:
        peer = hf_rows[r["batch"]]
        r["vs_hf"] = r["tokens_per_s"] / peer["tokens_per_s"]
        same = r["tokens"] == peer["tokens"]
        r["same_tokens"] = "yes" if same else f"from token {first_difference(r['tokens'], peer['tokens'])}"
    del gpt, hf
    release(device)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=["6x384", "gpt2-small"])
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    p.add_argument("--batch", default="16", help="batched rows besides batch 1 (comma-separated; empty: none)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="leave out the compiled rows")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.batch = [int(b) for b in args.batch.split(",") if b]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    rows = [r for shape in args.shape for dtype in args.dtypes for r in measure(shape, dtype, args, device)]
    for r in rows:
        r.pop("tokens")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{name}, torch {torch.__version__}, {args.new_tokens} new tokens after {args.prompt_tokens}, greedy")
        print(format_table(rows, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
