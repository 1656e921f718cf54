"""Nothing lost: the run marker, half-written runs, a loss that turns NaN, a full disk, and the
warnings that say what the data loader changed."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import SafetensorError

import attnlab
from attnlab.io import read_metrics, write_json
from attnlab.runs.folder import TOKENIZER, WEIGHTS
from attnlab.runs.marker import MARKER
from tests.conftest import TEXT, run_cli, shown

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TINY = (
    "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --max-steps 4 "
    "--eval-interval 2 --eval-batches 1 --device cpu --dtype float32"
).split()


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "code.txt"
    path.write_text(TEXT * 30)
    return path


def train(capsys, *args) -> tuple[int, str]:
    code, _, err = run_cli(["train", "lm", *args], capsys)
    return code, err


def test_force_replaces_a_run_but_never_a_folder_with_a_config_json(tmp_path, corpus, capsys):
    project = tmp_path / "p"  # the case: a web project
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "app"}')
    (project / "src" / "main.js").write_text("x\n")
    code, err = train(capsys, "--data", corpus, "--out", project, "--force", *TINY)
    assert code == 2 and "not an attnlab run (it holds config.json, src)" in err
    assert (project / "src" / "main.js").read_text() == "x\n"
    run = tmp_path / "run"
    assert train(capsys, "--data", corpus, "--out", run, *TINY)[0] == 0
    assert json.loads((run / MARKER).read_text())["attnlab"] == "run"
    (run / MARKER).unlink()  # a run made before markers: known by its config.json's tables
    (run / "notes.txt").write_text("mine")
    assert train(capsys, "--data", corpus, "--out", run, "--force", *TINY)[0] == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / MARKER).is_file()  # the user's file stays


def test_a_start_that_never_checkpointed_restarts_with_the_same_command(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / MARKER, {"attnlab": "run", "format": 1})  # killed after the marker and tokenizer
    (run / TOKENIZER).write_text("{}")
    code, err = train(capsys, "--out", run, "--resume")
    assert code == 2 and "run the same command without --resume" in err
    code, err = train(capsys, "--data", corpus, "--out", run, *TINY)
    assert code == 0, err
    assert (run / WEIGHTS).is_file()


def test_a_failed_start_leaves_no_folder(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    code, err = train(capsys, "--data", corpus, "--out", run, *TINY, "--context", "100000000", "--block-size", "32")
    assert code == 2 and "needs ~" in err and "GB; this machine has" in err
    assert not run.exists()


def test_a_kill_between_the_state_and_the_weights_still_resumes(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train(capsys, "--data", corpus, "--out", run, *TINY)[0] == 0
    (run / WEIGHTS).unlink()  # the state is written first, then the weights
    (run / ".model.safetensors.tmp-123").write_bytes(b"half")  # what a kill mid-save leaves
    code, err = train(capsys, "--out", run, "--resume", "--max-steps", "6")
    assert code == 0, err
    assert (run / WEIGHTS).is_file() and not list(run.glob(".*.tmp-*"))


def test_a_loss_that_turns_nan_stops_before_the_update_and_keeps_the_checkpoint(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    code, err = train(
        capsys, "--data", corpus, "--out", run, *TINY, "--max-steps", "40", "--lr", "1e6", "--warmup-steps", "0"
    )
    assert code == 2
    assert "the training loss is nan" in err and "lower one" in err and f"--out {run} --resume --lr" in err
    loaded = attnlab.load(run)  # the last good checkpoint: finite weights, a run that samples
    assert all(torch.isfinite(p).all() for p in loaded.model.parameters())
    assert all(r.get("loss", 0) == r.get("loss", 0) for r in read_metrics(run / "metrics.jsonl"))  # no NaN rows
    code, err = train(capsys, "--out", run, "--resume", "--lr", "1e-3")
    assert code == 0, err


def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays(tmp_path, corpus, capsys, monkeypatch):
    run = tmp_path / "run"
    assert train(capsys, "--data", corpus, "--out", run, *TINY)[0] == 0
    weights = (run / WEIGHTS).read_bytes()

    def full(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr("safetensors.torch.save_file", full)  # attnlab.io imports it where it writes
    code, err = train(capsys, "--out", run, "--resume", "--max-steps", "6")
    assert code == 2 and "disk full writing" in err and "(1.0 KB written" in err and "is intact" in err
    assert len([line for line in shown(err) if line.startswith("attnlab:")]) == 1
    monkeypatch.undo()
    assert (run / WEIGHTS).read_bytes() == weights and not list(run.glob(".*.tmp-*"))
    assert attnlab.load(run).step == 4


def test_undecodable_bytes_are_counted_and_the_encoding_guessed(tmp_path, capsys):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(("café naïve déjà vu\n" * 200).encode("latin-1"))
    with pytest.warns(UserWarning, match=r"latin.txt: 800 bytes are not UTF-8 .* Latin-1"):
        code, err = train(capsys, "--data", latin, "--out", tmp_path / "run", *TINY, "--max-steps", "1")
    assert code == 0, err


def test_rows_with_an_empty_text_or_label_are_dropped_with_a_count(tmp_path, capsys):
    rows = "".join(f"film {i},{'pos' if i % 2 else 'neg'}\n" for i in range(60))
    (tmp_path / "t.csv").write_text("text,label\n" + rows + ",\n ,pos\nbad film,\n")
    args = ["train", "classify", "--data", tmp_path / "t.csv", "--model", "bow", "--out", tmp_path / "run"]
    with pytest.warns(UserWarning, match="3 of 63 rows have an empty text or label"):
        code, _, err = run_cli([*args, "--max-steps", "1", "--device", "cpu"], capsys)
    assert code == 0, err
    assert "" not in attnlab.load(tmp_path / "run").config["task"]["labels"]


def test_long_metrics_are_thinned_but_keep_every_validation_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "loss": 1.0}) for i in range(1, 1001)]
    lines += [json.dumps({"step": i, "val_loss": 2.0}) for i in range(100, 1001, 100)]
    path.write_text("\n".join(lines) + "\n{cut sh")  # a last line cut short by a crash
    rows = read_metrics(path, max_rows=100)
    assert 90 <= sum("loss" in r for r in rows) <= 100 and sum("val_loss" in r for r in rows) == 10
    assert len(read_metrics(path)) == 1010


def test_an_hf_export_replaces_an_earlier_export_only(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train(capsys, "--data", corpus, "--out", run, *TINY)[0] == 0
    out = tmp_path / "hf"
    assert run_cli(["export", "--to", "hf", run, out], capsys)[0] == 0
    assert run_cli(["export", "--to", "hf", run, out, "--force"], capsys)[0] == 0  # an HF folder: replaced
    shutil.copytree(out, tmp_path / "other")
    (tmp_path / "other" / WEIGHTS).unlink()  # a config.json alone is not a model folder
    code, _, err = run_cli(["export", "--to", "hf", run, tmp_path / "other", "--force"], capsys)
    assert code == 2 and "not a HuggingFace model directory" in err
