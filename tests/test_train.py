"""Training: learning, exact resume, accumulation, schedule, weight decay groups, atomic files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import attnlab
import attnlab.engine.loop as train_mod
from attnlab.engine.config import TrainConfig
from attnlab.engine.loop import train_step
from attnlab.engine.optim import lr_at, make_optimizer
from attnlab.io import atomic_write
from attnlab.tasks.lm import prepare
from tests.conftest import tiny_data, tiny_model, tiny_train


def losses(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_small_model_overfits_a_short_text(tmp_path):
    """A model with enough capacity memorizes a short text: training loss under 0.1."""
    text = tmp_path / "short.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3)
    result = attnlab.train(
        tmp_path / "run",
        tiny_model(d_model=64, context=32),
        tiny_train(max_steps=300, batch_size=16, lr=1e-2, warmup_steps=20, eval_interval=300),
        tiny_data(text, val_fraction=0.0),
        progress=False,
    )
    assert result["train_loss"] < 0.1, result


def test_resume_gives_the_same_losses_as_one_run(tmp_path, corpus, monkeypatch):
    """Interrupt a 20-step run at step 10 and resume it: the same losses, bit for bit, as 20
    uninterrupted steps (fp32, CPU, seeded; dropout on, so the RNG states must be restored)."""
    model, data = tiny_model(dropout=0.1), tiny_data(corpus)
    full, half = tmp_path / "full", tmp_path / "half"
    attnlab.train(full, model, tiny_train(max_steps=20), data, progress=False)

    real_step = train_mod.train_step

    def interrupted(s):  # Ctrl-C arrives in the middle of step 11, after its first micro-batch
        if s.step == 10:
            s.data.batch("train", 2, s.rng, (0, 1))
            torch.rand(3)  # as dropout would
            raise KeyboardInterrupt
        return real_step(s)

    monkeypatch.setattr(train_mod, "train_step", interrupted)
    with pytest.raises(attnlab.AttnlabError, match="interrupted at step 10"):
        attnlab.train(half, tiny_model(dropout=0.1), tiny_train(max_steps=20), data, progress=False)
    monkeypatch.setattr(train_mod, "train_step", real_step)
    attnlab.train(half, resume=True, progress=False)
    a, b = losses(full), losses(half)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert [a[s] for s in a] == [b[s] for s in a]  # bit-for-bit
    run_a, run_b = attnlab.load(full), attnlab.load(half)
    idx = torch.randint(0, run_a.tokenizer.vocab_size, (1, 16))
    assert torch.equal(run_a.model(idx), run_b.model(idx))


def test_gradient_accumulation_matches_one_big_batch(tmp_path, corpus, monkeypatch):
    """train_step with 4 micro-batches of 2 gives the gradients of one batch of 8."""
    grads = {}
    for accum in (1, 4):
        s = prepare(
            tmp_path / f"r{accum}",
            tiny_model(),
            tiny_train(batch_size=8, grad_accum=accum),
            tiny_data(corpus),
            progress=False,
        )

        # Same 8 sequences either way: the micro-batches are drawn one after another.
        def capture(s=s, accum=accum):
            grads[accum] = [p.grad.clone() for p in s.model.parameters()]

        monkeypatch.setattr(s.optimizer, "step", capture)
        train_step(s)
    for a, b in zip(grads[1], grads[4]):
        assert torch.allclose(a, b, atol=1e-6)


def test_interrupt_during_the_update_still_resumes_exactly(tmp_path, corpus, monkeypatch):
    """Ctrl-C arriving inside the optimizer update is held until the step is complete."""
    import os
    import signal

    data = tiny_data(corpus)
    full, cut = tmp_path / "full", tmp_path / "cut"
    attnlab.train(full, tiny_model(dropout=0.1), tiny_train(max_steps=16), data, progress=False)
    s = prepare(cut, tiny_model(dropout=0.1), tiny_train(max_steps=16), data, progress=False)
    real = s.optimizer.step

    def step_with_signal(*args, **kwargs):
        if s.step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, mid-update
        return real(*args, **kwargs)

    monkeypatch.setattr(s.optimizer, "step", step_with_signal)
    with pytest.raises(attnlab.AttnlabError, match="interrupted at step 8"):
        train_mod.loop(s, progress=False)
    attnlab.train(cut, resume=True, progress=False)
    a, b = losses(full), losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, 17))
    assert [a[k] for k in a] == [b[k] for k in a]


def test_train_step_with_accumulation_runs_micro_batches(tmp_path, corpus):
    s = prepare(
        tmp_path / "run", tiny_model(), tiny_train(batch_size=8, grad_accum=4), tiny_data(corpus), progress=False
    )
    before = [p.detach().clone() for p in s.model.parameters()]
    loss = train_step(s)
    assert math.isfinite(loss) and s.step == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, s.model.parameters()))


def test_batch_size_must_divide_into_micro_batches():
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(batch_size=10, grad_accum=4)
    with pytest.raises(ValueError, match="at least 1"):
        TrainConfig(eval_interval=0)


def test_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 110))


def test_weight_decay_only_on_matrices():
    model = attnlab.GPT(tiny_model(vocab_size=20))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert any(p is model.tok.weight for p in no_decay["params"])  # embeddings (and the tied head)
    assert any(p is model.blocks[0].norm_attn.weight for p in no_decay["params"])
    assert any(p is model.blocks[0].attn.qkv_proj.weight for p in decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == model.num_params()


def test_run_directory_contents_and_metrics(tmp_path, corpus):
    run = tmp_path / "run"
    result = attnlab.train(run, tiny_model(), tiny_train(), tiny_data(corpus), progress=False)
    names = {p.name for p in run.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "train_state.safetensors", "metrics.jsonl"} <= names
    assert "loss.png" in names
    assert not [n for n in names if ".tmp" in n]
    config = json.loads((run / "config.json").read_text())
    assert config["family"] == "gpt" and config["model"]["vocab_size"] > 10
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [10, 20]
    assert result["val_loss"] == rows[-1]["val_loss"]
    first, last = losses(run)[1], losses(run)[20]
    assert last < first  # it learns


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")

    def crash(p):
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, crash)
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_evaluation_windows_predict_every_token_once():
    from attnlab.tasks.lm_eval import windows

    arr = np.arange(23)
    chunks = list(windows(arr, block=5, batch_size=2))
    assert [c.shape for c in chunks] == [(2, 6), (2, 6), (1, 3)]
    targets = np.concatenate([c[:, 1:].ravel() for c in chunks])
    assert targets.tolist() == list(range(1, 23))
    inputs_before = [c[r, j] for c in chunks for r in range(len(c)) for j in range(c.shape[1] - 1)]
    assert inputs_before == list(range(22))


def test_activation_checkpointing_recomputes_blocks_and_changes_nothing(tmp_path, corpus):
    """With --grad-checkpoint each block runs twice per step (forward, then again in backward),
    and the losses are those of the plain run."""
    results = {}
    for flag in (False, True):
        s = prepare(
            tmp_path / f"r{flag}", tiny_model(), tiny_train(grad_checkpoint=flag), tiny_data(corpus), progress=False
        )
        calls = []  # a pre-hook: the recompute stops early, before a forward hook would run
        s.model.blocks[0].register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        results[flag] = ([train_step(s) for _ in range(3)], len(calls))
    assert results[False][1] == 3 and results[True][1] == 6
    assert results[False][0] == results[True][0]


@pytest.mark.slow
def test_compiled_model_trains_like_eager(tmp_path, corpus):
    """--compile (torch.compile, ~40 s to compile on 2 cores) gives the eager losses, and its
    checkpoint has no wrapper prefixes in its names."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    attnlab.train(eager, tiny_model(), tiny_train(max_steps=10), tiny_data(corpus), progress=False)
    attnlab.train(compiled, tiny_model(), tiny_train(max_steps=10, compile=True), tiny_data(corpus), progress=False)
    a, b = losses(eager), losses(compiled)
    assert max(abs(a[k] - b[k]) for k in a) < 1e-4
    run = attnlab.load(compiled)  # loads into a plain GPT: names match
    assert not [k for k in run.model.state_dict() if "_orig_mod" in k]


def test_saving_never_touches_the_optimizer_state(tmp_path, corpus):
    """The step-0 checkpoint leaves AdamW without state, so its first update is step 1 (its
    bias correction counts steps), and a checkpoint after training keeps the real step count."""
    s = prepare(tmp_path / "run", tiny_model(), tiny_train(), tiny_data(corpus), progress=False)
    assert not s.optimizer.state
    train_step(s)
    train_mod.save_checkpoint(s)
    assert {float(v["step"]) for v in s.optimizer.state.values()} == {1.0}
