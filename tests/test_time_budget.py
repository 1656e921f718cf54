"""--time-budget: training stops when the budget is spent, and the cosine decay follows elapsed time."""

from __future__ import annotations

import json

import pytest

import attnlab.engine.loop as loop_mod
from attnlab.config import checked
from attnlab.engine.config import TrainConfig, budget_seconds
from attnlab.engine.optim import lr_at
from attnlab.errors import AttnlabError
from tests.conftest import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TINY = (
    "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --eval-interval 1000 "
    "--eval-batches 1 --device cpu --dtype float32"
).split()


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("2m", 120), ("1.5h", 5400), ("45", 45), (" 2M ", 120)])
def test_durations(text, seconds):
    assert budget_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1m", "2x", "m", "nanm", "infs"])
def test_bad_durations_are_one_line(text):
    with pytest.raises(AttnlabError, match="time_budget"):
        checked(TrainConfig, {"time_budget": text}, "[train]")


def test_the_decay_follows_elapsed_time_not_steps():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=10**6, time_budget="100s")
    assert lr_at(5, cfg, 0.0) == pytest.approx(0.6)  # warmup still counts steps
    assert lr_at(50, cfg, 0.0) == pytest.approx(1.0)
    assert lr_at(50, cfg, 50.0) == pytest.approx(0.55)  # half the budget: half the cosine, whatever the step
    assert lr_at(10**5, cfg, 50.0) == pytest.approx(0.55)
    assert lr_at(50, cfg, 100.0) == pytest.approx(0.1) and lr_at(50, cfg, 500.0) == pytest.approx(0.1)
    assert TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110).time_budget is None
    assert lr_at(60, TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110), 1e9) == pytest.approx(0.55)


def fake_clock(monkeypatch, step_seconds: float) -> None:
    """time.perf_counter in the loop advances step_seconds at every call: a slow machine, simulated."""
    now = [1000.0]

    def tick():
        now[0] += step_seconds
        return now[0]

    monkeypatch.setattr(loop_mod.time, "perf_counter", tick)


def test_training_stops_when_the_budget_is_spent_and_resumes_the_clock(tmp_path, capsys, monkeypatch):
    fake_clock(monkeypatch, 1.0)  # 3 calls per step: 3 s a step
    run = tmp_path / "run"
    code, _, err = train_on_the_clock(tmp_path, capsys, "30s")
    assert code == 0, err
    assert "time budget of 30s spent: " in err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert 5 <= steps[-1] <= 15  # stopped near 30 s of the fake clock, long before 500 steps
    assert any("val_loss" in r and r["step"] == steps[-1] for r in rows)  # a last validation at the stop
    lrs = [r["lr"] for r in rows if "lr" in r]
    peak = lrs.index(max(lrs))
    assert peak <= 2 and all(a > b for a, b in zip(lrs[peak:], lrs[peak + 1 :]))  # decaying with the clock
    assert lrs[-1] < 0.3 * max(lrs)  # most of the way down the cosine when the budget ends
    code, _, err = run_cli(["train", "lm", "--out", run, "--resume", "--time-budget", "45s"], capsys)
    assert code == 0, err
    more = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] < max(more) <= steps[-1] + 10  # the clock went on from 30 s, not from 0


def train_on_the_clock(tmp_path, capsys, budget: str, *flags) -> tuple[int, str, str]:
    """A tiny lm into tmp_path/run for up to 500 steps with --time-budget `budget`."""
    args = ["train", "lm", "--data", corpus(tmp_path), "--out", tmp_path / "run", *TINY, "--max-steps", "500"]
    return run_cli([*args, "--warmup-steps", "2", "--time-budget", budget, *flags], capsys)


def corpus(tmp_path):
    from tests.conftest import TEXT

    path = tmp_path / "code.txt"
    path.write_text(TEXT * 30)
    return path


def test_a_floor_of_steps_trains_past_the_budget_and_says_why(tmp_path, capsys, monkeypatch):
    """A slow or busy machine spends the budget early: --min-steps trains on to the floor, says so
    once, and the decay ends with the steps instead of the clock."""
    fake_clock(monkeypatch, 1.0)  # 3 s a step: the 9 s budget is spent after 3 steps
    run = tmp_path / "run"
    code, _, err = train_on_the_clock(tmp_path, capsys, "9s", "--min-steps", "12")
    assert code == 0, err
    assert err.count("short of the 12 steps") == 1 and "training on to step 12" in err
    assert "time budget of 9s spent: 12 steps (at least 12)" in err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    assert len(lrs) == 12 and all(a > b for a, b in zip(lrs[2:], lrs[3:]))  # still decaying after the budget
    assert lrs[-1] < 0.2 * max(lrs)


def test_the_decay_ends_with_the_floor_or_the_budget_whichever_comes_last():
    cfg = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=10**6, time_budget="100s", min_steps=100)
    assert lr_at(50, cfg, 100.0) == pytest.approx(0.5)  # budget spent at step 50: the steps lead the decay
    assert lr_at(100, cfg, 50.0) == pytest.approx(0.5)  # floor reached at half the budget: the clock leads
    assert lr_at(100, cfg, 100.0) == pytest.approx(0.0)
