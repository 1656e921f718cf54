"""Time to first token of bursts of requests on the decoding engine itself, without HTTP: what
`benchmarks/serve_load.py` measures through `attnlab serve`, less the server, for each prefill budget
(decoding/prefill.py; 0 = each prompt alone).

c client threads each submit --requests prompts of 16 tokens in turn (64 tokens each, seeded,
temperature 1) to one Engine running its own thread; they start together and, drawing the same
number of tokens, finish together, so each round arrives as a burst. TTFT is from submit() to the
first Step; p50 and p95 over all requests; then the bytes of the engine's key/value table. Untrained
weights (speed only).

    .venv/bin/python benchmarks/engine_burst.py --budgets 0,64,256 --distinct
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch

from attnlab.decoding.engine import Engine
from attnlab.decoding.settings import Draw
from attnlab.models.gpt import GPT, GPTConfig

SHAPES = {
    "nano": GPTConfig(n_layer=4, n_head=4, d_model=128, context=64, vocab_size=256),
    "6x384": GPTConfig(n_layer=6, n_head=6, d_model=384, context=256, vocab_size=256),
    "gpt2-small": GPTConfig(n_layer=12, n_head=12, d_model=768, context=1024, vocab_size=50257),
}


def prompt(seed: int, distinct: bool) -> list[int]:
    """serve_load.py's prompts, as character ids."""
    return [ord(c) for c in (f"def load(p{seed % 1000:03d}):\n" if distinct else "def load(path):\n")]


def burst(engine: Engine, clients: int, requests: int, tokens: int, distinct: bool) -> tuple[float, float, float]:
    """(TTFT p50 ms, p95 ms, tokens/s) of `clients` threads sending `requests` prompts each in turn."""
    ttft, lock, start = [], threading.Lock(), threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()
        for r in range(requests):
            seed, done, first, t0 = c * requests + r, threading.Event(), [], time.perf_counter()

            def emit(step, first=first, done=done, t0=t0):  # called in the engine's thread
                if step is None or isinstance(step, Exception):
                    done.set()
                elif not first:
                    first.append(time.perf_counter() - t0)

            engine.submit(prompt(seed, distinct), Draw(1.0, seed=seed), tokens, emit)
            done.wait()
            with lock:
                ttft.append(first[0] * 1e3)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds, ttft = time.perf_counter() - t0, sorted(ttft)
    return statistics.median(ttft), ttft[round(0.95 * (len(ttft) - 1))], clients * requests * tokens / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="6x384", choices=list(SHAPES))
    p.add_argument("--budgets", default="0,64,256", help="prefill budgets (tokens a turn), comma-separated")
    p.add_argument("--concurrency", default="1,16", help="concurrent clients, comma-separated")
    p.add_argument("--requests", type=int, default=3, help="prompts per client, one after the other")
    p.add_argument("--tokens", type=int, default=64, help="tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="rounds over the budgets, interleaved")
    p.add_argument("--distinct", action="store_true", help="each request its own prompt")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(SHAPES[args.shape]).eval()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.shape}, {args.threads} thread(s)")
    for _ in range(args.repeats):
        for budget in (int(b) for b in args.budgets.split(",")):
            engine = Engine(model, max_batch=16, dtype="float32", prefill=budget)
            engine.warm()  # calibrated (the batched step built) before the clock starts, as a server does
            for clients in (int(c) for c in args.concurrency.split(",")):
                p50, p95, speed = burst(engine, clients, args.requests, args.tokens, args.distinct)
                print(
                    f"prefill {budget:4d}  streams {clients:2d}  TTFT p50 {p50:6.1f}  p95 {p95:6.1f} ms  "
                    f"{speed:6.0f} tokens/s"
                )
            print(f"the engine's key/value table: {engine.slots.bytes() / 1e9:.3f} GB")
            engine.close(wait=5)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
