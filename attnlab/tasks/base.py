"""The Task: what a kind of run is, and how it trains.

A task is three small parts, each read on its own:
    Task (here)          what it trains: its models and data, its tuned settings, its slow set-up,
                         the batches and model of each run, its test scores at the end
    RunKind (runs/kind.py)  what a trained run of it does: predict, evaluate, show its attention
    Printer (printer.py) how the command line prints what the other two return
`TASKS` (tasks/__init__.py) holds one of each; `task_of(config)` says which task wrote a run. A new
task is one subclass in its own file plus one registry line; `attnlab train NAME` and its flags are
generated from the task's option dataclasses (`options`, `data_config`, its models' configs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.config import option
from attnlab.engine.resume import as_given, check_unchanged
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors, write_json
from attnlab.runs.folder import WEIGHTS, check_run_dir, read_run_config
from attnlab.runs.kind import RunKind, kind_of
from attnlab.runs.marker import record
from attnlab.runtime.distributed import Dist
from attnlab.tasks.printer import Printer


@dataclass(frozen=True)
class ModelChoice:
    """A model a task can train: the family stored in config.json, its config class, the settings
    the task fixes for it (e.g. the RNN without attention), and its named presets, if any."""

    family: str
    config: type
    fixed: tuple[tuple[str, Any], ...] = ()
    presets: dict[str, Any] | None = None
    default_preset: str | None = None


@dataclass
class TrainOptions:
    """What `attnlab train TASK` takes beside its settings (the data, model, training settings and
    the task's own options, each a dataclass of its own)."""

    out: str = option("", "run directory to create (or continue with --resume)", required=True)
    resume: bool = option(False, "continue the run in --out from its last checkpoint")
    force: bool = option(
        False, "replace --out if it is an attnlab run (it has attnlab.json); other folders are refused"
    )
    init: str | None = option(None, "start from this run's weights and tokenizer", metavar="RUN")
    model: str | None = option(None, "which model")
    preset: str | None = option(None, "a named model size")
    config: str | None = option(
        None,
        "settings in a TOML file: [data], [model], [train], [options] tables ([lora], [quantize] where taken)",
        metavar="FILE.toml",
    )


@dataclass
class NoOptions:
    """The own options of a task that has none."""


class Task(RunKind, Printer):
    """Base class: every hook a task may have, with the answer most tasks give."""

    help: str = ""  # one line for `attnlab train --help`
    description: str = ""  # the paragraph of `attnlab train NAME --help`
    models: dict[str, ModelChoice] = {}
    default_model: str = ""
    data_config: type = object
    options: type = NoOptions  # the task's own options (a dataclass; config.json records them)
    preset_help: str = ""  # --preset's help, where the task says more than the presets' names
    data_fixed_on_resume: tuple[str, ...] | None = None  # data fields --resume keeps (None: every one)
    kept_on_resume: str = "the run's examples and labels stay as they were"  # why they are kept
    converters: tuple[str, ...] = ()  # the converters it takes (runs/converters.py): flags and [tables]
    # Own options a resumed run cannot change without changing what it is (name -> why); the others
    # follow the flags given on --resume, over the run's own.
    fixed_options: dict[str, str] = {}
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
        family = config.get("family")
        for name, m in self.models.items():
            if m.family == family:
                return name
        raise AttnlabError(
            f"the run's config.json names the model family {family!r}, which is not one of the "
            f"{self.name} task's ({', '.join(sorted({m.family for m in self.models.values()}))})"
        )

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
            record(s.run, "eval.json")
            write_json(s.run / "eval.json", {"split": "test", **test})
            self.draw_test(s, prepared, req, test)
        return {"test": test}

    # ---- the request (tasks/request.py resolves it; these lend a task's values and checks) ----------
    def preset_training(self, preset: str | None) -> dict[str, Any]:
        """The training settings a new run's preset brings (over the tuned ones); most bring none."""
        return {}

    def check_given(self, opts: TrainOptions, flags: dict[str, dict[str, Any]], preset: str | None) -> None:
        """Refuse, in one line, settings given that this task cannot take together (before any work)."""

    def from_init(self, init: str, fields: dict[str, Any], preset: str | None) -> dict[str, Any]:
        """A new run's model overrides when it starts from --init (model_fields reads the init run's)."""
        return {**({"preset": preset} if preset else {}), **fields}

    def older_options(self, saved: dict[str, Any]) -> dict[str, Any]:
        """What a run stored before some of its options were recorded ran with (its config.json)."""
        return {}

    def normal_options(self, options: Any) -> Any:
        """The task's options as a run keeps them (ppo: its reward run's folder made absolute)."""
        return options

    def check_options_resumed(self, saved: dict[str, Any], options: Any) -> None:
        """On --resume, the options that cannot change (fixed_options) equal to the run's own
        (`saved`: config.json's), else one line naming the flag and the run's value."""
        for name, why in self.fixed_options.items():
            given = {name: (f"--{name.replace('_', '-')}", getattr(options, name))}
            check_unchanged(self.name, self.options, saved, given, why)

    def complete(self, req: TrainRequest) -> TrainRequest:
        """The resolved request with what the engine needs resolved once (adapting tasks: the --init
        model as a run folder); most need nothing."""
        return req

    def recorded_options(self, req: TrainRequest) -> dict[str, Any]:
        """config.json's "options": the task's own options, for --resume (a Python function, which
        config.json cannot hold, is left out: the task records its name)."""
        return {k: v for k, v in asdict(req.options).items() if not callable(v)}

    def check_resumed(
        self, saved: dict[str, Any], model: str | None, preset: str | None, flags: dict[str, Any]
    ) -> None:
        """--resume given the model settings of the command that started the run: those equal to the
        run's own pass (that command runs again with --resume appended); a change is refused by name."""
        name = self.model_of(saved)
        if model is not None and model != name:
            raise AttnlabError(
                f"--model {model} differs from the run's {name}: model settings cannot change "
                f"when resuming (the weights have their shape); give --model {name} or leave it "
                "out"
            )
        choice = self.models[name]
        given = as_given(flags)
        if preset is not None:
            given = {**self.preset_fields_given(saved, choice, preset), **given}
        check_unchanged("model", choice.config, saved["model"], given, "the weights have their shape")

    def preset_fields_given(self, saved: dict[str, Any], choice: ModelChoice, preset: str) -> dict[str, Any]:
        """What a --preset given on --resume says of the model: nothing more to compare when the run
        recorded its preset (the same name passes); for a run that did not (made from Python, or
        before presets were recorded), the preset's fields but those the data decides."""
        recorded = saved.get("preset")
        if recorded is not None:
            if preset != recorded:
                raise AttnlabError(
                    f"--preset {preset} differs from the run's {recorded}: model settings cannot change "
                    f"when resuming (the weights have their shape); give --preset {recorded} or "
                    "leave it out"
                )
            return {}
        if not choice.presets or preset not in choice.presets:
            known = f"; choose from {', '.join(choice.presets)}" if choice.presets else ""
            raise AttnlabError(f"--preset {preset} does not apply to this run's model{known}")
        derived = self.set_by_data | {k for k, _ in choice.fixed}
        fields = {k: v for k, v in asdict(choice.presets[preset]).items() if k not in derived}
        return as_given(fields, f"--preset {preset}")


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
