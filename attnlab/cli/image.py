"""Command-line commands of image classification: train image, and what predict and eval do with image runs.

Model flags are the union of the ViT's and the MLP's config fields; a flag that does not belong
to the chosen --model is a one-line error. Training and data flags default to the settings tuned
for each model (tasks/image.py TRAIN_DEFAULTS), then the user's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from attnlab.cli.main import (
    add_config_flags,
    add_model_choice_flags,
    checked,
    flags_of,
    model_overrides,
    speaks,
    train_config,
)
from attnlab.data.images import ImageDataConfig
from attnlab.errors import AttnlabError
from attnlab.models.mlp import MLPConfig
from attnlab.models.vit import PRESETS, ViTConfig

SET_BY_DATA = {"image_size", "image_width", "channels", "n_labels", "context"}


def cmd_train_image(args: argparse.Namespace) -> int:
    from attnlab.tasks.image import TRAIN_DEFAULTS, train_image

    if args.resume and (flags_of(args, "model") or flags_of(args, "data") or args.preset):
        raise AttnlabError("model and data settings cannot change when resuming (the weights and split are fixed)")
    if args.resume:  # the run's own training settings, with the flags given now on top
        from attnlab.engine.rundir import check_run_dir, read_run_config

        train, data = train_config(args, read_run_config(check_run_dir(args.out))["train"]), None
    else:
        train = train_config(args, TRAIN_DEFAULTS[args.model])
        data = checked(ImageDataConfig, flags_of(args, "data"), where="[data]")
    result = train_image(args.out, args.model, model_overrides(args), train, data, force=args.force,
                         resume=args.resume)  # fmt: skip
    if speaks():
        t = result["test"]
        print(f"test: accuracy {t['accuracy']:.2%}, macro-F1 {t['macro_f1']:.4f} "
              f"({result['parameters']:,} parameters, {result['train_seconds']:.0f} s); pictures in {args.out}. "
              f"Try: attnlab predict {args.out} IMAGE.png --attention overlay.png")  # fmt: skip
    return 0


def print_image_prediction(run, args: argparse.Namespace) -> int:
    from attnlab.tasks.image import image_attention, predict_image

    result = predict_image(run, args.text, args.top_k or 3)
    if args.attention:
        image_attention(run, args.text, args.attention)
        result["attention"] = args.attention
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['label']}  ({result['probability']:.3f})")
    print("  top: " + "  ".join(f"{r['label']} {r['probability']:.3f}" for r in result["top"]))
    if args.attention:
        print(f"attention: {args.attention}")
    return 0


def eval_image(run, args: argparse.Namespace) -> int:
    from attnlab.tasks.image import evaluate_image

    plot = args.confusion or str(Path(args.run) / "eval_confusion.png")
    r = evaluate_image(run, args.data, args.split or "test", plot)
    if args.json:
        print(json.dumps({"run": str(args.run), **r, "confusion_png": plot}))
        return 0
    print(f"{r['data']} ({r['split']}): {r['examples']:,} images")
    print(f"  accuracy  {r['accuracy']:.4f}\n  macro-F1  {r['macro_f1']:.4f}")
    for name, c in r["per_class"].items():
        print(f"  {name:<12} precision {c['precision']:.3f}  recall {c['recall']:.3f}  support {c['support']}")
    print(f"confusion matrix: {plot}")
    return 0


def add_commands(tasks) -> None:
    """Add `train image` to the `train` subcommands."""
    from attnlab.tasks.image import MODELS, TRAIN_DEFAULTS

    desc = ("Train an image classifier on digits (built in), a folder with one sub-folder per class, "
            "or a .npz; then score its test split and draw confusion.png, predictions.png and, "
            "for the ViT, attention.png.")  # fmt: skip
    p = tasks.add_parser("image", help="images: a Vision Transformer or an MLP on the pixels", description=desc)
    p.add_argument("--out", required=True, help="run directory to create (or continue with --resume)")
    p.add_argument("--model", default="vit", choices=list(MODELS), help="vit or mlp (default: vit)")
    p.add_argument("--preset", default=None, help=f"ViT preset: {', '.join(PRESETS)} (default: vit-nano; "
                   "the small presets pick a patch size that fits the images)")  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_config_flags(p, "data", ImageDataConfig, "data")
    preset = dataclasses.asdict(PRESETS["vit-nano"])
    add_model_choice_flags(p, (ViTConfig, MLPConfig), SET_BY_DATA, preset, TRAIN_DEFAULTS["vit"], "ViT")
    p.set_defaults(func=cmd_train_image)
