"""Runs written before issue 52 changed what config.json records (one typed request, adapters as
converters) still load and resume, from the command line and from Python alike: tests/data/old_runs/
holds a tiny run of every task, written by the code of that time (tests/data/old_runs/make_old_runs.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import losses, run_cli

import attnlab
from attnlab.runs.adapted import adapter_of
from attnlab.runs.converters import converters_of
from attnlab.tasks import TASKS as REGISTERED

pytestmark = pytest.mark.usefixtures("one_thread")

OLD = Path(__file__).parent / "data" / "old_runs"
TASKS = ("lm", "mlm", "classify", "tag", "translate", "image", "caption", "sft", "dpo", "reward", "grpo", "ppo")


def copied(tmp_path: Path) -> Path:
    """The old runs in tmp_path, their placeholder OLD_RUNS (the folder they were written in) made this one."""
    root = tmp_path / "old"
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("*.py"))
    for f in root.rglob("*.json"):
        f.write_text(f.read_text().replace("OLD_RUNS", str(root)))
    return root


def test_every_task_has_an_old_run() -> None:
    assert set(TASKS) == set(REGISTERED)
    assert all((OLD / t / "config.json").is_file() for t in TASKS)


@pytest.mark.parametrize("task", TASKS)
def test_an_old_run_loads_and_resumes(task: str, tmp_path: Path, capsys) -> None:
    root = copied(tmp_path)
    run = root / task
    shutil.copytree(run, root / f"{task}-api")
    old = json.loads((run / "config.json").read_text())
    loaded = attnlab.load(run, device="cpu")
    assert loaded.task.name == task
    assert loaded.config["model"] == old["model"] and loaded.config["data"] == old["data"]
    code, _, err = run_cli(["train", task, "--out", run, "--resume", "--max-steps", "3"], capsys)
    assert code == 0, err
    assert len(losses(run)) == 3  # two steps then, one now
    new = json.loads((run / "config.json").read_text())
    assert new["model"] == old["model"] and new["data"] == old["data"]
    assert new["train"] == {**old["train"], "max_steps": 3}
    own = {f.name for f in dataclasses.fields(REGISTERED[task].options)}
    assert set(new.get("options", {})) == own  # the task's own options, typed, recorded for the next resume
    assert {k: v for k, v in old.get("task", {}).items() if k in own}.items() <= new.get("options", {}).items()
    assert adapter_of(new) == adapter_of(old)  # the old adapter section read as today's converters
    assert converters_of(new) == converters_of(old)
    # the same resume from Python (the one request: tasks/request.py) writes the same config.json
    attnlab.train(root / f"{task}-api", train={"max_steps": 3}, task=task, resume=True, progress=False)
    assert json.loads((root / f"{task}-api" / "config.json").read_text()) == new
