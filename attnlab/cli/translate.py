"""Command-line commands of translation: train translate, translate (also reached by predict), eval.

Model flags are the union of the Transformer's and the RNNs' config fields; a flag that does
not belong to the chosen --model is a one-line error. Training flags default to the settings
tuned for each model (tasks/translate.py TRAIN_DEFAULTS), then the user's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from attnlab.cli.main import (
    add_config_flags,
    add_model_choice_flags,
    checked,
    flags_of,
    model_overrides,
    speaks,
    train_config,
)
from attnlab.data.parallel import ParallelDataConfig
from attnlab.models.rnn import RNNSeq2SeqConfig
from attnlab.models.seq2seq import PRESETS, Seq2SeqConfig

SET_BY_DATA = {"src_vocab", "tgt_vocab", "attention"}
MODEL_NAMES = ("transformer", "rnn-attention", "rnn")


def cmd_train_translate(args: argparse.Namespace) -> int:
    from attnlab.tasks.translate import TRAIN_DEFAULTS, train_translate

    data = checked(ParallelDataConfig, flags_of(args, "data"), where="[data]")
    train = train_config(args, TRAIN_DEFAULTS[args.model])
    overrides = model_overrides(args)
    result = train_translate(args.out, args.model, overrides, train, data, force=args.force)
    if speaks():
        t = result["test"]
        print(f"test (greedy): exact match {t['exact_match']:.2%}, BLEU {t['bleu']:.1f}, chrF {t['chrf']:.1f} "
              f"({result['parameters']:,} parameters, {result['train_seconds']:.0f} s). "
              f'Try: attnlab translate {args.out} "some text" --beam 4')  # fmt: skip
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from attnlab.run import load

    return print_translation(load(args.run, device=args.device), args)


def print_translation(run, args: argparse.Namespace) -> int:
    from attnlab.tasks.translate import alignment_picture, translate

    picture = getattr(args, "attention", None)
    if picture:
        out = alignment_picture(run, args.text, picture, args.beam)
    else:
        (out,) = translate(run, [args.text], args.beam)
    if args.json:
        print(json.dumps({"translation": out, **({"attention": picture} if picture else {})}))
    else:
        print(out + (f"\nalignment: {picture}" if picture else ""))
    return 0


def eval_translation(run, args: argparse.Namespace) -> int:
    from attnlab.tasks.translate import evaluate_translation

    r = evaluate_translation(run, args.data, args.split or "test", args.beam)
    if args.json:
        print(json.dumps({"run": str(args.run), **r}))
        return 0
    decoding = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
    print(f"{r['data']} ({r['split']}): {r['examples']:,} pairs, {decoding}")
    print(f"  exact match  {r['exact_match']:.2%}\n  BLEU         {r['bleu']:.2f}\n  chrF         {r['chrf']:.2f}")
    print(f"  loss         {r['loss']:.4f} nats/token")
    return 0


def add_commands(sub, tasks) -> None:
    desc = ("Train an encoder-decoder on sentence pairs (a built-in task or a TSV/two files), then "
            "decode its test split: exact match, BLEU, chrF.")  # fmt: skip
    p = tasks.add_parser("translate", help="source -> target: the Transformer or an RNN encoder-decoder",
                         description=desc)  # fmt: skip
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument(
        "--model",
        default="transformer",
        choices=MODEL_NAMES,
        help="transformer, rnn-attention (Bahdanau) or rnn (no attention) (default: transformer)",
    )
    p.add_argument("--preset", default=None,
                   help=f"Transformer preset: {', '.join(PRESETS)} (default: transformer-tiny)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_config_flags(p, "data", ParallelDataConfig, "data")
    from attnlab.tasks.translate import TRAIN_DEFAULTS

    preset = dataclasses.asdict(PRESETS["transformer-tiny"])
    classes = (Seq2SeqConfig, RNNSeq2SeqConfig)
    add_model_choice_flags(p, classes, SET_BY_DATA, preset, TRAIN_DEFAULTS["transformer"], "transformer")
    p.set_defaults(func=cmd_train_translate)

    tr = sub.add_parser("translate", help="translate a text with a translation run (same as predict)")
    tr.add_argument("run", help="run directory (attnlab train translate)")
    tr.add_argument("text", help="source text")
    tr.add_argument("--beam", type=int, default=1, help="beam width; 1 is greedy decoding (default: 1)")
    tr.add_argument("--attention", default=None, metavar="FILE.png", help="also draw the alignment (cross-attention)")
    tr.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    tr.add_argument("--json", action="store_true", help="print one JSON object")
    tr.set_defaults(func=cmd_translate)
