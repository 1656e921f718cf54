"""Generation speed at every precision: attnlab (float32, bf16, int8, int4 weights; eager and compiled
decode steps) beside llama.cpp (f32, f16, q8_0, q4_0) on the same model, with each one's bandwidth bound.

For each --shape (6x384: the 6 x 384 GPT-2-block model; gpt2-small: GPT-2 small's shape, 124M) a run
with random weights is written once (random_run.py; random weights decode as fast as trained ones),
then, at the same thread count:
- attnlab, batch 1: `stream(..., temperature=0)`, the decoding engine every command uses, on the run
  loaded with --quantize (what `attnlab sample --quantize KIND` does: a layer whose shape ran faster
  in float32 here stays float32): "attnlab", the default path (its steps compiled: decoding/compiled.py),
  and "attnlab --no-compile", the eager one;
- attnlab, batch B (--batch): B greedy streams read at once, which the engine decodes in one forward
  pass a step, as a server's streams or `sample --num-samples` are (compiled: compiled_rows.py);
- llama.cpp: the run exported by `attnlab export --to gguf --type T`, decoded greedily by llama.cpp's
  own loop (attnlab.interop.llamacpp.greedy; batch B: greedy_rows, B sequences in one llama_decode a
  step), when llama-cpp-python is installed.
tokens/s = new tokens / wall time of the whole call (the prompt included), the best of --repeats
rounds after an untimed warm-up call of each; in a round every row of the shape runs once, in turn, so
that a neighbour's burst falls on all of them alike (the best: such a burst only ever slows).

The bound: a decode step at batch 1 must read every matrix it multiplies by once (the blocks' and the
LM head's; an embedding row is negligible), so no implementation can be faster than the time this
machine takes to read that many bytes. MB/token is what each row's model reads (its packed layers'
codes and scales, or a GGUF file's tensors); "bound" = 1 / the seconds a sum over a buffer of that many
bytes takes here (median of repeated reads, the same threads); "of bound" = tokens/s over it.
A small model's bytes can stay in the caches between steps, so its bound is the cache's, not DRAM's.

    .venv/bin/python benchmarks/generate_speed.py                          # both shapes, every row
    .venv/bin/python benchmarks/generate_speed.py --shape 6x384 --no-compile --new-tokens 64
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import gguf
import torch
from common import columns, cpu_named, first_difference, format_table
from random_run import SHAPES, random_run
from step_profile import report, step_profile

import attnlab
from attnlab.decoding.sampling import stream
from attnlab.interop.gguf_out import export_gguf
from attnlab.quant.packed import PackedLinear
from attnlab.runs.quantized import inference_linears

DEFAULT, EAGER = "attnlab", "attnlab --no-compile"  # the path a command takes without flags; the eager one
PAIRS = {"float32": "f32", "bf16": "f16", "int8": "q8_0", "int4": "q4_0"}  # attnlab precision -> llama.cpp type
COLUMNS = columns(
    "shape; impl; precision; batch::,; tokens_per_s:tokens/s:,.1f; ms_per_token:ms/token:,.2f; "
    "mb_per_token:MB/token:,.1f; bound:bound tok/s:,.0f; of_bound:of bound:.2f; "
    "vs_llamacpp:vs llama.cpp:.2f; same_tokens:tokens as f32;"
)


@functools.cache
def read_seconds(nbytes: int, repeats: int = 15) -> float:
    """Seconds to read `nbytes` once: a sum over a float32 buffer that size (a working set the size of
    the weights: the 6 x 384 model's fit in this Xeon's 105 MB L3), the fastest of `repeats`. A bound
    is the best the machine can do: a neighbour's burst only slows a timing, so the median of a noisy
    moment had put two rows above their bound. Measured once per size, for every row of that size."""
    buf = torch.ones(max(1, nbytes // 4))
    for _ in range(3):
        buf.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bytes(model: torch.nn.Module) -> int:
    """What one decode step reads: every matrix it multiplies by (packed: codes, scales, zeros)."""
    total = 0
    for _, _, _, layer in inference_linears(model):
        if isinstance(layer, PackedLinear):
            total += layer.stored_bytes()
        else:
            total += sum(p.numel() * p.element_size() for p in layer.parameters())
    return total


def gguf_bytes(path: Path) -> int:
    """What llama.cpp reads per step of a GGUF file: its matrices but the token and position tables
    (the output matrix is read in full; a tied one is the token table, then counted once)."""
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if len(t.shape) == 2}
    tables = {"token_embd.weight", "position_embd.weight"}
    read = sum(n for name, n in tensors.items() if name not in tables)
    return read if "output.weight" in tensors else read + tensors["token_embd.weight"]


def timed(call) -> tuple[float, list[int]]:
    """(seconds, tokens) of one call; a call that times itself (llama.cpp's) returns (tokens, rate)."""
    start = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - start
    return (out[0], None, out[1]) if isinstance(out, tuple) else (out, seconds, None)


def attnlab_methods(run: Path, shape: str, args, prompt: list[int]) -> list[tuple[dict, object]]:
    """(the row so far, a call that decodes) for every attnlab row of this shape. A compiled row loads
    the run as --compile does (its kernels chosen for compiled steps)."""
    methods, n = [], args.new_tokens
    for precision in args.precisions:
        quantize = None if precision == "float32" else precision
        for compiled in (False, True) if args.compile else (False,):
            model = attnlab.load(run, device="cpu", quantize=quantize, compiled=compiled).model
            mb = read_bytes(model) / 1e6
            impl = DEFAULT if compiled else EAGER
            call = lambda m=model, c=compiled: list(stream(m, prompt, n, temperature=0, dtype="float32", compile=c))
            methods.append((row(shape, impl, precision, 1, mb), call))
            for b in args.batch:
                call = lambda m=model, b=b, c=compiled: together(m, prompt, b, n, c)
                methods.append((row(shape, impl, precision, b, mb), call))
    return methods


def together(model, prompt: list[int], rows: int, n: int, compiled: bool) -> list[int]:
    """`rows` greedy sequences decoded at once by the model's engine, as a server's streams or `sample
    --num-samples` are (each reader takes a token in turn; the engine steps them in one batch): the
    first row's tokens."""
    streams = [stream(model, prompt, n, temperature=0, dtype="float32", compile=compiled) for _ in range(rows)]
    tokens: list[list[int]] = [[] for _ in streams]
    live = list(range(rows))
    while live:
        for i in list(live):
            token = next(streams[i], None)
            if token is None:
                live.remove(i)
            else:
                tokens[i].append(int(token))
    return tokens[0]


def llamacpp_methods(run: Path, shape: str, args, prompt: list[int], folder: Path) -> list[tuple[dict, object]]:
    """The same for llama.cpp, each precision's pair exported from the run once (kept in `folder`)."""
    from attnlab.interop.llamacpp import greedy, greedy_rows  # the llamacpp extra

    methods, n, threads = [], args.new_tokens, torch.get_num_threads()
    for precision in args.precisions:
        qtype = PAIRS[precision]
        path = folder / f"{shape}-{qtype}.gguf"
        if not path.is_file():
            export_gguf(run, path, qtype)
        mb = gguf_bytes(path) / 1e6
        methods.append((row(shape, "llama.cpp", qtype, 1, mb, precision), lambda p=path: greedy(p, prompt, n, threads)))
        for b in args.batch:
            call = lambda p=path, b=b: greedy_rows(p, prompt, b, n, threads)
            methods.append((row(shape, "llama.cpp", qtype, b, mb, precision), call))
    return methods


def measure(methods: list[tuple[dict, object]], args) -> list[dict]:
    """Every method once untimed, then --repeats rounds in which each runs once, in turn: a neighbour's
    burst hits all of them alike. Each row keeps its best round (tokens/s) and its tokens."""
    for _, call in methods:
        call()
    for _ in range(args.repeats):
        for r, call in methods:
            tokens, seconds, rate = timed(call)
            rate = rate if rate is not None else r["batch"] * args.new_tokens / seconds
            r["tokens"] = tokens
            r["tokens_per_s"] = max(r.get("tokens_per_s", 0.0), rate)
            r["ms_per_token"] = 1e3 / r["tokens_per_s"]
    return [r for r, _ in methods]


def row(shape: str, impl: str, precision: str, batch: int, mb: float, pair: str | None = None) -> dict:
    return {
        "shape": shape,
        "impl": impl,
        "precision": precision,
        "batch": batch,
        "mb_per_token": mb,
        "pair": pair or precision,
    }


def compare(rows: list[dict]) -> None:
    """Bounds (batch 1), llama.cpp ratios and whether each row's greedy tokens are attnlab float32's."""
    for r in rows:
        if r["batch"] == 1:
            r["bound"] = 1 / read_seconds(int(r["mb_per_token"] * 1e6))
            r["of_bound"] = r["tokens_per_s"] / r["bound"]
        ref = next(  # None when float32 was not asked for: nothing to compare the tokens with
            (
                x
                for x in rows
                if x["shape"] == r["shape"] and x["impl"] == EAGER and x["precision"] == "float32" and x["batch"] == 1
            ),
            None,
        )
        if ref is not None:
            same = r["tokens"] == ref["tokens"]
            r["same_tokens"] = "yes" if same else f"from {first_difference(r['tokens'], ref['tokens'])}"
        peer = [
            x
            for x in rows
            if x["shape"] == r["shape"]
            and x["impl"] == "llama.cpp"
            and x["pair"] == r["pair"]
            and x["batch"] == r["batch"]
        ]
        if r["impl"].startswith("attnlab") and peer:
            r["vs_llamacpp"] = r["tokens_per_s"] / peer[0]["tokens_per_s"]


def profiled(methods: list[tuple[dict, object]], new_tokens: int) -> None:
    """--profile: each attnlab row once (warmed up first) under the profiler (step_profile.py)."""
    for r, call in methods:
        call()
        label = f"{r['shape']} {r['impl']} {r['precision']} batch {r['batch']}"
        print(report(label, step_profile(call, new_tokens * r["batch"])), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--precisions", default="float32,bf16,int8,int4", help="attnlab precisions (and llama.cpp's pairs)")
    p.add_argument("--batch", default="16", help="batched attnlab rows (comma-separated; empty: none)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="leave out the compiled rows")
    p.add_argument("--no-llamacpp", dest="llamacpp", action="store_false", help="leave out llama.cpp's rows")
    p.add_argument("--runs", default=None, help="folder for the random runs and GGUF files (default: a temporary one)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--profile",
        action="store_true",
        help="each attnlab row's decode time by operator, and "
        "the time outside the operators (Python, the engine, dispatch), then the table",
    )
    args = p.parse_args(argv)
    args.precisions = [x for x in args.precisions.split(",") if x]
    args.batch = [int(b) for b in args.batch.split(",") if b.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = Path(args.runs or tempfile.mkdtemp(prefix="attnlab-speed-"))
    rows = []
    for shape in args.shape:
        run = random_run(folder, shape)
        prompt = torch.randint(
            0, SHAPES[shape].vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)
        ).tolist()
        methods = attnlab_methods(run, shape, args, prompt)
        if args.profile:
            profiled(methods, args.new_tokens)
        if args.llamacpp:
            methods += llamacpp_methods(run, shape, args, prompt, folder)
        rows += measure(methods, args)
    compare(rows)
    if args.json:
        rows = [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
        print(json.dumps({"cpu": cpu_named(), "threads": args.threads, "new_tokens": args.new_tokens, "rows": rows}))
        return 0
    print(
        f"{cpu_named()}, {args.threads} threads, {args.new_tokens} new tokens after {args.prompt_tokens} prompt tokens"
    )
    print(format_table(rows, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
