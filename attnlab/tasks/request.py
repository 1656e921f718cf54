"""One request: how `attnlab train TASK` and `attnlab.train(..., task=TASK)` turn their settings,
wherever each was given, into the one TrainRequest the engine runs (engine/train.py). `resolve` says
the order, once; a task only lends its values (tuned settings, default data, presets) and its checks
(tasks/base.py's hooks). The command line's flags and Python's arguments are the same sections
(`requested` reads a resumed run's config.json; `python_request` maps train()'s arguments).
"""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from attnlab.config import check_types, checked, read_toml
from attnlab.engine.config import TrainConfig
from attnlab.engine.resume import as_given, check_unchanged
from attnlab.engine.train import TrainRequest, resumed
from attnlab.errors import AttnlabError
from attnlab.runs.converters import CONVERTERS, converters_given, converters_of
from attnlab.runs.folder import check_resumable, read_run_config
from attnlab.tasks.base import Task, TrainOptions

# The settings by section: flags, TOML tables and config.json's sections have the same names.
SECTIONS = ("data", "model", "train", "options", "lora", "quantize")


def resolve(task: Task, opts: TrainOptions, flags: dict[str, dict[str, Any]], saved: dict | None) -> TrainRequest:
    """The request of `attnlab train TASK` (and of attnlab.train): each setting from the highest of,
    lowest first,

        1. the field's default (the settings dataclass: TrainConfig, the task's data config, ...)
        2. the task's tuned values (task.train_defaults for the model, task.default_data)
        3. the preset (--preset, or the TOML file's top-level preset): the model's fields, and for a
           preset that brings them its training settings (task.preset_training)
        4. the TOML file (--config FILE.toml: tables [data], [model], [train], [options], [lora],
           [quantize], and a top-level preset)
        5. a resumed run's own settings (its config.json, --resume)
        6. the flags given

    `flags`: the settings given on the command line (or to attnlab.train), by section ({field:
    value}); `saved`: the run's config.json on --resume. On --resume a run keeps its model and data
    (the weights have their shape, its examples stay as they were), and the options its task cannot
    change mid-run (task.fixed_options): a flag that would change them is refused by name.
    """
    toml = read_sections(opts.config)
    preset = opts.preset or toml.get("preset")
    model = opts.model or (task.model_of(saved) if saved else task.default_model)
    if model not in task.models:
        raise AttnlabError(f"unknown model {model!r}; choose from {', '.join(task.models)}")
    task.check_given(opts, flags, preset)
    fresh = not (saved or opts.init or _whole(task, model, toml, flags))
    named = (preset or task.models[model].default_preset) if fresh else None  # a new run's preset
    req = TrainRequest(
        opts.out,
        model,
        _model(task, opts, flags, toml, preset if opts.init else named, saved),
        _train(task, model, named, toml, saved, flags),
        _data(task, toml, saved, flags),
        resume=opts.resume,
        force=opts.force,
        init=opts.init,
        options=_options(task, toml, saved, flags),
        converters=converters_of(saved) if saved else _converters(task, toml, flags),
    )
    return req if saved is None else resumed(task, req, saved)


def requested(task: Task, opts: TrainOptions, flags: dict[str, dict[str, Any]]) -> TrainRequest:
    """resolve() of what was asked, with the run's config.json read on --resume (one line if there is
    no run to resume in --out)."""
    saved = read_run_config(check_resumable(opts.out)) if opts.resume else None
    return resolve(task, opts, flags, saved)


def python_request(
    task: Task,
    out: str | Path,
    model: str | None = None,
    fields_: dict[str, Any] | None = None,
    train: TrainConfig | dict[str, Any] | None = None,
    data: Any = None,
    *,
    resume: bool = False,
    force: bool = False,
    init: str | Path | None = None,
    progress: bool = True,
    options: dict[str, Any] | None = None,
) -> TrainRequest:
    """The request of a Python call (attnlab.train, the comparisons): its arguments are the command
    line's sections at the flags' level. A config object is its section whole (every field given);
    a dict gives only its fields, as flags do. `model`: one of the task's model names; `fields_`: its
    config's fields; `options`: the task's own, and its converters' as `lora_rank`, `quantize_base`
    (the flags' names). A "preset" among the fields is --preset."""
    fields_ = dict(fields_ or {})
    where = {"resume": resume, "force": force, "init": None if init is None else str(init)}
    opts = TrainOptions(out=str(out), model=model, preset=fields_.pop("preset", None), **where)
    flags = {"model": fields_, "train": _section(train), "data": _section(data)}
    flags |= _python_options(task, dict(options or {}))
    return replace(requested(task, opts, flags), out=out, progress=progress)


def python_names(task: Task) -> dict[str, tuple[str, str]]:
    """train()'s keywords beside the task's own options: its converters' fields, named as their flags
    (lora_rank, quantize_base) -> (section, field)."""
    return {f"{kind}_{f.name}": (kind, f.name) for kind in task.converters for f in fields(CONVERTERS[kind])}


def _python_options(task: Task, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """train()'s keywords by section: the task's options, and its converters' ([lora], [quantize])."""
    names, sections = python_names(task), {"options": {}}
    for key, value in options.items():
        section, name = names.get(key, ("options", key))
        sections.setdefault(section, {})[name] = value
    return sections


def _section(given: Any) -> dict[str, Any]:
    """A section given from Python: a config object whole, a dict's fields, or nothing."""
    return {} if given is None else dict(given) if isinstance(given, dict) else asdict(given)


def _whole(task: Task, model: str, toml: dict, flags: dict) -> bool:
    """Every field of the model given (Python's model=GPTConfig(...)): no preset is left to fill any,
    so none is named (config.json would record one the model is not)."""
    given = _levels(toml, flags, "model")
    return {f.name for f in fields(task.models[model].config)} <= set(given)


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


def _options(task: Task, toml: dict, saved: dict | None, flags: dict) -> Any:
    """The task's own options: their defaults < TOML < the run's own < flags, checked; on --resume
    those the run cannot change mid-way (task.fixed_options) equal to its own."""
    given = flags.get("options", {})
    code = {k: v for k, v in given.items() if callable(v)}  # a Python function (grpo's reward): no text to parse
    own = saved and saved_options(task, saved)
    typed = {k: v for k, v in given.items() if k not in code}
    options = checked(task.options, _levels(toml, {"options": typed}, "options", own), where="[options]")
    check_types(options)
    for f in fields(options):
        least = f.metadata.get("at_least")
        if least is not None and getattr(options, f.name) < least:
            raise AttnlabError(f"--{f.name.replace('_', '-')} must be at least {least}, got {getattr(options, f.name)}")
    options = task.normal_options(replace(options, **code))
    if saved is not None:
        task.check_options_resumed(own, options)
    return options


def saved_options(task: Task, saved: dict) -> dict[str, Any]:
    """A resumed run's own options: config.json's options over its task section (a run written before
    options were recorded, issue 52, kept them there: beta, group, ...; grpo's reward, when a Python
    function, only there, by name), over the values of runs stored before an option existed."""
    names = {f.name for f in fields(task.options)}
    recorded = {**task.older_options(saved), **saved.get("task", {}), **saved.get("options", {})}
    return {k: v for k, v in recorded.items() if k in names}


def read_sections(path: str | None) -> dict[str, Any]:
    """A TOML file's tables (SECTIONS) and top-level preset ({} without a file)."""
    toml = read_toml(path) if path else {}
    unknown = set(toml) - set(SECTIONS) - {"preset"}
    if unknown or not all(isinstance(toml.get(name, {}), dict) for name in SECTIONS):
        tables = ", ".join(f"[{s}]" for s in SECTIONS)
        raise AttnlabError(f"{path}: use the tables {tables} (and a top-level preset)")
    return toml
