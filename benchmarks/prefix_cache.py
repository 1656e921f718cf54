"""Time to first token with the decoding engine's prefix cache (decoding/prefix_cache.py): a request
whose system prompt was seen before against one whose system prompt was not, and the memory over
many requests sharing it with suffixes of their own.

A GPT of GPT-2 small's shape (12 x 768, context 1024, vocabulary 50,257), untrained weights (speed
only), in-process: each request is a system prompt of --prompt-tokens random tokens and a suffix of
--suffix tokens of its own, one new token drawn (seeded, temperature 1). Cold: a system prompt never
seen; warm: the same system prompt again, another suffix. The rounds interleave cold and warm. Then
--requests requests with the one system prompt and distinct suffixes: the process's resident memory
and the cache's bytes every fifth of the way.

    .venv/bin/python benchmarks/prefix_cache.py --repeats 3 --requests 500 --cache-mb 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from attnlab.decoding.engine import Engine
from attnlab.decoding.settings import Draw
from attnlab.models.gpt import GPT, GPTConfig

GPT2_SMALL = GPTConfig(n_layer=12, n_head=12, d_model=768, context=1024, vocab_size=50257)


def rss_mb() -> float:
    """The process's resident memory (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def first_token_ms(engine: Engine, ids: list[int], seed: int) -> float:
    t0 = time.perf_counter()
    steps = engine.generate(ids, Draw(1.0, seed=seed), 1)
    next(steps)
    ms = (time.perf_counter() - t0) * 1e3
    steps.close()
    return ms


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=512, help="the system prompt's tokens")
    p.add_argument("--suffix", type=int, default=24, help="each request's own tokens after it")
    p.add_argument("--repeats", type=int, default=3, help="cold and warm requests, interleaved")
    p.add_argument("--requests", type=int, default=500, help="requests with distinct suffixes, for the memory")
    p.add_argument("--cache-mb", type=float, default=128, help="the prefix cache's memory")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args()


def cold_and_warm(engine: Engine, tokens, args: argparse.Namespace) -> None:
    """Rounds of a request with a new system prompt, then one with the same system prompt."""
    cold, warm = [], []
    for r in range(args.repeats):
        system = tokens(args.prompt_tokens)
        cold.append(first_token_ms(engine, system + tokens(args.suffix), 2 * r))
        warm.append(first_token_ms(engine, system + tokens(args.suffix), 2 * r + 1))
        print(f"round {r}: cold {cold[-1]:7.1f} ms  warm {warm[-1]:6.1f} ms  ({warm[-1] / cold[-1]:.3f}x)")
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"TTFT median: cold {c:.1f} ms, warm {w:.1f} ms: warm / cold {w / c:.3f}")


def memory(engine: Engine, tokens, args: argparse.Namespace) -> None:
    """--requests requests with one system prompt and suffixes of their own: memory every fifth."""
    system, start = tokens(args.prompt_tokens), rss_mb()
    for i in range(args.requests + 1):
        if i % max(1, args.requests // 5) == 0:
            report = engine.report()
            print(
                f"after {i:4d} requests: resident {rss_mb():7.1f} MB ({rss_mb() - start:+.1f}), cache "
                f"{report['prefix bytes'] / 2**20:6.1f} MB in {report['prefix blocks']} blocks, "
                f"hits {report['prefix hits']}, tokens reused {report['prefix tokens reused']}"
            )
        if i < args.requests:
            first_token_ms(engine, system + tokens(args.suffix), i)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL).eval()
    g = torch.Generator().manual_seed(1)

    def tokens(n: int) -> list[int]:  # random ids: prompts no earlier request shares by chance
        return torch.randint(GPT2_SMALL.vocab_size, (n,), generator=g).tolist()

    engine = Engine(model, max_batch=16, dtype="float32", prefix_cache_mb=args.cache_mb)
    engine.warm()  # the batched step and the tolerance, as a server prepares them before it listens
    print(f"load average {os.getloadavg()[0]:.2f}; GPT-2 small shape, {args.threads} thread(s)")
    cold_and_warm(engine, tokens, args)
    memory(engine, tokens, args)
    print(f"load average {os.getloadavg()[0]:.2f}")
    engine.close()


if __name__ == "__main__":
    main()
