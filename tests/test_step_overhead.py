"""Less time outside the step (issue 16): checkpoints written by a thread while training goes on,
yet whole and resumable whenever the loop returns or raises; validation sized by its rule; the
loss plot drawn at the end rather than at every evaluation. Behaviour only, never the clock."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import attnlab
import attnlab.engine.loop as loop_mod
import attnlab.engine.saving as saving_mod
from attnlab.engine.loop import eval_batches
from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors
from attnlab.runs.checkpoint import BackgroundWriter
from attnlab.runs.folder import STATE, WEIGHTS
from tests.conftest import tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows(run) if "loss" in r}


@pytest.mark.parametrize(
    ("interval", "asked", "accum", "used"),
    [(150, 20, 1, 7), (250, 20, 1, 12), (1000, 20, 1, 20), (150, 20, 2, 15), (10, 2, 1, 1), (1, 5, 1, 1)],
)
def test_validation_reads_at_most_one_batch_per_twenty_trained(interval, asked, accum, used):
    cfg = tiny_train(eval_interval=interval, eval_batches=asked, grad_accum=accum)
    assert eval_batches(cfg) == used


def test_a_validation_pass_draws_the_batches_of_the_rule(tmp_path, corpus, monkeypatch):
    """eval_interval 40 and eval_batches 5: two validation batches (40 // 20) per estimate."""
    drawn = []
    real = loop_mod.estimate_loss

    def counting(s, *args):
        batch = s.data.batch
        s.data.batch = lambda split, *a: drawn.append(split) or batch(split, *a)
        try:
            return real(s, *args)
        finally:
            del s.data.batch

    monkeypatch.setattr(loop_mod, "estimate_loss", counting)
    train = tiny_train(max_steps=80, eval_interval=40, eval_batches=5)
    attnlab.train(tmp_path / "run", tiny_model(), train, tiny_data(corpus), progress=False)
    assert drawn == ["val"] * 4  # two estimates (steps 40 and 80) of two batches


def hold_writes_until(monkeypatch, step_reached: threading.Event, record: list) -> None:
    """Each checkpoint write after step 0 waits (up to 60 s) until training has gone on to a later
    step: a write on the training's own thread would wait the whole time and then fail the test."""
    real = saving_mod.write_checkpoint

    def held(run, files):
        step = int(files.state[1]["step"])
        if step > 0:
            record.append((step, threading.current_thread() is not threading.main_thread(), step_reached.wait(60)))
            step_reached.clear()
        real(run, files)

    monkeypatch.setattr(saving_mod, "write_checkpoint", held)


def test_checkpoints_are_written_while_training_goes_on(tmp_path, corpus, monkeypatch):
    """A checkpoint's write is still held when the next step runs; the checkpoint still holds its
    own step's weights and state (copied when it was taken), and the run resumes from it exactly."""
    model, data = tiny_model(dropout=0.1), tiny_data(corpus)
    full, cut = tmp_path / "full", tmp_path / "cut"
    attnlab.train(full, model, tiny_train(max_steps=12, eval_interval=6), data, progress=False)

    stepped, record = threading.Event(), []
    hold_writes_until(monkeypatch, stepped, record)
    real_step = loop_mod.train_step

    def step(s):
        if s.step == 6:  # step 7, while step 6's checkpoint is being written
            stepped.set()
        if s.step == 8:  # a crash two steps later: the loop still leaves step 6's checkpoint whole
            raise RuntimeError("boom")
        return real_step(s)

    monkeypatch.setattr(loop_mod, "train_step", step)
    with pytest.raises(RuntimeError, match="boom"):
        attnlab.train(cut, model, tiny_train(max_steps=12, eval_interval=6), data, progress=False)
    assert record == [(6, True, True)]  # written by another thread, after step 7 had begun
    assert attnlab.load(cut).step == 6 and not list(cut.glob(".*.tmp-*"))
    monkeypatch.undo()

    attnlab.train(cut, resume=True, progress=False)
    a, b = losses(full), losses(cut)
    assert sorted(b) == list(range(1, 13)) and [a[k] for k in a] == [b[k] for k in a]  # bit for bit
    wa, wb = attnlab.load(full).model.state_dict(), attnlab.load(cut).model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_last_checkpoint_is_on_disk_when_training_returns(tmp_path, corpus, monkeypatch):
    """The final checkpoint is written in the background too, and train() waits for it."""
    record, real = [], saving_mod.write_checkpoint

    def recorded(run, files):
        real(run, files)
        record.append((files.state[1]["step"], threading.current_thread() is not threading.main_thread()))

    monkeypatch.setattr(saving_mod, "write_checkpoint", recorded)
    run = tmp_path / "run"
    attnlab.train(run, tiny_model(), tiny_train(max_steps=8, eval_interval=4), tiny_data(corpus), progress=False)
    assert record == [("0", True), ("4", True), ("8", True)]  # by the writer's thread (step 0 awaited at once)
    tensors, meta = read_safetensors(run / STATE)
    assert meta["step"] == "8" and attnlab.load(run).step == 8
    weights, _ = read_safetensors(run / WEIGHTS)
    assert all(torch.equal(w, tensors[f"model.{k}"]) for k, w in weights.items())


def test_a_checkpoint_that_fails_in_the_background_stops_the_run(tmp_path, corpus, monkeypatch):
    """A full disk at step 5's checkpoint is one error, raised in training by the next checkpoint
    at the latest, and the step-0 checkpoint stays whole."""
    real = saving_mod.write_checkpoint

    def full(run, files):
        if files.state[1]["step"] != "0":
            raise AttnlabError("disk full writing train_state.safetensors: free some space")
        real(run, files)

    monkeypatch.setattr(saving_mod, "write_checkpoint", full)
    run = tmp_path / "run"
    with pytest.raises(AttnlabError, match="disk full"):
        attnlab.train(run, tiny_model(), tiny_train(max_steps=40, eval_interval=5), tiny_data(corpus), progress=False)
    assert max(losses(run)) <= 10  # not trained on to the end
    assert attnlab.load(run).step == 0 and not list(run.glob(".*.tmp-*"))


def test_the_loss_plot_is_drawn_at_the_end_not_at_every_evaluation(tmp_path, corpus, monkeypatch):
    drawn = []
    real = loop_mod.plot_loss
    monkeypatch.setattr(loop_mod, "plot_loss", lambda metrics, out: drawn.append(out) or real(metrics, out))
    run = tmp_path / "run"
    attnlab.train(run, tiny_model(), tiny_train(max_steps=12, eval_interval=3), tiny_data(corpus), progress=False)
    assert drawn == [run / "loss.png"] and (run / "loss.png").stat().st_size > 0
    drawn.clear()
    monkeypatch.setattr(loop_mod, "PLOT_EVERY", 0.0)  # a long run: redrawn at evaluations too, then at the end
    monkeypatch.setattr(loop_mod, "PLOT_SHARE", 1e9)  # however long drawing takes
    attnlab.train(
        tmp_path / "long", tiny_model(), tiny_train(max_steps=12, eval_interval=3), tiny_data(corpus), progress=False
    )
    assert len(drawn) == 4  # at steps 3, 6 and 9, and at the end (not twice at step 12)


def test_metrics_rows_reach_the_file_as_they_are_logged(tmp_path, corpus, monkeypatch):
    """metrics.jsonl stays open during training, line-buffered: what a step logged is in the file
    before the next step runs (a reader, or a kill, sees every row)."""
    seen = {}
    real_step = loop_mod.train_step

    def step(s):
        if s.step in (3, 7):
            seen[s.step] = sorted(losses(s.run))
        return real_step(s)

    monkeypatch.setattr(loop_mod, "train_step", step)
    attnlab.train(tmp_path / "run", tiny_model(), tiny_train(max_steps=8), tiny_data(corpus), progress=False)
    assert seen == {3: [1, 2, 3], 7: list(range(1, 8))}


def test_the_background_writer_runs_jobs_in_order_and_raises_an_error_once():
    writer, done = BackgroundWriter(), []
    for i in range(3):
        writer.submit(lambda i=i: done.append(i))
    writer.wait()
    assert done == [0, 1, 2]

    def fails():
        raise OSError("no space")

    writer.submit(fails)
    with pytest.raises(OSError, match="no space"):
        writer.submit(lambda: done.append(3))  # waits for the failed job first
    writer.wait()  # raised once only
    assert done == [0, 1, 2]
