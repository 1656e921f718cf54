"""The `attnlab` command: a thin layer over the library.

Training flags are generated from the config dataclasses (GPTConfig, TrainConfig, DataConfig,
GenerateConfig): their fields are the flags, their metadata the help. A TOML file given with
--config sets the same fields in [model], [train] and [data] tables; flags override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from typing import Any

from attnlab.config import field_type, from_dict, parse_value, read_toml
from attnlab.data import DataConfig
from attnlab.errors import AttnlabError
from attnlab.tasks.lm import SPLITS
from attnlab.decoding.sampling import GenerateConfig
from attnlab.models.gpt import PRESETS, GPTConfig
from attnlab.models.size import ClusterConfig
from attnlab.engine.loop import TrainConfig

SECTIONS = {"model": GPTConfig, "train": TrainConfig, "data": DataConfig}
NOT_FLAGS = {"model": {"vocab_size"}}  # set from the tokenizer, not by hand
FIXED_ON_RESUME = ("tokenizer", "vocab_size", "val_fraction")  # a resumed run keeps its tokens and split


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see: {self.prog} --help)\n")


def add_config_flags(
    parser: argparse.ArgumentParser,
    section: str,
    cls: type | tuple[type, ...],
    title: str,
    skip: set[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
) -> None:
    """One --flag per dataclass field; defaults stay None so we know what the user set. Given
    several classes, one flag per field name, its help naming the class it comes from. `defaults`:
    the values the command uses in place of the fields' own (a preset, tuned settings), for --help."""
    group = parser.add_argument_group(title)
    classes = cls if isinstance(cls, tuple) else (cls,)
    seen = set(skip) | NOT_FLAGS.get(section, set())
    for c in classes:
        for f in dataclasses.fields(c):
            if f.name not in seen:
                seen.add(f.name)
                _add_flag(group, section, c, f, f" [{c.__name__}]" if len(classes) > 1 else "", defaults or {})


def _add_flag(group, section: str, cls: type, f: dataclasses.Field, where: str, defaults: dict) -> None:
    base, _ = field_type(cls, f)
    default = f.default if f.default is not dataclasses.MISSING else None
    default = defaults.get(f.name, default)
    kw: dict[str, Any] = {
        "dest": f"{section}__{f.name}",
        "default": None,
        "help": f"{f.metadata.get('help', '')} (default: {default}){where}",
    }
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["metavar"] = f.name.upper() if not f.metadata.get("choices") else "{" + ",".join(f.metadata["choices"]) + "}"
    group.add_argument("--" + f.name.replace("_", "-"), **kw)


def add_model_choice_flags(
    parser: argparse.ArgumentParser,
    classes: tuple[type, ...],
    skip: set[str],
    preset: dict[str, Any],
    train_defaults: dict[str, Any],
    default_model: str,
) -> None:
    """The model and training flags of a command that trains one of several models: one flag per
    field of any model's config (its help naming the class), with the default model's preset and
    tuned training settings shown as defaults."""
    title = "model (fields of the chosen --model; the class each belongs to in brackets)"
    add_config_flags(parser, "model", classes, title, skip, defaults=preset)
    title = f"training (tuned per --model; defaults shown: the {default_model}'s)"
    add_config_flags(parser, "train", TrainConfig, title, defaults=train_defaults)


def train_config(args: argparse.Namespace, tuned: dict[str, Any]) -> TrainConfig:
    """The training settings: those tuned for the task and model, then the user's flags."""
    return checked(TrainConfig, {**tuned, **flags_of(args, "train")}, where="[train]")


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The --model flags the user set, with --preset among them when given."""
    overrides = flags_of(args, "model")
    if args.preset:
        overrides["preset"] = args.preset
    return overrides


def speaks() -> bool:
    """Under torchrun, one process prints results."""
    return os.environ.get("RANK", "0") == "0"


def flags_of(args: argparse.Namespace, section: str) -> dict[str, Any]:
    prefix = section + "__"
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}


def checked(cls: type, values: dict[str, Any], where: str) -> Any:
    """from_dict, with a config's own validation errors turned into one-line user errors."""
    try:
        return from_dict(cls, values, where=where)
    except ValueError as e:
        raise AttnlabError(f"{where}: {e}") from None


def build_configs(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig, DataConfig]:
    """defaults < preset < TOML file < command-line flags (resume: the run's own settings)."""
    toml = read_toml(args.config) if args.config else {}
    unknown = set(toml) - set(SECTIONS) - {"preset"}
    if unknown or not all(isinstance(toml.get(name, {}), dict) for name in SECTIONS):
        raise AttnlabError(f"{args.config}: use the tables [model], [train], [data] (and a top-level preset)")
    base: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    if args.resume:
        from attnlab.engine.rundir import check_run_dir, read_run_config

        saved = read_run_config(check_run_dir(args.out))
        base = {name: dict(saved[name]) for name in SECTIONS}
        if toml.get("model") or flags_of(args, "model") or args.preset:
            raise AttnlabError("model settings cannot change when resuming (the weights have their shape)")
        for k, v in {**toml.get("data", {}), **flags_of(args, "data")}.items():
            if k in ("tokenizer", "vocab_size", "val_fraction") and parse_value(DataConfig, k, v) != base["data"].get(
                k
            ):
                raise AttnlabError(f"{k} cannot change when resuming (the run's tokens and split stay as they were)")
    elif args.init:
        base["model"] = init_base(args, toml)
    else:
        preset = args.preset or toml.get("preset", "gpt-nano")
        if preset not in PRESETS:
            raise AttnlabError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        base["model"] = dataclasses.asdict(PRESETS[preset])
    configs = []
    for name, cls in SECTIONS.items():
        values = {**base[name], **toml.get(name, {})}
        values.update({k: parse_value(cls, k, v) for k, v in flags_of(args, name).items()})
        configs.append(checked(cls, values, where=f"[{name}]"))
    return tuple(configs)  # type: ignore[return-value]


def init_base(args: argparse.Namespace, toml: dict[str, Any]) -> dict[str, Any]:
    """With --init the model and tokenizer are the init run's: only dropout may be set."""
    from attnlab.engine.loop import init_model

    model = {**toml.get("model", {}), **flags_of(args, "model")}
    data = {**toml.get("data", {}), **flags_of(args, "data")}
    clash = [k for k in model if k != "dropout"] + [k for k in data if k in ("tokenizer", "vocab_size")]
    clash += ["preset"] if args.preset or "preset" in toml else []
    if clash:
        flags = ", ".join("--" + k.replace("_", "-") for k in clash)
        raise AttnlabError(
            f"--init takes the model and tokenizer of {args.init}: drop {flags} (only --dropout may change)"
        )
    return dataclasses.asdict(init_model(args.init))


# ---- commands ------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from attnlab.engine.loop import train

    model, tcfg, data = build_configs(args)
    result = train(args.out, model, tcfg, data, resume=args.resume, force=args.force, init=args.init)
    val = "n/a" if result["val_loss"] is None else f"{result['val_loss']:.4f}"
    if speaks():
        print(f"done: step {result['step']}, validation loss {val}. Try: attnlab sample {args.out}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from attnlab.decoding.sampling import stream_text
    from attnlab.run import load

    gen = checked(GenerateConfig, flags_of(args, "gen"), where="generation")
    run = load(args.run, device=args.device)
    if run.config["family"] != "gpt":
        what = run.config.get("task", {}).get("kind") or run.config["family"]
        raise AttnlabError(f"{args.run} is not a language model run (it is {what}): attnlab sample needs a gpt run")
    for i in range(args.num_samples):
        if i:
            print("\n" + "-" * 40)
        print(gen.prompt, end="", flush=True)
        seed = None if gen.seed is None else gen.seed + i
        for piece in stream_text(run.model, run.tokenizer, **{**dataclasses.asdict(gen), "seed": seed}):
            print(piece, end="", flush=True)
        print()
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from attnlab.tasks.lm import evaluate
    from attnlab.run import load

    run = load(args.run, device=args.device)
    kind = run.config.get("task", {}).get("kind")
    if kind == "translate":
        from attnlab.cli.translate import eval_translation

        return eval_translation(run, args)
    if kind == "image":
        from attnlab.cli.image import eval_image

        return eval_image(run, args)
    if run.config["family"] != "gpt":
        return _eval_labeled(run, args)
    if args.split == "test":
        raise AttnlabError("a language model's data has a train and a val split: use --split val, train or all")
    data = args.data or run.config["data"]["data"]
    glob = args.glob or (run.config["data"].get("glob", "*") if not args.data else "*")
    result = evaluate(run, data, glob, args.split or "val", args.max_tokens, progress=not args.json)
    if args.json:
        print(json.dumps({"run": str(args.run), **result}))
    else:
        print(f"{result['data']} ({result['split']}): {result['tokens']:,} tokens, {result['characters']:,} characters")
        print(f"  loss            {result['loss']:.4f} nats/token")
        print(f"  perplexity      {result['perplexity']:.3f}")
        print(f"  bits per char   {result['bits_per_char']:.4f}")
    return 0


def _eval_labeled(run, args: argparse.Namespace) -> int:
    from attnlab.tasks.labeled import evaluate_labeled

    if run.config.get("task", {}).get("kind") not in ("classify", "tag"):
        raise AttnlabError(f'{args.run} is a masked-LM run: try attnlab predict {args.run} "... [MASK] ..."')
    result = evaluate_labeled(run, args.data, args.split or "test")
    if args.json:
        print(json.dumps({"run": str(args.run), **result}))
        return 0
    print(f"{result['data']} ({result['split']}): {result['examples']:,} examples")
    print(f"  accuracy  {result['accuracy']:.4f}\n  macro-F1  {result['macro_f1']:.4f}")
    for name, c in result["per_class"].items():
        print(f"  {name:<12} precision {c['precision']:.3f}  recall {c['recall']:.3f}  support {c['support']}")
    return 0


def cmd_size(args: argparse.Namespace) -> int:
    from attnlab.models.size import ClusterConfig, cluster_estimate, estimate, format_cluster, format_estimate, format_table

    names = list(PRESETS) if args.preset == "all" else [args.preset]
    for name in names:
        if name not in PRESETS:
            raise AttnlabError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)} or all")
    cluster = checked(ClusterConfig, flags_of(args, "cluster"), where="cluster")
    results = [estimate(PRESETS[n], n) for n in names]
    for e in results:
        e["cluster"] = cluster_estimate(e, cluster)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    elif len(results) > 1:
        print(format_table(results))
    else:
        print(format_estimate(results[0]) + "\n" + format_cluster(results[0], results[0]["cluster"]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from attnlab.cli.demo import run_demo

    run_demo(args.out, args.max_steps)
    return 0


# ---- parser --------------------------------------------------------------------------------


def build_parser() -> Parser:
    p = Parser(prog="attnlab", description="Build, train, sample and inspect Transformers.")
    from attnlab import __version__

    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="train gpt-nano on Python's standard library (~2 min on a CPU), then sample")
    demo.add_argument("--out", default="runs/demo", help="run directory (a free name is picked if it exists)")
    demo.add_argument("--max-steps", type=int, default=None, help="train for this many steps instead")
    demo.set_defaults(func=cmd_demo)

    train = sub.add_parser("train", help="train a model")
    tasks = train.add_subparsers(dest="task", metavar="TASK", parser_class=Parser)
    tasks.required = True
    lm = tasks.add_parser(
        "lm",
        help="a GPT language model on text (next-token prediction)",
        description="Train a GPT on a text file, a folder, or the built-in 'stdlib' corpus.",
    )
    lm.add_argument("--out", required=True, help="run directory to create (or continue with --resume)")
    lm.add_argument("--preset", default=None, help=f"model preset: {', '.join(PRESETS)} (default: gpt-nano)")
    lm.add_argument("--config", default=None, metavar="FILE.toml", help="settings in [model], [train], [data] tables")
    lm.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    lm.add_argument("--force", action="store_true", help="replace --out if it exists")
    lm.add_argument("--init", default=None, metavar="RUN", help="start from this GPT run's weights and tokenizer "
                    "(e.g. one converted from HuggingFace); fine-tunes on --data")  # fmt: skip
    add_config_flags(lm, "data", DataConfig, "data")
    add_config_flags(lm, "model", GPTConfig, "model (override the preset)")
    add_config_flags(lm, "train", TrainConfig, "training")
    lm.set_defaults(func=cmd_train)
    from attnlab.cli.encoder import add_commands, add_top_commands

    add_commands(sub, tasks)
    add_top_commands(sub)
    from attnlab.cli import translate as cli_translate

    cli_translate.add_commands(sub, tasks)
    from attnlab.cli import convert as cli_convert
    from attnlab.cli import image as cli_image
    from attnlab.cli import inspect as cli_inspect

    cli_image.add_commands(tasks)
    cli_inspect.add_commands(sub)
    cli_convert.add_commands(sub)

    sample = sub.add_parser("sample", help="generate text from a trained run")
    sample.add_argument("run", help="run directory")
    sample.add_argument("--num-samples", type=int, default=1, help="how many samples (default: 1)")
    sample.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    add_config_flags(sample, "gen", GenerateConfig, "generation")
    sample.set_defaults(func=cmd_sample)

    ev = sub.add_parser("eval", help="a language model's loss and bits per character, a classifier's accuracy, "
                        "a translation's BLEU, an image model's accuracy")  # fmt: skip
    ev.add_argument("run", help="run directory")
    ev.add_argument("--data", default=None, help="file, folder or stdlib; image runs: digits, a folder of class "
                    "sub-folders or a .npz, scored whole (default: the run's own data)")  # fmt: skip
    ev.add_argument("--glob", default=None, help="files of a folder to read (default: the run's, or *)")
    ev.add_argument(
        "--split",
        default=None,
        choices=(*SPLITS, "test"),
        help="held-out part (same split as training), training part, or all (default: val; "
        "classifiers and taggers: test)",
    )
    ev.add_argument("--max-tokens", type=int, default=None, help="evaluate at most this many tokens")
    ev.add_argument(
        "--confusion",
        default=None,
        metavar="FILE.png",
        help="image runs: where to draw the confusion matrix (default: RUN/eval_confusion.png)",
    )
    ev.add_argument("--beam", type=int, default=1, help="translation runs: beam width, 1 = greedy (default: 1)")
    ev.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_eval)

    size = sub.add_parser("size", help="parameters, FLOPs per token and memory of a preset")
    size.add_argument("--preset", required=True, help=f"{', '.join(PRESETS)}, or all")
    size.add_argument("--json", action="store_true", help="print JSON")
    add_config_flags(size, "cluster", ClusterConfig, "planning a training run")
    size.set_defaults(func=cmd_size)
    return p


def main(argv: list[str] | None = None) -> int:
    # Library warnings (e.g. a prompt cropped to the context) as one plain line.
    warnings.formatwarning = lambda message, *args, **kwargs: f"attnlab: warning: {message}\n"
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AttnlabError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnlab sample RUN | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # unreadable data, unwritable run or cache directory, disk full, ...
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
