"""One request (tasks/request.py): the order of the settings, held for every task, level by level:

    field defaults < the task's tuned values < the preset < a TOML file < a resumed run's own < flags

the command line and the Python API give the same request (and config.json) for what they are asked
alike, and `--init` is resolved once per run (a HuggingFace folder is converted once, a run folder
checked once)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_old_runs import copied

import attnlab
import attnlab.cli.train as cli_train
from attnlab.cli.generate import given, read_options
from attnlab.cli.main import build_parser
from attnlab.cli.main import main as cli_main
from attnlab.engine.config import TrainConfig
from attnlab.errors import AttnlabError
from attnlab.runs import adapted
from attnlab.tasks import TASKS, registry
from attnlab.tasks import adapt as adapt_module
from attnlab.tasks.base import TrainOptions
from attnlab.tasks.request import SECTIONS, resolve

# Per task, a data field and an option field to move through the levels (values: one per level).
DATA = {"lm": "vocab_size", "mlm": "vocab_size", "sft": "examples", "dpo": "examples", "reward": "examples"}
DATA |= {"grpo": "examples", "ppo": "examples"}
OPTION = {"classify": "word_vectors", "tag": "word_vectors", "sft": "show_masks", "dpo": "beta"}
OPTION |= {"reward": "show_masks", "grpo": "group", "ppo": "group"}
LEVELS = ("tuned", "preset", "toml", "saved", "flags")  # above the field's default, lowest first


def value(field: dataclasses.Field, level: int) -> object:
    """A value of the field's type that differs from the level below's (a bool alternates)."""
    if field.type in (bool, "bool"):
        return level % 2 == 1
    if "str" in str(field.type):
        return f"level{level}.txt"
    return (0.01 if "float" in str(field.type) else 10) + level


def toml_value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else str(v)


def field_of(cls: type, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def request(task, tmp_path: Path, levels: set[str], monkeypatch, train=None, data=None, option=None):
    """resolve() with the settings of `levels` given: lr, a data field and an option at each."""
    lr = {level: 0.001 * (i + 2) for i, level in enumerate(LEVELS)}
    monkeypatch.setattr(task, "train_defaults", lambda m: {"lr": lr["tuned"]} if "tuned" in levels else {})
    monkeypatch.setattr(task, "preset_training", lambda p: {"lr": lr["preset"]} if "preset" in levels else {})
    sections: dict[str, dict] = {s: {} for s in ("train", "data", "options")}
    toml, saved = tmp_path / "c.toml", None
    d, o = data, option
    if "toml" in levels:
        lines = [f"[train]\nlr = {lr['toml']}"]
        lines += [f"[data]\n{d[0]} = {toml_value(d[1]['toml'])}"] if d else []
        lines += [f"[options]\n{o[0]} = {toml_value(o[1]['toml'])}"] if o else []
        toml.write_text("\n".join(lines) + "\n")
    if "saved" in levels:
        saved = {
            "family": task.models[task.default_model].family,
            "task": {"kind": task.name, "model": task.default_model},
            "model": {},
            "train": dataclasses.asdict(TrainConfig(lr=lr["saved"])),
            "data": dataclasses.asdict(task.data_config(**({d[0]: d[1]["saved"]} if d else {}))),
            "options": {o[0]: o[1]["saved"]} if o else {},
        }
    if "flags" in levels:
        sections["train"]["lr"] = lr["flags"]
        if o:
            sections["options"][o[0]] = o[1]["flags"]
        if d and saved is None:  # a resumed run keeps its data: flags that change it are refused
            sections["data"][d[0]] = d[1]["flags"]
    opts = TrainOptions(
        out=str(tmp_path / "run"), resume=saved is not None, config=str(toml) if "toml" in levels else None
    )
    return resolve(task, opts, sections, saved), lr


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_level_wins_over_the_one_below(name, tmp_path, monkeypatch):
    task = TASKS[name]
    d_name = DATA.get(name, "data_seed")
    d_field = field_of(task.data_config, d_name)
    o_field = field_of(task.options, OPTION[name]) if name in OPTION else None
    for top in range(len(LEVELS) + 1):  # the levels given: none, then tuned, tuned and preset, ...
        levels = set(LEVELS[:top])
        data = (d_name, {lv: value(d_field, i) for i, lv in enumerate(LEVELS)})
        option = o_field and (o_field.name, {lv: value(o_field, i) for i, lv in enumerate(LEVELS)})
        req, lr = request(task, tmp_path, levels, monkeypatch, data=data, option=option)
        highest = LEVELS[top - 1] if top else None
        assert req.train.lr == (lr[highest] if highest else TrainConfig.lr), (name, levels)
        data_level = next((lv for lv in ("saved", "toml") if lv in levels), None)
        if highest == "flags" and "saved" not in levels:
            data_level = "flags"
        if data_level is not None:
            assert getattr(req.data, d_name) == data[1][data_level], (name, levels)
        if option:
            option_level = next((lv for lv in ("flags", "saved", "toml") if lv in levels), None)
            expected = option[1][option_level] if option_level else o_field.default
            assert getattr(req.options, o_field.name) == expected, (name, levels)


def test_the_tasks_tuned_data_is_under_the_toml_file(tmp_path, monkeypatch):
    """The task's own data (default_data: mlm's word tokenizer, classify's sentiment) under a TOML's."""
    task = TASKS["mlm"]
    req, _ = request(task, tmp_path, set(), monkeypatch)
    assert req.data.tokenizer == "word"  # mlm's default data, over DataConfig's own
    (tmp_path / "c.toml").write_text('[data]\ntokenizer = "char"\n')
    opts = TrainOptions(out=str(tmp_path / "run"), config=str(tmp_path / "c.toml"))
    assert resolve(task, opts, {}, None).data.tokenizer == "char"


def test_the_preset_is_under_the_toml_file_and_the_flags(tmp_path):
    """lm's model: the TOML's top-level preset, a --preset flag over it; model fields of both."""
    (tmp_path / "c.toml").write_text('preset = "gpt-micro"\n[model]\nn_layer = 3\n')
    opts = TrainOptions(out=str(tmp_path / "r"), config=str(tmp_path / "c.toml"))
    assert resolve(TASKS["lm"], opts, {}, None).model_config == {"preset": "gpt-micro", "n_layer": 3}
    flagged = dataclasses.replace(opts, preset="gpt-nano")
    req = resolve(TASKS["lm"], flagged, {"model": {"n_layer": 2}}, None)
    assert req.model_config == {"preset": "gpt-nano", "n_layer": 2}


@pytest.mark.parametrize("name", ["classify", "image", "sft"])
def test_every_task_takes_a_toml_file_from_the_command_line(name, tmp_path):
    (tmp_path / "c.toml").write_text("[train]\nmax_steps = 7\nlr = 0.0042\n")
    args = build_parser().parse_args(
        ["train", name, "--out", str(tmp_path / "r"), "--config", str(tmp_path / "c.toml"), "--lr", "0.005"]
    )
    req = resolve(TASKS[name], read_options(args, TrainOptions), {s: given(args, s) for s in SECTIONS}, None)
    assert (req.train.max_steps, req.train.lr) == (7, 0.005)  # the file's, the flag over it


def test_a_toml_file_with_an_unknown_table_is_one_line(tmp_path):
    (tmp_path / "c.toml").write_text("[trian]\nlr = 1\n")
    with pytest.raises(AttnlabError, match=r"use the tables \[data\], \[model\], \[train\]"):
        resolve(TASKS["classify"], TrainOptions(out=str(tmp_path / "r"), config=str(tmp_path / "c.toml")), {}, None)


def test_init_is_resolved_once_a_run(tmp_path, monkeypatch, capsys):
    """`train sft --init LM --lora-rank 2 --quantize-base nf4`: the --init folder read as a run once
    (tasks/adapt.py complete), not again by setup, prepare or the model's builder."""
    old = Path(__file__).parent / "data" / "old_runs"
    shutil.copytree(old / "lm", tmp_path / "lm")
    calls = []
    as_run = adapted.as_run
    counted = lambda p: calls.append(p) or as_run(p)  # noqa: E731
    monkeypatch.setattr(adapted, "as_run", counted)
    monkeypatch.setattr(adapt_module, "as_run", counted)
    args = [
        "train",
        "sft",
        "--init",
        tmp_path / "lm",
        "--lora-rank",
        "2",
        "--quantize-base",
        "nf4",
        "--out",
        tmp_path / "s",
    ]
    args += ["--examples", "24", "--test-examples", "4", "--max-steps", "1", "--device", "cpu", "--dtype", "float32"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(calls) == 1


def test_a_task_without_converters_refuses_lora_settings(tmp_path):
    (tmp_path / "c.toml").write_text("[lora]\nrank = 4\n")
    with pytest.raises(AttnlabError, match="takes no \\[lora\\]"):
        resolve(TASKS["lm"], TrainOptions(out=str(tmp_path / "r"), config=str(tmp_path / "c.toml")), {}, None)


def test_the_command_line_builds_the_training_settings_once(tmp_path, monkeypatch):
    """`attnlab train lm --data X`: one TrainConfig between the flags and the engine (once there were two)."""
    import attnlab.cli.train as cli_train
    from attnlab.cli.main import main

    made, post_init = [], TrainConfig.__post_init__
    monkeypatch.setattr(TrainConfig, "__post_init__", lambda self: made.append(self) or post_init(self))
    monkeypatch.setattr(cli_train, "run", lambda task, req: made.append("run") or {})
    monkeypatch.setattr(TASKS["lm"], "result_line", lambda result, out: "")
    (tmp_path / "c.txt").write_text("a b c\n" * 50)
    assert main(["train", "lm", "--data", str(tmp_path / "c.txt"), "--out", str(tmp_path / "r"), "--lr", "0.01"]) == 0
    assert len(made) == 2 and made[-1] == "run" and made[0].lr == 0.01


def flag_args(name: str, v: object) -> list[str]:
    """A setting as the command line gives it (a bool section field: --x or --no-x)."""
    if isinstance(v, bool):
        return [f"--{'' if v else 'no-'}{name.replace('_', '-')}"]
    return [f"--{name.replace('_', '-')}", str(v)]


def asked_alike(name: str, level: str) -> tuple[list[str], dict]:
    """The same settings for `attnlab train NAME` and attnlab.train(task=NAME) at a level: nothing
    given, or a training setting, a data field and an option given (over a resumed run's own)."""
    if level == "defaults":
        return [], {}
    task = TASKS[name]
    train = {"lr": 0.004, "max_steps": 5}
    args = [a for k, v in train.items() for a in flag_args(k, v)]
    python: dict = {"train": train}
    if level == "flags":  # a resumed run keeps its data
        d = DATA.get(name, "data_seed")
        v = value(field_of(task.data_config, d), 3)
        args, python["data"] = args + flag_args(d, v), {d: v}
    if name in OPTION:
        o = OPTION[name]
        v = value(field_of(task.options, o), 3)
        args, python[o] = args + flag_args(o, v), v
    return args, python


@pytest.mark.parametrize("level", ["defaults", "flags", "resumed"])
@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_command_line_and_python_ask_for_the_same_request(name, level, tmp_path, monkeypatch):
    """attnlab.train() goes through the command line's resolve(): the same TrainRequest, field by field
    (the engine is not run), for a new run and for a run resumed (an old run of the task)."""
    seen = []
    monkeypatch.setattr(cli_train, "run", lambda task, req: seen.append(req) or {})
    monkeypatch.setattr(registry, "run", lambda task, req: seen.append(req) or {})
    monkeypatch.setattr(TASKS[name], "result_line", lambda result, out: "")
    out = copied(tmp_path) / name if level == "resumed" else tmp_path / "run"
    args, python = asked_alike(name, level)
    resume = level == "resumed"
    assert cli_main(["train", name, "--out", str(out), *args, *(["--resume"] if resume else [])]) == 0
    attnlab.train(str(out), task=name, resume=resume, **python)
    cli, api = seen
    assert cli == api
    assert (cli.train.max_steps == 5) == (level != "defaults") and cli.resume == resume
