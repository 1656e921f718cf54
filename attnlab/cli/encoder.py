"""Command-line commands of the encoder side: train mlm / classify / tag, predict, compare.

Model flags are the union of the fields of every model's config (encoder and baselines); a
flag that does not belong to the chosen --model is a one-line error. Training flags default
to the settings tuned for each model (tasks/classify.py TRAIN_DEFAULTS), then the user's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from attnlab.cli.main import (
    Parser,
    add_config_flags,
    add_model_choice_flags,
    checked,
    flags_of,
    model_overrides,
    speaks,
    train_config,
)
from attnlab.data import DataConfig
from attnlab.data.labeled import LabeledDataConfig
from attnlab.data.parallel import GENERATED
from attnlab.errors import AttnlabError
from attnlab.models.encoder import PRESETS as ENCODER_PRESETS
from attnlab.models.encoder import EncoderConfig
from attnlab.tasks.labeled import MODELS, TRAIN_DEFAULTS
from attnlab.engine.loop import TrainConfig

SET_BY_DATA = {"vocab_size", "n_labels", "task", "head", "context"}


def cmd_train_labeled(args: argparse.Namespace) -> int:
    from attnlab.tasks.labeled import train_labeled

    data = checked(LabeledDataConfig, flags_of(args, "data"), where="[data]")
    overrides, train = model_overrides(args), train_config(args, TRAIN_DEFAULTS.get(args.model, {}))
    result = train_labeled(args.out, args.task, args.model, overrides, train, data,
                           init=args.init, force=args.force, word_vectors=args.word_vectors,
                           freeze_vectors=args.freeze_vectors)  # fmt: skip
    if speaks():
        t = result["test"]
        print(f"test: accuracy {t['accuracy']:.4f}, macro-F1 {t['macro_f1']:.4f} "
              f"({result['parameters']:,} parameters, {result['train_seconds']:.0f} s). "
              f'Try: attnlab predict {args.out} "some text"')  # fmt: skip
    return 0


def cmd_train_mlm(args: argparse.Namespace) -> int:
    from attnlab.tasks.mlm import MLM_DATA, MLM_TRAIN, train_mlm

    preset = args.preset or "encoder-small"
    if preset not in ENCODER_PRESETS:
        raise AttnlabError(f"unknown preset {preset!r}; choose from {', '.join(ENCODER_PRESETS)}")
    model = checked(EncoderConfig, {**dataclasses.asdict(ENCODER_PRESETS[preset]), **flags_of(args, "model")},
                    where="[model]")  # fmt: skip
    train = train_config(args, MLM_TRAIN)
    data = checked(DataConfig, {**MLM_DATA, **flags_of(args, "data")}, where="[data]")
    result = train_mlm(args.out, model, train, data, force=args.force)
    if speaks():
        val = "n/a" if result["val_loss"] is None else f"{result['val_loss']:.4f}"  # no validation split
        print(f"done: step {result['step']}, validation loss {val}. "
              f'Try: attnlab predict {args.out} "def __init__([MASK], name):"')  # fmt: skip
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from attnlab.tasks.text_predict import predict
    from attnlab.run import load

    run = load(args.run, device=args.device)
    kind = run.config.get("task", {}).get("kind")
    if kind == "translate":
        from attnlab.cli.translate import print_translation

        return print_translation(run, args)
    if kind == "image":
        from attnlab.cli.image import print_image_prediction

        return print_image_prediction(run, args)
    result = predict(run, args.text, args.top_k or 5)
    if args.json:
        print(json.dumps(result))
    elif result["kind"] == "classify":
        print(f"{result['label']}  ({result['probability']:.3f})")
    elif result["kind"] == "tag":
        for t in result["tokens"]:
            print(f"{t['token']:<20} {t['tag']:<10} {t['probability']:.3f}")
    else:
        for m in result["masks"]:
            shown = ("\\n" if c["token"] == "\n" else c["token"] for c in m["candidates"])  # a line break, visibly
            cands = "  ".join(f"{t} ({c['probability']:.2f})" for t, c in zip(shown, m["candidates"]))
            print(f"[MASK] at token {m['position']}: {cands}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from attnlab.tasks.compare import compare, format_table

    default = {"digits": "vit,mlp"}.get(args.task) or (
        "transformer,rnn-attention,rnn" if args.task in GENERATED else "encoder,bow,pooled,conv1d,rnn"
    )
    rows = compare(args.task, (args.models or default).split(","), Path(args.out), force=args.force)
    print(format_table(rows))
    print(f"chart: {Path(args.out) / 'compare.png'}")
    return 0


def add_commands(sub, tasks) -> None:
    """Add `train mlm|classify|tag`, `predict` and `compare` to the parser's subcommands."""
    for task, what in (("classify", "a label per text"), ("tag", "a label per token")):
        desc = f"Train a model that predicts {what}, then score it on the test split."
        p = tasks.add_parser(task, help=f"{what}: the encoder or a baseline, on a file or a generated task",
                             description=desc)  # fmt: skip
        p.add_argument("--out", required=True, help="run directory to create")
        p.add_argument("--model", default="encoder", choices=list(MODELS), help="which model (default: encoder)")
        p.add_argument("--preset", default=None, help=f"encoder preset: {', '.join(ENCODER_PRESETS)}")
        p.add_argument("--init", default=None, metavar="RUN", help="start the encoder from a masked-LM run")
        p.add_argument("--word-vectors", default=None, metavar="FILE", help="GloVe or word2vec text file")
        p.add_argument("--freeze-vectors", action="store_true", help="keep the loaded word vectors fixed")
        p.add_argument("--force", action="store_true", help="replace --out if it exists")
        add_config_flags(p, "data", LabeledDataConfig, "data")
        model_classes = tuple(cls for cls, _ in MODELS.values())
        preset = dataclasses.asdict(ENCODER_PRESETS["encoder-tiny"])
        add_model_choice_flags(p, model_classes, SET_BY_DATA, preset, TRAIN_DEFAULTS["encoder"], "encoder")
        p.set_defaults(func=cmd_train_labeled, task=task)
    desc = "Pretrain an encoder: 15%% of word tokens hidden, each predicted from both sides."
    mlm = tasks.add_parser("mlm", help="an encoder by masked-language modelling (BERT's pretraining)",
                           description=desc)  # fmt: skip
    mlm.add_argument("--out", required=True, help="run directory to create")
    mlm.add_argument("--preset", default=None, help=f"{', '.join(ENCODER_PRESETS)} (default: encoder-small)")
    mlm.add_argument("--force", action="store_true", help="replace --out if it exists")
    from attnlab.tasks.mlm import MLM_DATA, MLM_TRAIN

    add_config_flags(mlm, "data", DataConfig, "data", defaults=MLM_DATA)
    preset = dataclasses.asdict(ENCODER_PRESETS["encoder-small"])
    add_config_flags(mlm, "model", EncoderConfig, "model (override the preset)", defaults=preset)
    add_config_flags(mlm, "train", TrainConfig, "training", defaults=MLM_TRAIN)
    mlm.set_defaults(func=cmd_train_mlm)


def add_top_commands(sub) -> None:
    pr = sub.add_parser("predict", help="a classifier's label, a tagger's tags, a masked-LM's [MASK] candidates, "
                        "a translation, an image's class")  # fmt: skip
    pr.add_argument("run", help="run directory (classify, tag, mlm, translate or image)")
    pr.add_argument("text", help='text to read (for a masked-LM run put [MASK] in it: "import [MASK]"); '
                    "for an image run, an image file")  # fmt: skip
    pr.add_argument("--top-k", type=int, default=None, help="candidates per [MASK] (default: 5), classes shown "
                    "for an image (default: 3)")  # fmt: skip
    pr.add_argument("--beam", type=int, default=1, help="translation runs: beam width, 1 = greedy (default: 1)")
    pr.add_argument("--attention", default=None, metavar="FILE.png", help="translation runs: draw the alignment; "
                    "ViT runs: draw [CLS]'s attention to each patch over the image")  # fmt: skip
    pr.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.set_defaults(func=cmd_predict)
    cmp = sub.add_parser("compare", help="train several models on one task with one budget; table and bar chart")
    cmp.add_argument(
        "--task",
        default="sentiment",
        choices=("sentiment", "tagging", *GENERATED, "digits"),
        help="generated task: sentiment, tagging, a translation task, or the digits images (default: sentiment)",
    )
    cmp.add_argument("--models", default=None, help="comma-separated models (default: encoder,bow,pooled,conv1d,rnn; "
                     "translation: transformer,rnn-attention,rnn; digits: vit,mlp)")  # fmt: skip
    cmp.add_argument("--out", default="runs/compare", help="folder for the runs, table and chart")
    cmp.add_argument("--force", action="store_true", help="replace earlier runs in --out")
    cmp.set_defaults(func=cmd_compare)


__all__ = ["Parser", "add_commands", "add_top_commands"]
