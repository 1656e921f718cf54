"""The Task: what a kind of run is, asked by every floor instead of probing config strings.

A task knows the model families it trains, its tuned training settings, how it prepares data
(through the shared engine), how a trained run predicts, evaluates and shows its attention, its
command-line flags and how it prints results. `TASKS` (tasks/__init__.py) holds one of each;
`task_of(config)` says which task a run directory belongs to. A new task is one subclass in its
own file plus one registry line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.config import add_config_flags, checked, flags_of
from attnlab.engine.config import TrainConfig
from attnlab.engine.loop import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors, write_json
from attnlab.runs.folder import WEIGHTS, check_run_dir, read_run_config
from attnlab.runs.kind import RunKind, kind_of
from attnlab.runtime.distributed import Dist


@dataclass(frozen=True)
class ModelChoice:
    """A model a task can train: the family stored in config.json, its config class, and the
    settings the task fixes for it (e.g. the RNN without attention)."""

    family: str
    config: type
    fixed: tuple[tuple[str, Any], ...] = ()


class Task(RunKind):
    """Base class: every hook a task may have, with the answer most tasks give. What its trained
    runs do (predict, evaluate, views) is the RunKind part (runs/kind.py)."""

    help: str = ""  # one line for `attnlab train --help`
    description: str = ""  # the paragraph of `attnlab train NAME --help`
    models: dict[str, ModelChoice] = {}
    default_model: str = ""
    data_config: type = object
    init_help: str = "start from this run's weights and tokenizer (a run of the same task); fine-tunes on --data"
    tuned: dict[str, dict[str, Any]] = {}  # model name -> its tuned training settings (read-only)
    # Model-config fields that the data decides: never flags.
    set_by_data: frozenset[str] = frozenset()

    # ---- training -----------------------------------------------------------------------------
    def train_defaults(self, model: str) -> dict[str, Any]:
        """Training settings tuned for this task and model (a copy: the caller may change it)."""
        return dict(self.tuned.get(model, {}))

    def default_data(self) -> Any:
        return self.data_config()

    def model_of(self, config: dict[str, Any]) -> str:
        """The model name (one of self.models) of a saved run's config.json."""
        return next(name for name, m in self.models.items() if m.family == config["family"])

    def model_fields(self, req: TrainRequest) -> dict[str, Any]:
        """The model-config fields to build from: the request's, or for a new run with --init the init
        run's own (a run of this task), of which only dropout may be changed."""
        if req.init is None or req.resume:
            return dict(req.model_config)
        config = read_run_config(check_run_dir(req.init))
        if kind_of(config) is not self:
            raise AttnlabError(f"--init {req.init} is a {kind_of(config).name} run: it needs a {self.name} run")
        return {**config["model"], **{k: v for k, v in req.model_config.items() if k == "dropout"}}

    def setup(self, req: TrainRequest) -> dict[str, str]:
        """Rank 0, new runs only: slow work that may fail (tokenizers, caches), before the run
        directory is replaced; returns the files to write into it (name -> text)."""
        return {}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        """Every process, new and resumed runs: batches, the model builder and config.json."""
        raise NotImplementedError

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        """After training: the scores of the test split, or None for a task that has none."""
        return None

    def draw_test(self, s: Session, prepared: Prepared, req: TrainRequest, test: dict[str, Any]) -> None:
        """Pictures of the test split in the run directory (rank 0)."""

    def finish(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]:
        """After training: the test scores into eval.json, and the task's pictures of them."""
        test = self.test_scores(s, prepared, req)
        if test is None:
            return {}
        if s.dist.main:
            write_json(s.run / "eval.json", {"split": "test", **test})
            self.draw_test(s, prepared, req, test)
        return {"test": test}

    def test_line(self, test: dict[str, Any]) -> str:
        """The test scores in one line."""
        return ""

    def next_step(self, out: str) -> str:
        """What to try with the trained run, with the punctuation that leads to it."""
        return "."

    def result_line(self, result: dict[str, Any], out: str) -> str:
        """What `attnlab train` prints when done."""
        if "test" in result:
            return (f"{self.test_line(result['test'])} ({result['parameters']:,} parameters, "
                    f"{result['train_seconds']:.0f} s){self.next_step(out)}")  # fmt: skip
        val = "n/a" if result["val_loss"] is None else f"{result['val_loss']:.4f}"
        return f"done: step {result['step']}, validation loss {val}{self.next_step(out)}"

    # ---- printing -----------------------------------------------------------------------------
    def show_prediction(self, result: dict[str, Any]) -> str:
        raise NotImplementedError

    def show_evaluation(self, result: dict[str, Any]) -> str:
        raise NotImplementedError

    # ---- command line -------------------------------------------------------------------------
    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """The flags of `attnlab train NAME` beyond --out, --force, --resume and --init: by default
        --model (when there is a choice), and one flag per field of the data, model and training configs."""
        if len(self.models) > 1:
            parser.add_argument("--model", default=self.default_model, choices=list(self.models),
                                help=f"which model (default: {self.default_model})")  # fmt: skip
        add_config_flags(parser, "data", self.data_config, "data")
        add_model_choice_flags(parser, self, {}, self.default_model)

    def request(self, args: argparse.Namespace, train: TrainConfig, saved: dict | None) -> TrainRequest:
        """A TrainRequest from parsed flags; `train` is already merged (tuned or saved < flags)."""
        model = getattr(args, "model", None)
        overrides = flags_of(args, "model")
        if getattr(args, "preset", None):
            overrides["preset"] = args.preset
        if saved is not None and (overrides or flags_of(args, "data")):
            raise AttnlabError("model and data settings cannot change when resuming (the weights and data are fixed)")
        data = None if saved is not None else checked(self.data_config, flags_of(args, "data"), where="[data]")
        return TrainRequest(args.out, model, overrides, train, data, resume=args.resume, force=args.force,
                            init=getattr(args, "init", None))  # fmt: skip


def add_model_choice_flags(parser: argparse.ArgumentParser, task: Task, preset: dict[str, Any], what: str) -> None:
    """The model and training flags of a task that trains one of several models: one flag per field
    of any model's config (its help naming the class), with the default model's preset and tuned
    training settings shown as defaults."""
    classes = tuple(dict.fromkeys(m.config for m in task.models.values()))
    title = "model (fields of the chosen --model; the class each belongs to in brackets)"
    add_config_flags(parser, "model", classes, title, task.set_by_data, defaults=preset)
    title = f"training (tuned per --model; defaults shown: the {what}'s)"
    add_config_flags(parser, "train", TrainConfig, title, defaults=task.train_defaults(task.default_model))


def load_body(model: nn.Module, init: str | Path, head: tuple[str, ...]) -> None:
    """Start `model` from the weights of the run `init` but its head (names starting with `head`),
    which is new: another task or other labels. Every other weight must fit."""
    tensors, _ = read_safetensors(Path(init) / WEIGHTS)
    body = {k: v for k, v in tensors.items() if not k.startswith(head)}
    try:
        missing, _ = model.load_state_dict(body, strict=False)
    except RuntimeError as e:  # shapes that do not fit
        raise AttnlabError(f"--init {init}: weights do not fit ({str(e).splitlines()[-1].strip()})") from None
    if any(not k.startswith(head) for k in missing):
        raise AttnlabError(f"--init {init}: weights do not fit this model (missing {missing[0]})")
