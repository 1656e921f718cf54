"""Trackers: --log tensorboard writes what metrics.jsonl holds, read back by TensorBoard's own reader."""

from __future__ import annotations

import sys

import pytest

from attnlab.engine.config import TrainConfig
from attnlab.engine.tracking import TRACKERS, make_trackers
from attnlab.errors import AttnlabError
from attnlab.io import read_metrics
from tests.conftest import code_file, run_cli

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="the tensorboard extra"
)
pytestmark = pytest.mark.usefixtures("one_thread")
TINY = (
    "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --eval-interval 3 --eval-batches 1 --device cpu"
).split()


def scalars(run, tag: str) -> dict[int, float]:
    """{step: value} of one tag in RUN/tensorboard, as TensorBoard reads it."""
    events = event_accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def logged(run, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run / "metrics.jsonl") if key in r}


def test_tensorboard_holds_the_losses_of_metrics_jsonl_across_a_resume(tmp_path, capsys):
    """Train 4 steps with --log tensorboard, resume to 8: TensorBoard's reader finds every train and
    validation loss of metrics.jsonl at its step (float32 of the same number), nothing more."""
    run, data = tmp_path / "run", code_file(tmp_path)
    code, _, err = run_cli(
        ["train", "lm", "--data", data, "--out", run, *TINY, "--max-steps", "4", "--log", "tensorboard"], capsys
    )
    assert code == 0, err
    code, _, err = run_cli(["train", "lm", "--out", run, "--resume", "--max-steps", "8"], capsys)
    assert code == 0, err  # the saved settings keep --log on
    train, val = logged(run, "loss"), logged(run, "val_loss")
    assert sorted(train) == list(range(1, 9)) and sorted(val) == [3, 4, 6, 8]
    for tag, expected in (("train/loss", train), ("val/loss", val)):
        seen = scalars(run, tag)
        assert sorted(seen) == sorted(expected), tag
        assert all(seen[k] == pytest.approx(v, rel=1e-6) for k, v in expected.items()), tag
    assert "tensorboard" in (run / "attnlab.json").read_text()  # --force removes it with the run


def test_no_tracker_unless_asked(tmp_path, capsys):
    run = tmp_path / "run"
    code, _, err = run_cli(
        ["train", "lm", "--data", code_file(tmp_path), "--out", run, *TINY, "--max-steps", "2"], capsys
    )
    assert code == 0, err
    assert (run / "metrics.jsonl").is_file() and not (run / "tensorboard").exists()


def test_missing_tensorboard_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(AttnlabError, match=r"pip install 'attnlab\[tensorboard\]'"):
        make_trackers(["tensorboard"])


def test_an_unknown_tracker_is_refused_by_the_config():
    assert "tensorboard" in TRACKERS and TrainConfig().log is None  # none on by default
    with pytest.raises(ValueError, match="log must be one of tensorboard"):
        TrainConfig(log="wandb")
