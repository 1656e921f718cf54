"""Commands start without importing what they do not use: `attnlab --help`, `attnlab COMMAND --help`,
`attnlab runs` and `import attnlab` load no torch (2-4 s of a 2-core machine's start).

Each check runs the command in a fresh Python and reads that process's sys.modules afterwards, so a
module that imports torch anywhere on the way is caught; no wall-clock time is asserted (docs/cpu.md
has the measured times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import attnlab
from attnlab.cli import choices, help_cache
from attnlab.cli.main import COMMANDS, GROUPS
from attnlab.decoding import settings
from tests.conftest import code_file, run_cli, tiny_data, tiny_model, tiny_train

# Every command's --help is torch-free (chat's table of phrasings is cli/phrasings.py, compare's options
# tasks/compare_options.py, size's cluster plan models/cluster.py, train's list of tasks cli/choices.py).
# `attnlab train TASK --help` imports torch the first time: a task's flags come from its Task object, its
# models' config classes and its data config, which live beside torch code; its text is kept then
# (cli/help_cache.py), and shown again without torch.

# Runs main(argv) in a fresh interpreter; prints what it printed and which heavy modules it loaded.
PROGRAM = """
import contextlib, io, json, sys
from attnlab.cli.main import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
heavy = ("torch", "numpy", "safetensors.torch", "attnlab.tasks.registry", "attnlab.models.families", "attnlab.nn")
loaded = [m for m in heavy if m in sys.modules]
print(json.dumps({"rc": rc, "out": out.getvalue(), "loaded": loaded}))
"""


def started(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_top_level_help_loads_no_torch():
    r = started("--help")
    assert r["rc"] == 0 and "doctor" in r["out"] and "runs" in r["out"]  # every command listed
    assert r["loaded"] == []


@pytest.mark.parametrize("name", sorted({c.name for c in COMMANDS} | set(GROUPS)))
def test_a_command_help_loads_no_torch(name):
    r = started(name, "--help")
    assert r["rc"] == 0 and f"attnlab {name}" in r["out"]  # its own help: usage and flags
    assert "torch" not in r["loaded"] and "attnlab.tasks.registry" not in r["loaded"]
    assert "attnlab.models.families" not in r["loaded"]


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (("size",), ("--preset", "--gpu-tflops", "--micro-batch")),  # models/cluster.py's ClusterConfig
        (("compare",), ("{sentiment,tagging,numbers,dates,copy,reverse,digits,caption,lm}", "--word-vectors")),
        (("train",), (*choices.TASK_HELPS, *choices.TASK_HELPS.values(), "vectors")),  # each task and its line
    ],
)
def test_the_helps_that_moved_are_whole(argv, flags, capsys):
    """The options moved to torch-free modules are still every flag, choice and help line (the text,
    read in this process: that these helps load no torch is test_a_command_help_loads_no_torch's)."""
    code, out, _ = run_cli([*argv, "--help"], capsys)
    text = " ".join(out.split())  # argparse wraps a long help line
    assert code == 0 and all(flag in text for flag in flags), out


def test_a_train_task_help_fills_its_parser_when_used(capsys):
    """`attnlab train sft --help` fills only its own sub-command: its flags, from the task's dataclasses
    (the text, read in this process; what it loads is the next test's)."""
    code, out, _ = run_cli(["train", "sft", "--help"], capsys)
    assert code == 0 and "attnlab train sft" in out
    assert all(flag in out for flag in ("--init", "--lora-rank", "--train-on", "--max-steps")), out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    short = tiny_train(max_steps=2, eval_interval=2, warmup_steps=1)
    attnlab.train(root / "runs" / "tiny", tiny_model(n_layer=1), short, tiny_data(code_file(root)), progress=False)
    return root / "runs"


def test_runs_lists_a_run_without_torch(runs):
    """`attnlab runs` reads config.json, metrics.jsonl and the safetensors headers: no model is built."""
    r = started("runs", str(runs))
    assert r["rc"] == 0, r["out"]
    line = next(x for x in r["out"].splitlines() if "tiny" in x)
    assert " lm " in line and "gpt 1x32" in line  # the task and the model, read from the run's files
    assert "torch" not in r["loaded"] and "safetensors.torch" not in r["loaded"]


def test_a_run_loads_through_the_runs_floor_alone(runs):
    """`from attnlab.runs.run import load` in a fresh process: nothing has imported the tasks that
    register the kinds of run, so the runs floor fills its registries itself (lazy.REGISTRARS)."""
    code = f"from attnlab.runs.run import load; print(load({str(runs / 'tiny')!r}).task.name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "lm", done.stderr


def test_import_attnlab_loads_no_torch_and_every_public_name_still_works():
    code = "import sys, attnlab; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    from attnlab.models.gpt import GPTConfig
    from attnlab.runs.run import load
    from attnlab.tasks import train

    assert attnlab.train is train and attnlab.load is load and attnlab.GPTConfig is GPTConfig
    assert all(getattr(attnlab, name) is not None for name in attnlab.__all__)
    assert set(attnlab.__all__) <= set(dir(attnlab))
    with pytest.raises(AttributeError):
        attnlab.no_such_name  # noqa: B018


def test_the_parser_choices_are_the_registries():
    """cli/choices.py names what the torch-side registries hold; a new entry there must be named here."""
    from attnlab.interop.hf import architectures
    from attnlab.interpret.plots import PLOTS
    from attnlab.interpret.report import INSPECTIONS
    from attnlab.interpret.views import VIEW_NAMES
    from attnlab.quant.packed import KINDS
    from attnlab.runtime.device import DTYPE_NAMES
    from attnlab.tasks.lm_eval import SPLITS
    from attnlab.viz.vectors import PROJECTIONS

    assert choices.PLOTS == tuple(PLOTS) and choices.INSPECTIONS == tuple(INSPECTIONS)
    assert choices.VIEW_NAMES == tuple(VIEW_NAMES) and choices.QUANTIZED == tuple(KINDS)
    assert choices.SPLITS == tuple(SPLITS) and choices.PROJECTIONS == tuple(PROJECTIONS)
    assert choices.architectures() == tuple(architectures())
    assert settings.DTYPE_NAMES == DTYPE_NAMES


def test_the_torch_free_tables_are_the_registries():
    """`attnlab train --help` lists TASKS by cli/choices.py's TASK_HELPS, and compare's --task takes
    tasks/compare_options.py's COMPARED: each held equal to the registry it names."""
    from attnlab.tasks import TASKS
    from attnlab.tasks.compare import COMPARISONS
    from attnlab.tasks.compare_options import COMPARED

    assert choices.TASK_HELPS == {name: task.help for name, task in TASKS.items()}
    assert COMPARED == tuple(COMPARISONS)


def test_the_lazy_parser_is_the_whole_parser():
    """What `attnlab` fills on use is what the eager build holds: the same commands, flags and help."""
    from attnlab.cli.main import build_parser
    from attnlab.tasks import TASKS

    def commands(p):
        return p._subparsers._group_actions[0].choices

    eager, lazy = commands(build_parser()), commands(build_parser(lazy=True))
    assert list(eager) == list(lazy)
    for name in ("demo", "plot", "doctor", "runs", "train", "compare", "size"):
        assert lazy[name].format_help() == eager[name].format_help()
    tasks = commands(lazy["train"].filled())  # each filled when used, as `attnlab train NAME --help` does
    assert list(tasks) == [*TASKS, "vectors"]
    for name, task in TASKS.items():
        assert tasks[name].format_help().startswith(f"usage: attnlab train {name} ")
        assert task.description.split()[0] in tasks[name].format_help()


def test_a_train_task_help_is_kept_and_shown_again_without_torch(tmp_path, monkeypatch, capsys):
    """`attnlab train TASK --help` builds its flags from torch code once; asked again it prints the kept
    text, the same bytes, with no torch loaded; `doctor --clear` forgets it."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    first, again = started("train", "sft", "--help"), started("train", "sft", "--max-steps", "3", "--help")
    assert first["rc"] == again["rc"] == 0 and "--lora-rank" in first["out"]
    assert again["out"] == first["out"]
    assert "torch" in first["loaded"] and "torch" not in again["loaded"]
    code, dpo, _ = run_cli(["train", "dpo", "--help"], capsys)  # (the text: in this process)
    assert code == 0 and dpo != first["out"]  # one text a task
    kept = sorted(p.name for p in (tmp_path / "cache" / "help").iterdir())
    assert len(kept) == 2 and help_cache.clear_cache() == kept
    assert "torch" in started("train", "sft", "--help")["loaded"]  # forgotten: made again


def test_a_kept_help_is_stale_once_a_source_file_changes(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    stamp = help_cache.source_stamp(pkg)
    assert help_cache.source_stamp(pkg) == stamp
    os.utime(pkg / "a.py", ns=(1, 1))  # an edit that keeps the size: its time differs
    assert help_cache.source_stamp(pkg) != stamp


def test_help_is_asked_as_argparse_reads_it():
    assert help_cache.asks_help(["--max-steps", "3", "-h"]) and help_cache.asks_help(["--help"])
    assert not help_cache.asks_help(["--prompt", "x", "--", "--help"]) and not help_cache.asks_help([])
