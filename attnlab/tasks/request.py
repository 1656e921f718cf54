"""One request: how `attnlab train TASK` turns its settings, wherever each was given, into the one
TrainRequest the engine runs (engine/train.py). `resolve` says the order, once; a task only lends
its values (tuned settings, default data, presets) and its checks (tasks/base.py's hooks).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from attnlab.config import check_types, checked, read_toml
from attnlab.engine.config import TrainConfig
from attnlab.engine.resume import as_given, check_unchanged
from attnlab.engine.train import TrainRequest
from attnlab.errors import AttnlabError
from attnlab.runs.converters import converters_given
from attnlab.tasks.base import Task, TrainOptions

# The settings by section: flags, TOML tables and config.json's sections have the same names.
SECTIONS = ("data", "model", "train", "options", "lora", "quantize")


def resolve(task: Task, opts: TrainOptions, flags: dict[str, dict[str, Any]], saved: dict | None) -> TrainRequest:
    """The request of `attnlab train TASK`: each setting from the highest of, lowest first,

        1. the field's default (the settings dataclass: TrainConfig, the task's data config, ...)
        2. the task's tuned values (task.train_defaults for the model, task.default_data)
        3. the preset (--preset, or the TOML file's top-level preset): the model's fields, and for a
           preset that brings them its training settings (task.preset_training)
        4. the TOML file (--config FILE.toml: tables [data], [model], [train], [options], [lora],
           [quantize], and a top-level preset)
        5. a resumed run's own settings (its config.json, --resume)
        6. the flags given

    `flags`: the settings given on the command line, by section ({field: value}); `saved`: the run's
    config.json on --resume. On --resume a run keeps its model and data (the weights have their
    shape, its examples stay as they were): a flag that would change them is refused by name.
    """
    toml = read_sections(opts.config)
    preset = opts.preset or toml.get("preset")
    model = opts.model or (task.model_of(saved) if saved else task.default_model)
    task.check_given(opts, flags, preset)
    choice = task.models.get(model)  # an unknown name: completed() says so, in one line
    named = None if saved or opts.init else preset or (choice and choice.default_preset)  # a new run's preset
    options = _settings(task.options, toml, saved and saved_options(task, saved), flags, "options")
    return TrainRequest(
        opts.out,
        opts.model,
        _model(task, opts, flags, toml, preset if opts.init else named, saved),
        _train(task, model, named, toml, saved, flags),
        _data(task, toml, saved, flags),
        resume=opts.resume,
        force=opts.force,
        init=opts.init,
        options=options,
        converters=() if saved else _converters(task, toml, flags),
    )


def _converters(task: Task, toml: dict, flags: dict) -> tuple:
    """A new run's converters ([lora] and [quantize]), for a task that takes them."""
    given = {kind: _levels(toml, flags, kind) for kind in ("lora", "quantize")}
    if not task.converters:
        if any(given.values()):
            raise AttnlabError(f"{task.name} trains every weight of its own model: it takes no [lora] or [quantize]")
        return ()
    return converters_given(given["lora"], given["quantize"])


def _levels(toml: dict, flags: dict, section: str, *between: dict | None) -> dict[str, Any]:
    """A section's values: the TOML file's < each of `between` < the flags."""
    return {**toml.get(section, {}), **{k: v for d in between if d for k, v in d.items()}, **flags.get(section, {})}


def _train(task: Task, model: str, preset: str | None, toml: dict, saved: dict | None, flags: dict) -> TrainConfig:
    """TrainConfig's defaults < tuned < the preset's < TOML < the run's own < flags."""
    tuned = {**task.train_defaults(model), **task.preset_training(preset)}
    return checked(TrainConfig, {**tuned, **_levels(toml, flags, "train", saved and saved["train"])}, where="[train]")


def _data(task: Task, toml: dict, saved: dict | None, flags: dict) -> Any:
    """The task's data: its defaults < TOML < flags; on --resume the run's own, of which only the
    fields a task lets change may differ (lm: not its tokens or split)."""
    given = flags.get("data", {})
    if saved is not None:
        fixed = (
            given
            if task.data_fixed_on_resume is None
            else {k: v for k, v in given.items() if k in task.data_fixed_on_resume}
        )
        check_unchanged("data", task.data_config, saved["data"], as_given(fixed), task.kept_on_resume)
    values = _levels(toml, flags, "data", saved and saved["data"])
    return checked(task.data_config, {**asdict(task.default_data()), **values}, where="[data]")


def _model(task: Task, opts: TrainOptions, flags: dict, toml: dict, preset: str | None, saved: dict | None) -> dict:
    """The model's fields to override (the task builds the config in prepare): the preset's name and
    the fields given, or --init's (task.from_init); on --resume the run's own (those given checked
    equal to them)."""
    given = flags.get("model", {})
    if saved is not None:
        task.check_resumed(saved, opts.model, opts.preset, given)
        return {}
    fields_ = _levels(toml, flags, "model")
    if opts.init is not None:
        return task.from_init(opts.init, fields_, preset)
    return {**({"preset": preset} if preset else {}), **fields_}


def _settings(cls: type, toml: dict, saved: dict | None, flags: dict, section: str) -> Any:
    """A task's own options: their defaults < TOML < the run's own < flags, checked."""
    options = checked(cls, _levels(toml, flags, section, saved), where=f"[{section}]")
    check_types(options)
    for f in fields(options):
        least = f.metadata.get("at_least")
        if least is not None and getattr(options, f.name) < least:
            raise AttnlabError(f"--{f.name.replace('_', '-')} must be at least {least}, got {getattr(options, f.name)}")
    return options


def saved_options(task: Task, saved: dict) -> dict[str, Any]:
    """A resumed run's own options: config.json's options, or for a run written before they were
    recorded (issue 52) those its task section kept under the same names (beta, group, ...)."""
    names = {f.name for f in fields(task.options)}
    recorded = saved.get("options") or saved.get("task") or {}
    return {k: v for k, v in recorded.items() if k in names}


def read_sections(path: str | None) -> dict[str, Any]:
    """A TOML file's tables (SECTIONS) and top-level preset ({} without a file)."""
    toml = read_toml(path) if path else {}
    unknown = set(toml) - set(SECTIONS) - {"preset"}
    if unknown or not all(isinstance(toml.get(name, {}), dict) for name in SECTIONS):
        tables = ", ".join(f"[{s}]" for s in SECTIONS)
        raise AttnlabError(f"{path}: use the tables {tables} (and a top-level preset)")
    return toml
