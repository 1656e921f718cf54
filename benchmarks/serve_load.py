"""Load on `attnlab serve`'s OpenAI-compatible API: throughput and time to first token at 1, 4 and
16 concurrent streams, exactness under batching, and the server's memory over many requests.

For each model shape (gpt-nano: 4 layers x 128, context 64; and 6 layers x 384, context 256; both with
a 256-character vocabulary and weights after one training step, which is all speed needs):
1. trains the run (`attnlab train lm --max-steps 1`) and starts `attnlab serve RUN` in a process of
   its own (the load comes from this process, so the two do not share an interpreter lock);
2. for each concurrency c: c client threads each send --requests streamed completions one after the
   other (--tokens tokens each, seeded, temperature 1, ignore_eos so every request draws them all);
   tokens/s = all tokens drawn (usage.completion_tokens) / the phase's wall time; time to first token
   is from sending the request to the first chunk with text, p50 and p95 over the phase's requests;
3. checks every seeded text of the highest concurrency against the same seed's text at concurrency 1
   (exactness under batching: each must be equal);
4. reads the server's resident memory (VmRSS) after a warm-up, sends --memory-requests short
   completions (16 tokens, 16 at a time), and reads it again.
The table gives each concurrency's tokens/s and its ratio to one stream (the issue's target: >= 4x at
16 streams on 2 cores), and the server's CPU time per token, which other work on the machine
inflates less than the wall clock. The machine (CPU model, cores) and its load average are printed.

Run from the repository root:
    .venv/bin/python benchmarks/serve_load.py                      # both shapes, 1/4/16 streams, 500 requests
    .venv/bin/python benchmarks/serve_load.py --shapes nano --tokens 16 --memory-requests 50   # smoke test
Linux only (/proc for the memory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import columns, cpu_name, format_table

SHAPES = {  # name: attnlab train flags
    "nano": ["--preset", "gpt-nano"],
    "6x384": ["--preset", "gpt-nano", "--n-layer", "6", "--d-model", "384", "--n-head", "6", "--context", "256"],
}
PROMPT = "def load(path):\n"
COLUMNS = columns(
    "shape; streams::,; requests::,; tokens::,; seconds::,.2f; tokens_per_s:tokens/s:,.1f; "
    "speedup:x 1 stream:.2f; ttft_p50_ms:TTFT p50 ms:,.0f; ttft_p95_ms:TTFT p95 ms:,.0f; "
    "cpu_ms_per_token:server CPU ms/token:.2f;"
)


def corpus(path: Path) -> None:
    """Text with 254 distinct characters: a character vocabulary of 256 with the two specials."""
    chars = "".join(chr(c) for c in range(32, 127)) + "".join(chr(c) for c in range(161, 320))
    path.write_text((PROMPT + chars + "\n") * 200, encoding="utf-8")


def train(run: Path, shape: str, data: Path, log: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "train",
        "lm",
        "--out",
        str(run),
        "--data",
        str(data),
        "--tokenizer",
        "char",
        "--max-steps",
        "1",
        "--batch-size",
        "2",
        "--eval-interval",
        "1",
        "--eval-batches",
        "1",
        "--device",
        "cpu",
        *SHAPES[shape],
    ]
    with log.open("w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"training the {shape} run failed; see {log}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: Path, port: int, log: Path, threads: int | None, prefill: int | None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "serve",
        str(run),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-streams",
        "64",
        "--max-batch",
        "16",
        *(["--threads", str(threads)] if threads else []),
        *(["--prefill", str(prefill)] if prefill is not None else []),
    ]
    server = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server stopped; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the server did not start in 120 s; see {log}")


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used (user + system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def client() -> httpx.Client:
    """An HTTP client that sends its packets at once (TCP_NODELAY). httpx writes a request's headers
    and body separately; with Nagle's algorithm on, the body waits for the server's delayed ACK of the
    headers, 40 ms on Linux: every request would carry those 40 ms, whatever the server does."""
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return httpx.Client(transport=httpx.HTTPTransport(socket_options=nodelay), timeout=600)


def prompt_of(seed: int, distinct: bool) -> str:
    """PROMPT, or (distinct) a prompt of the same 16 characters that differs with the seed: a server that
    computes a prompt once for every request that sends it gains nothing from these."""
    return f"def load(p{seed % 1000:03d}):\n" if distinct else PROMPT


def stream(
    client: httpx.Client, url: str, seed: int, tokens: int, distinct: bool = False
) -> tuple[str, int, float, float]:
    """One streamed completion: (text, tokens drawn, seconds to the first text, seconds in all)."""
    body = {
        "model": "run",
        "prompt": prompt_of(seed, distinct),
        "max_tokens": tokens,
        "seed": seed,
        "temperature": 1.0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, text, drawn = None, [], 0
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}: {response.read()[:200]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            for choice in chunk["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - t0
                text.append(choice["text"])
            if chunk.get("usage"):
                drawn = chunk["usage"]["completion_tokens"]
    return "".join(text), drawn, first if first is not None else float("nan"), time.perf_counter() - t0


def phase(url: str, pid: int, streams: int, requests: int, tokens: int, distinct: bool) -> tuple[dict, dict[int, str]]:
    """`streams` clients, each sending `requests` streamed completions in turn: the figures (with the
    server's CPU time per token, which other work on the machine slows less than the wall clock), and
    the text of each seed."""
    start = threading.Barrier(streams)

    def client_loop(c: int) -> list[tuple[int, str, int, float]]:
        out = []
        with client() as http:
            start.wait()
            for r in range(requests):
                seed = c * requests + r
                text, drawn, ttft, _ = stream(http, url, seed, tokens, distinct)
                out.append((seed, text, drawn, ttft))
        return out

    t0, cpu0 = time.perf_counter(), cpu_seconds(pid)
    with ThreadPoolExecutor(streams) as pool:
        results = [x for part in pool.map(client_loop, range(streams)) for x in part]
    seconds, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    drawn = sum(r[2] for r in results)
    ttft = sorted(r[3] * 1e3 for r in results)
    figures = {
        "streams": streams,
        "requests": len(results),
        "tokens": drawn,
        "seconds": seconds,
        "tokens_per_s": drawn / seconds,
        "ttft_p50_ms": statistics.median(ttft),
        "cpu_ms_per_token": cpu / drawn * 1e3,
        "ttft_p95_ms": ttft[min(len(ttft) - 1, round(0.95 * (len(ttft) - 1)))],
    }
    return figures, {r[0]: r[1] for r in results}


def memory(url: str, pid: int, n: int) -> tuple[float, float]:
    """RSS (MB) before and after n short completions sent 16 at a time (after a warm-up of 32)."""
    body = lambda i: {"model": "run", "prompt": PROMPT, "max_tokens": 16, "seed": i}  # noqa: E731

    http = client()

    def send(i: int) -> None:
        r = http.post(f"{url}/v1/completions", json=body(i))
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}: {r.text[:200]}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(send, range(32)))
        before = rss_mb(pid)
        list(pool.map(send, range(n)))
    return before, rss_mb(pid)


def measure(shape: str, args: argparse.Namespace, root: Path) -> dict:
    data, run = root / "corpus.txt", root / "run"
    corpus(data)
    train(run, shape, data, root / "train.log")
    port = free_port()
    server = start_server(run, port, root / "serve.log", args.server_threads, args.server_prefill)
    url = f"http://127.0.0.1:{port}"
    try:
        stream(client(), url, 0, 8)  # warm-up: the batcher's thread starts and calibrates
        rows, texts = [], {}
        for c in args.concurrency:
            figures, texts[c] = phase(url, server.pid, c, args.requests, args.tokens, args.distinct_prompts)
            rows.append({"shape": shape, **figures})
        base = rows[0]["tokens_per_s"]
        for row in rows:
            row["speedup"] = row["tokens_per_s"] / base
        # The same seeds at one stream: the reference each batched text must equal.
        top = max(args.concurrency)
        http = client()
        alone = {seed: stream(http, url, seed, args.tokens, args.distinct_prompts)[0] for seed in sorted(texts[top])}
        exact = sum(texts[top][s] == alone[s] for s in alone)
        before, after = memory(url, server.pid, args.memory_requests) if args.memory_requests else (None, None)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"rows": rows, "exact": f"{exact}/{len(alone)}", "rss_before_mb": before, "rss_after_mb": after}


def default_threads() -> str:
    """What `attnlab serve` picks without --threads on this machine: a core for its HTTP thread."""
    import torch

    return f"default = {max(1, torch.get_num_threads() - 1)}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--shapes", default="nano,6x384", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument(
        "--concurrency", default="1,4,16", help="concurrent streams, comma-separated (the first is the base)"
    )
    p.add_argument("--requests", type=int, default=3, help="streamed completions per client, one after the other")
    p.add_argument("--tokens", type=int, default=64, help="tokens per completion")
    p.add_argument("--memory-requests", type=int, default=500, help="short completions between the RSS readings")
    p.add_argument("--server-threads", type=int, default=None, help="attnlab serve --threads (default: its own)")
    p.add_argument(
        "--server-prefill",
        type=int,
        default=None,
        help="attnlab serve --prefill (0: each prompt alone; default: its own)",
    )
    p.add_argument(
        "--distinct-prompts", action="store_true", help=f"each request's own prompt of {len(PROMPT)} characters"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if any(s not in SHAPES for s in args.shapes) or min(args.concurrency, default=0) < 1:
        p.error(f"--shapes takes {', '.join(SHAPES)}; --concurrency takes numbers >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    results = {}
    for shape in args.shapes:
        root = Path(tempfile.mkdtemp(prefix=f"serve-load-{shape}-"))
        try:
            results[shape] = measure(shape, args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()}
    if args.json:
        print(json.dumps({"machine": machine, "results": results}, indent=1))
        return 0
    threads = args.server_threads or default_threads()
    print(
        f"{machine['cpu']}, {machine['cores']} cores; load average before {load_before[0]:.2f}, "
        f"after {machine['load_after'][0]:.2f}; {args.tokens} tokens per request, {args.requests} requests per "
        f"stream; server: attnlab serve --max-batch 16 --threads {threads}"
        + ("" if args.server_prefill is None else f" --prefill {args.server_prefill}")
        + ("; distinct prompts" if args.distinct_prompts else "; one prompt")
    )
    print(format_table([row for r in results.values() for row in r["rows"]], COLUMNS))
    for shape, r in results.items():
        rss = (
            ""
            if r["rss_before_mb"] is None
            else (
                f"; server RSS {r['rss_before_mb']:.0f} MB before and {r['rss_after_mb']:.0f} MB after "
                f"{args.memory_requests} more requests"
            )
        )
        print(f"{shape}: seeded texts at {max(args.concurrency)} streams equal to one stream's: {r['exact']}{rss}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
