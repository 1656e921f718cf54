"""Commands that look inside a run: attention (PNG, SVG, HTML, JSON), plot (curves, positions,
embeddings, experts), and serve (the explorer and the OpenAI-compatible API)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from attnlab.cli.options import AttentionOptions, PlotOptions, ServeOptions
from attnlab.decoding.settings import compiling
from attnlab.decoding.speculate import speculation
from attnlab.errors import AttnlabError
from attnlab.interpret.plots import plot_run
from attnlab.interpret.views import write_attention
from attnlab.runs.run import load
from attnlab.runtime.threads import ask


def run_attention(opts: AttentionOptions) -> int:
    run = load(opts.run, device=opts.device)
    print(write_attention(run, opts.input, opts.out, opts.layer, opts.head, opts.view))
    return 0


def run_plot(opts: PlotOptions) -> int:
    print(plot_run(load(opts.run, device="cpu"), opts.what, Path(opts.out), opts.tokens, opts.text))
    return 0


def run_serve(opts: ServeOptions) -> int:
    try:
        from attnlab.serve.app import Limits, check_exposure, serve  # fastapi, uvicorn: for this command alone
    except ImportError as e:
        raise AttnlabError(
            f"attnlab serve needs fastapi, uvicorn and python-multipart ({e}): pip install -e ."
        ) from None
    # The model's threads; by default one core is left to the thread that speaks HTTP, which works
    # while the decode loop computes (benchmarks/serve_load.py: more streams served with one model
    # thread than with two on 2 cores; docs/log.md, "Serving").
    # Fewer still when other attnlab/torch processes are busy here (runtime/threads.py, as the runs load).
    torch.set_num_threads(opts.threads or max(1, torch.get_num_threads() - 1))
    if opts.threads:
        ask(opts.threads)  # the user's count: kept as the runs load
    key = opts.api_key or os.environ.get("ATTNLAB_API_KEY") or None
    check_exposure(opts.host, key, opts.insecure_no_key)  # before the runs load: a refusal is instant
    hosts = [h.strip() for h in (opts.allowed_hosts or "").split(",") if h.strip()]
    limits = Limits(
        max_streams=opts.max_streams,
        max_batch=opts.max_batch,
        request_timeout=opts.request_timeout,
        prefill=opts.prefill,
        speculate=speculation(opts.speculate, opts.draft_tokens),
        draft=opts.draft,
        prefix_cache_mb=opts.prefix_cache_mb,
    )
    serve(
        opts.runs,
        host=opts.host,
        port=opts.port,
        device=opts.device,
        api_key=key,
        insecure_no_key=opts.insecure_no_key,
        allowed_hosts=hosts,
        cors_origins=opts.cors_origin,
        limits=limits,
        quantize=opts.quantize,
        compiled=compiling(opts.compile),
        transcoders=opts.transcoders,
    )
    return 0
