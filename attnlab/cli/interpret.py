"""`attnlab inspect RUN INPUT --what lens|heads|ablate`: what a language model's layers and heads do."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WHAT = ("lens", "heads", "ablate", "over-training")


def _tables_json(tables: dict) -> dict:
    return {name: t.tolist() for name, t in tables.items()}


def _write(out: str | None, draw, data: dict) -> str | None:
    """Write `data` as JSON if out ends in .json, else draw(out) (PNG or SVG)."""
    if out is None:
        return None
    if out.endswith(".json"):
        Path(out).write_text(json.dumps(data, indent=1))
    else:
        draw(out)
    return out


def cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from attnlab.errors import AttnlabError
    from attnlab.run import load

    run = load(args.run, device="cpu")
    if run.tokenizer is None or not hasattr(run.model, "logits"):
        raise AttnlabError("inspect reads a language-model run (attnlab train lm)")
    if args.what == "over-training":
        return _over_training(run, args.out)
    if args.text is None:
        raise AttnlabError(f"--what {args.what} needs an input text")
    ids = torch.tensor([run.tokenizer.encode(args.text)])[:, : run.model.cfg.context]  # (1, T)
    if ids.shape[1] < 2:
        raise AttnlabError("give an input of at least two tokens")
    decode = lambda i: run.tokenizer.decode([i])
    lines = []
    if args.what == "lens":
        from attnlab.interpret.lens import logit_lens, plot_lens

        lens = logit_lens(run.model, ids, decode)
        written = _write(args.out, lambda p: plot_lens(lens, p), lens.as_json())
        mean = lens.target_prob.mean(-1)  # (L + 1,): how likely the actual next token was, by depth
        lines += [f"{name:>9}: p(actual next token) {float(p):.3f}" for name, p in zip(lens.layers, mean)]
    else:
        tables, title, diverging = _head_tables(run, ids, args.what)
        written = _write(args.out, lambda p: _draw_tables(tables, p, title, diverging), _tables_json(tables))
        for name, table in tables.items():
            lines.append(f"{name} (layer x head):")
            lines += ["  " + " ".join(f"{v:7.3f}" for v in row.tolist()) for row in table]
    if written:
        lines.append(f"wrote {written}")
    print("\n".join(lines))
    return 0


def _over_training(run, out: str | None) -> int:
    from attnlab.interpret.over_training import over_training, plot_over_training

    result = over_training(run)
    data = {**result, "scores": _tables_json(result["scores"])}
    written = _write(out, lambda p: plot_over_training(result, p), data)
    lines = [f"{'step':>8} {'repeat loss':>12} {'best induction':>15} {'best previous-token':>20}"]
    for i, step in enumerate(result["steps"]):
        ind, prev = result["scores"]["induction"][i], result["scores"]["previous-token"][i]
        lines.append(
            f"{step:>8} {result['repeat_loss'][i]:>12.4f} {float(ind.max()):>15.3f} {float(prev.max()):>20.3f}"
        )
    print("\n".join(lines + ([f"wrote {written}"] if written else [])))
    return 0


def _head_tables(run, ids, what: str):

    from attnlab.interpret.ablation import head_ablation
    from attnlab.interpret.detectors import head_scores, repeated_tokens
    from attnlab.trace import trace

    model = run.model
    patterns = lambda x: trace(model, x).patterns()  # (B, L, H, T, T)

    if what == "heads":
        scores = head_scores(patterns(ids), ids)
        n = min(model.cfg.context // 2, 50)
        rep, half = repeated_tokens(run.tokenizer.vocab_size, n, batch=8)
        scores["induction"] = head_scores(patterns(rep), rep, half)["induction"]
        title = "head detectors (previous, first, duplicate: on the input; induction: repeated random tokens)"
        return scores, title, False
    x, y = ids[:, :-1], ids[:, 1:]
    table = head_ablation(model, lambda: model(x, y)[1], (x,), "zero")
    return {"loss change when zeroed": table}, "head ablation: loss with the head zeroed minus the loss", True


def _draw_tables(tables, path, title, diverging) -> None:
    from attnlab.viz.heads import plot_head_tables

    plot_head_tables(tables, path, title, diverging)


def add_commands(sub) -> None:
    p = sub.add_parser("inspect", help="a language model's logit lens, head detectors or head ablation on an input",
                       description="lens: the next-token prediction read after each layer; heads: previous-token, "
                       "first-token, duplicate-token and induction scores of every head; ablate: the loss change "
                       "on the input when each head is zeroed; over-training: detector scores and the loss on "
                       "repeated tokens at every weight snapshot (train with --snapshot-every N).")  # fmt: skip
    p.add_argument("run", help="run directory (attnlab train lm)")
    p.add_argument("text", nargs="?", default=None, help="input text (not needed for --what over-training)")
    p.add_argument("--what", required=True, choices=WHAT, help="what to compute")
    p.add_argument("--out", default=None, metavar="FILE", help="picture (.png, .svg) or numbers (.json)")
    p.set_defaults(func=cmd_inspect)
