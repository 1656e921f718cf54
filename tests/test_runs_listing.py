"""`attnlab runs`: the runs under a folder, one line each, and `runs compare`'s curves on one picture."""

from __future__ import annotations

import json

import pytest

import attnlab
from attnlab.io import read_metrics
from attnlab.runs.listing import find_runs, list_runs
from tests.conftest import code_file, run_cli, tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """runs/a (8 steps, weight snapshots inside), runs/deeper/b (4 steps), and a note that is no run."""
    root = tmp_path_factory.mktemp("listing")
    data = tiny_data(code_file(root))
    runs = root / "runs"
    attnlab.train(
        runs / "a", tiny_model(), tiny_train(max_steps=8, eval_interval=4, snapshot_every=4), data, progress=False
    )
    short = tiny_train(max_steps=4, eval_interval=2, warmup_steps=1)
    attnlab.train(runs / "deeper" / "b", tiny_model(n_layer=1), short, data, progress=False)
    (runs / "notes").mkdir()
    (runs / "notes" / "config.json").write_text("{}")
    return runs


def test_every_run_under_the_folder_once_with_its_facts(folder):
    a, b = folder / "a", folder / "deeper" / "b"
    assert find_runs(folder) == [a, b]  # not the notes, not a's snapshots
    first, second = list_runs(folder)
    best = min(r["val_loss"] for r in read_metrics(a / "metrics.jsonl") if "val_loss" in r)
    parameters = sum(p.numel() for p in attnlab.load(a, device="cpu").model.parameters())
    assert (first.task, first.steps, first.best_val, first.parameters) == ("lm", 8, best, parameters)
    assert first.model.startswith("gpt 2x32") and second.model.startswith("gpt 1x32")
    assert second.steps == 4 and first.seconds > 0


def test_the_command_prints_a_header_and_one_line_a_run(folder, capsys):
    code, out, err = run_cli(["runs", folder], capsys)
    assert code == 0, err
    head, *lines = out.strip().splitlines()
    assert head.split() == ["run", "task", "model", "params", "steps", "best", "val", "time"]
    assert [line.split()[0] for line in lines] == [str(folder / "a"), str(folder / "deeper" / "b")]
    assert " 8 " in lines[0] and " 4 " in lines[1]


def test_a_folder_without_runs_says_so_in_one_line(tmp_path, capsys):
    (tmp_path / "empty" / "inside").mkdir(parents=True)
    code, out, err = run_cli(["runs", tmp_path / "empty"], capsys)
    assert code == 0 and out.count("\n") == 1 and out.startswith(f"no runs in {tmp_path / 'empty'}")
    code, out, err = run_cli(["runs", tmp_path / "missing"], capsys)
    assert code == 2 and err.count("\n") == 1 and "no such folder" in err


def test_compare_draws_each_runs_losses_and_keeps_the_users_files(folder, tmp_path, capsys):
    out = tmp_path / "curves.json"  # the picture's numbers: each line's label and values
    code, said, err = run_cli(["runs", "compare", folder / "a", folder / "deeper" / "b", "--out", out], capsys)
    assert code == 0, err
    (panel,) = json.loads(out.read_text())["panels"]
    lines = {line["label"]: line for line in panel["lines"] if line.get("label")}
    assert set(lines) == {"a train", "a validation", "b train", "b validation"}
    val = [(r["step"], r["val_loss"]) for r in read_metrics(folder / "a" / "metrics.jsonl") if "val_loss" in r]
    assert list(zip(lines["a validation"]["x"], lines["a validation"]["y"])) == val
    code, _, err = run_cli(["runs", "compare", folder / "a", "--out", out], capsys)
    assert code == 2 and "exists" in err and "--force" in err  # never replaced unless asked
    code, _, err = run_cli(["runs", "compare", folder / "a", "--out", out, "--force"], capsys)
    assert code == 0, err
    png = tmp_path / "curves.png"
    code, _, err = run_cli(["runs", "compare", folder / "a", "--out", png], capsys)
    assert code == 0 and png.read_bytes().startswith(b"\x89PNG")


def test_compare_refuses_a_path_that_is_not_a_run_in_one_line(folder, tmp_path, capsys):
    out = tmp_path / "curves.png"
    code, _, err = run_cli(["runs", "compare", folder / "a", folder / "notes", "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1 and "notes is not a complete run" in err, err
    code, _, err = run_cli(["runs", "compare", folder / "a", tmp_path / "nowhere", "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1 and "not found" in err, err
    assert not out.exists()


def test_help_answers(capsys):
    for args in (["runs", "--help"], ["runs", "compare", "--help"], ["runs", "list", "--help"]):
        code, out, _ = run_cli(args, capsys)
        assert code == 0 and "usage: attnlab runs" in out
