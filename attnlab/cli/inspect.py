"""Commands that look inside a run: attention (PNG or HTML), plot (curves, positions, embeddings), serve."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.plots import WHAT, plot_run
from attnlab.interpret.views import write_attention
from attnlab.runs.run import load


def cmd_attention(args: argparse.Namespace) -> int:

    run = load(args.run, device=args.device)
    print(write_attention(run, args.input, args.out, args.layer, args.head, args.view))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(plot_run(load(args.run, device="cpu"), args.what, out, args.tokens, args.text))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:

    try:
        from attnlab.serve.app import Limits, check_exposure, serve  # fastapi, uvicorn: for this command alone
    except ImportError as e:
        raise AttnlabError(
            f"attnlab serve needs fastapi, uvicorn and python-multipart ({e}): pip install -e ."
        ) from None
    for flag in ("max_streams", "max_batch", "request_timeout", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise AttnlabError(f"--{flag.replace('_', '-')} must be above 0, got {getattr(args, flag)}")
    # The model's threads; by default one core is left to the thread that speaks HTTP, which works
    # while the decode loop computes (benchmarks/serve_load.py on 2 cores shared with another job:
    # 16 streams of gpt-nano gave 4.0x one stream's tokens/s with 1 model thread, 2.9x with 2).
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads() - 1))
    key = args.api_key or os.environ.get("ATTNLAB_API_KEY") or None
    check_exposure(args.host, key, args.insecure_no_key)  # before the runs load: a refusal is instant
    hosts = [h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()]
    limits = Limits(max_streams=args.max_streams, max_batch=args.max_batch, request_timeout=args.request_timeout)
    serve(args.runs, host=args.host, port=args.port, device=args.device, api_key=key,
          insecure_no_key=args.insecure_no_key, allowed_hosts=hosts, cors_origins=args.cors_origin,
          limits=limits)  # fmt: skip
    return 0


def add_commands(sub) -> None:
    """Add `attention`, `plot` and `serve` to the parser's subcommands."""

    desc = ("Draw what each head attends to for one input: a .png or .svg heatmap grid (queries down, keys "
            "across; every layer and head, one layer's heads and their mean with --layer, one head with "
            "--head), a self-contained .html page with the head view and the model view (no network needed), "
            "or .json: the weights behind the picture (all views, or those --view/--layer/--head pick). "
            "Translation runs: encoder, decoder and cross-attention; image runs: [CLS] over the patches.")  # fmt: skip
    p = sub.add_parser("attention", help="attention of a run on one input (PNG, SVG, HTML, JSON)", description=desc)
    p.add_argument("run", help="run directory (gpt, encoder, translation or image)")
    p.add_argument("input", help="text to read (an image file for image runs)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="what to write, by suffix: .png or .svg picture, .html page, .json numbers")  # fmt: skip
    p.add_argument("--layer", type=int, default=None, help="PNG, SVG, JSON: only this layer (1 = first), all its heads")
    p.add_argument("--head", type=int, default=None, help="PNG, SVG, JSON: only this head of --layer (1 = first)")
    p.add_argument("--view", default=None, choices=("self", "encoder", "decoder", "cross"),
                   help="a translation run: which attention (PNG, SVG default: cross; JSON default: all)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.set_defaults(func=cmd_attention)

    desc = ("Pictures of a trained run: loss (training and validation curves), lr (the schedule as run), "
            "positions (the position vectors as an image, position x dimension, and their cosine "
            "similarities), embeddings (a 2-D PCA of the token embeddings, the most useful tokens "
            "labelled); for a mixture of experts, experts (the text of --text once per layer, each token on "
            "the colour of the expert it was routed to) and expert-load (each layer's share of tokens per "
            "expert against the step).")  # fmt: skip
    pl = sub.add_parser("plot", help="loss and lr curves, position encodings, token embeddings, expert routing",
                        description=desc)  # fmt: skip
    pl.add_argument("run", help="run directory")
    pl.add_argument("--what", required=True, choices=WHAT, help="what to draw")
    pl.add_argument("--out", required=True, metavar="FILE",
                    help="picture to write: .png, .svg (vector) or .json (its numbers)")  # fmt: skip
    pl.add_argument("--tokens", type=int, default=60, help="embeddings: how many tokens to label (default: 60)")
    pl.add_argument("--text", default=None, help="experts: the text to route (default: a line of Python)")
    pl.set_defaults(func=cmd_plot)

    desc = ("A local web page over trained runs: each run's config, size and loss curve; type an input "
            "and get the output of its task (streamed text with temperature / top-k / top-p for a GPT, "
            "labels, tags, [MASK] fills, translations, an uploaded image's class); and the attention of "
            "that input in the head view and the model view. JSON API under /api (see /openapi.json); an "
            "OpenAI-compatible API under /v1 (models, completions, chat completions; streaming; concurrent "
            "requests decoded as one batch). Beyond this machine (a --host other than loopback) it needs "
            "a key.")  # fmt: skip
    srv = sub.add_parser("serve", help="a local web explorer and an OpenAI-compatible API over trained runs",
                         description=desc)  # fmt: skip
    srv.add_argument("runs", nargs="+", metavar="RUN", help="run directories to serve")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    srv.add_argument("--port", type=int, default=8765, help="port (default: 8765)")
    srv.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    srv.add_argument("--api-key", default=None, metavar="KEY",
                     help="require 'Authorization: Bearer KEY' on every request but /health (default: the "
                          "ATTNLAB_API_KEY environment variable; needed with a --host beyond loopback)")  # fmt: skip
    srv.add_argument("--insecure-no-key", action="store_true",
                     help="serve a --host beyond loopback without a key: anyone who reaches it can use it")  # fmt: skip
    srv.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                     help="comma-separated Host header names to answer besides loopback and --host ('*': any); "
                          "a name a browser page could use to reach the server (DNS rebinding) is refused")  # fmt: skip
    srv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API; repeatable "
                          "(default: none, CORS off)")  # fmt: skip
    srv.add_argument("--max-streams", type=int, default=32,
                     help="sequences generated at once over all requests; more get 429 (default: 32)")  # fmt: skip
    srv.add_argument("--max-batch", type=int, default=16,
                     help="sequences of one run decoded in one forward pass; more wait (default: 16)")  # fmt: skip
    srv.add_argument("--request-timeout", type=float, default=300.0, metavar="SECONDS",
                     help="a generation running longer is stopped with an error (default: 300)")  # fmt: skip
    srv.add_argument("--threads", type=int, default=None,
                     help="CPU threads for the model (default: one per core but one, which the HTTP side "
                          "keeps)")  # fmt: skip
    srv.set_defaults(func=cmd_serve)
