"""Nothing of the user's overwritten or lost: every flag that names a file a command writes refuses
an existing file without --force, a suffix it cannot write, and any path inside a run folder; --force
on a run removes only what attnlab wrote there; a checkpoint's save walks the parameters a fixed
number of times, whatever the depth."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

import attnlab
from attnlab.cli.main import COMMANDS, ref
from attnlab.models.gpt import GPT
from attnlab.runs.marker import MARKER, owned, write_marker
from attnlab.runs.outputs import output_flags
from attnlab.runs.weights import model_weights
from tests.conftest import run_cli, tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def argv(command, flag: str, path) -> list[str]:
    """The command with placeholder values for what it requires, and `flag` naming `path`. Outputs are
    checked before the run is read, so the placeholders are never looked at."""
    args, opts = [command.name], ref(command.options)
    for f in dataclasses.fields(opts):
        meta = f.metadata
        if f.name == flag:
            args += [f"--{flag.replace('_', '-')}", str(path)]
        elif meta.get("positional"):
            args.append("placeholder")
        elif meta.get("required"):
            choices = meta.get("choices")
            args += [f"--{f.name.replace('_', '-')}", choices[0] if choices else "placeholder.png"]
    return args


FLAGS = [(c, name, suffixes) for c in COMMANDS for name, suffixes in output_flags(ref(c.options))]


def test_the_commands_that_write_files_declare_them():
    declared = {(c.name, name) for c, name, _ in FLAGS}
    assert {
        ("attention", "out"),
        ("plot", "out"),
        ("inspect", "out"),
        ("predict", "attention"),
        ("translate", "attention"),
        ("eval", "confusion"),
        ("vectors", "export"),
        ("vectors", "plot"),
    } <= declared


@pytest.mark.parametrize("command, flag, suffixes", FLAGS, ids=[f"{c.name}--{n}" for c, n, _ in FLAGS])
def test_every_output_flag_refuses_an_existing_file(command, flag, suffixes, tmp_path, capsys):
    mine = tmp_path / f"notes{suffixes[0]}"
    mine.write_text("mine")
    code, _, err = run_cli(argv(command, flag, mine), capsys)
    assert code == 2 and "exists: choose another name, or add --force" in err, err
    assert mine.read_text() == "mine"
    code, _, err = run_cli([*argv(command, flag, mine), "--force"], capsys)
    assert "exists" not in err  # with --force the check lets it through (the placeholder run then fails)

    odd = tmp_path / "page.nope"
    code, _, err = run_cli(argv(command, flag, odd), capsys)
    assert code == 2 and "the suffix picks the format" in err and suffixes[0] in err, err

    run = tmp_path / "run"
    run.mkdir()
    write_marker(run)
    (run / "config.json").write_text("{}")
    inside = run / f"config{suffixes[0]}"
    code, _, err = run_cli([*argv(command, flag, inside), "--force"], capsys)
    assert code == 2 and "is inside the run folder" in err, err
    assert (run / "config.json").read_text() == "{}" and not inside.exists()


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n" * 100)
    run = root / "run"
    attnlab.train(
        run, tiny_model(n_layer=1), tiny_train(max_steps=2, eval_interval=2), tiny_data(corpus), progress=False
    )
    return run


def test_plot_writes_what_its_suffix_names(lm_run, tmp_path, capsys):
    code, _, err = run_cli(["plot", lm_run, "--what", "loss", "--out", tmp_path / "page.html"], capsys)
    assert code == 2 and ".png, .svg or .json" in err and not (tmp_path / "page.html").exists()
    code, _, err = run_cli(["plot", lm_run, "--what", "loss", "--out", lm_run / "config.json"], capsys)
    assert code == 2 and "inside the run folder" in err
    assert attnlab.load(lm_run).step == 2  # the run still loads
    out = tmp_path / "pics" / "loss.svg"  # a folder that does not exist yet is made
    assert run_cli(["plot", lm_run, "--what", "loss", "--out", out], capsys)[0] == 0
    assert out.read_text().lstrip().startswith("<?xml")


def test_the_marker_lists_every_file_a_run_holds(lm_run):
    listed = json.loads((lm_run / MARKER).read_text())["files"]
    assert {p.name for p in lm_run.iterdir()} <= set(listed) and owned(lm_run) == {p.name for p in lm_run.iterdir()}


def test_force_removes_only_what_attnlab_wrote(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    cfg, data = tiny_train(max_steps=2, eval_interval=2), tiny_data(corpus)
    attnlab.train(run, tiny_model(n_layer=1), cfg, data, progress=False)
    (run / "NOTES.md").write_text("my notes")
    (run / "figures").mkdir()
    (run / "figures" / "a.png").write_bytes(b"png")
    with pytest.warns(UserWarning, match=r"kept NOTES.md, figures \(not written by attnlab\)"):
        attnlab.train(run, tiny_model(n_layer=1), cfg, data, force=True, progress=False)
    assert (run / "NOTES.md").read_text() == "my notes" and (run / "figures" / "a.png").read_bytes() == b"png"
    assert attnlab.load(run).step == 2


def test_a_config_json_with_attnlabs_keys_is_not_enough_to_be_a_run(tmp_path, corpus, capsys):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": {}, "train": {}, "data": {}}))
    (folder / "app.py").write_text("print('hi')\n")
    with pytest.raises(attnlab.AttnlabError, match="not an attnlab run"):
        attnlab.train(
            folder, tiny_model(n_layer=1), tiny_train(max_steps=2), tiny_data(corpus), force=True, progress=False
        )
    assert (folder / "app.py").read_text() == "print('hi')\n"


def test_a_save_walks_the_parameters_a_fixed_number_of_times(monkeypatch):
    """Asking for the tied names once per tensor made a save quadratic in depth (152 s at 500 layers)."""
    walks = []
    real = nn.Module.named_parameters

    def counted(self, *args, **kwargs):
        if isinstance(self, GPT):
            walks.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_parameters", counted)
    counts = []
    for depth in (2, 8):
        walks.clear()
        weights = model_weights(GPT(tiny_model(n_layer=depth)))
        assert all(isinstance(t, torch.Tensor) for t in weights.values())
        counts.append(len(walks))
    assert counts[0] == counts[1], counts
