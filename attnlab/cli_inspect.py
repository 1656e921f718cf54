"""Commands that look inside a run: attention (PNG or HTML) and plot (curves, positions, embeddings)."""

from __future__ import annotations

import argparse


def cmd_attention(args: argparse.Namespace) -> int:
    from attnlab.attention_views import write_attention
    from attnlab.run import load

    run = load(args.run, device=args.device)
    print(write_attention(run, args.input, args.out, args.layer, args.head, args.view))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnlab.run import load
    from attnlab.viz.inspect_plots import plot_run

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(plot_run(load(args.run, device="cpu"), args.what, out, args.tokens))
    return 0


def add_commands(sub) -> None:
    """Add `attention` and `plot` to the parser's subcommands."""
    from attnlab.viz.inspect_plots import WHAT

    desc = ("Draw what each head attends to for one input: a .png heatmap (queries down, keys across; "
            "every layer and head, one layer's heads and their mean with --layer, one head with --head) or "
            "a self-contained .html page with the head view and the model view (no network needed). "
            "Translation runs: encoder, decoder and cross-attention; image runs: [CLS] over the patches.")  # fmt: skip
    p = sub.add_parser("attention", help="attention pictures of a run on one input (PNG or HTML)", description=desc)
    p.add_argument("run", help="run directory (gpt, encoder, translation or image)")
    p.add_argument("input", help="text to read (an image file for image runs)")
    p.add_argument("--out", required=True, metavar="FILE.png|FILE.html", help="picture or page to write")
    p.add_argument("--layer", type=int, default=None, help="PNG: only this layer (1 = first), all its heads")
    p.add_argument("--head", type=int, default=None, help="PNG: only this head of --layer (1 = first)")
    p.add_argument("--view", default=None, choices=("self", "encoder", "decoder", "cross"),
                   help="PNG of a translation run: which attention (default: cross)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.set_defaults(func=cmd_attention)

    desc = ("Pictures of a trained run: loss (training and validation curves), lr (the schedule as run), "
            "positions (the position vectors as an image, position x dimension, and their cosine "
            "similarities), embeddings (a 2-D PCA of the token embeddings, the most useful tokens "
            "labelled).")  # fmt: skip
    pl = sub.add_parser("plot", help="loss and lr curves, position encodings, token embeddings", description=desc)
    pl.add_argument("run", help="run directory")
    pl.add_argument("--what", required=True, choices=WHAT, help="what to draw")
    pl.add_argument("--out", required=True, metavar="FILE.png", help="picture to write")
    pl.add_argument("--tokens", type=int, default=60, help="embeddings: how many tokens to label (default: 60)")
    pl.set_defaults(func=cmd_plot)
