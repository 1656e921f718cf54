"""The seams hold: a family and a task added from this file alone train, load and predict through
the library and the command line; and every task that trains resumes exactly."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab
import attnlab.engine.loop as loop_mod
from attnlab.config import option
from attnlab.data import DataConfig, parallel
from attnlab.data.finetune import ChatData, PreferenceData
from attnlab.data.images import ImageDataConfig
from attnlab.data.labeled import LabeledDataConfig
from attnlab.data.parallel import ParallelDataConfig
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.engine.train import run as run_task
from attnlab.models import FAMILIES, build_model
from attnlab.runs.marker import owned
from attnlab.tasks import TASKS, task_of
from attnlab.tasks.base import ModelChoice, Task
from attnlab.tasks.request import python_request
from tests.conftest import flags, run_cli, tiny_chat_base

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- a toy family and a toy task, registered from here -------------------------------------------


@dataclass
class ToyConfig:
    vocab: int = option(10, "digits")
    width: int = option(8, "embedding width")


class ToyModel(nn.Module):
    """Bag of digit embeddings -> is the sum of the digits even or odd."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.out = nn.Linear(cfg.width, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.out(self.embed(x).mean(1))  # (B, 2)
        return logits if labels is None else (logits, F.cross_entropy(logits, labels))


@dataclass
class ParityData:
    length: int = option(5, "digits per example")


class ParityBatches:
    per_example = (5, "digits")

    def __init__(self, length: int):
        self.length = length

    def batch(self, split, n, rng, part):
        x = torch.from_numpy(rng.integers(0, 10, size=(n, self.length)))
        return x, x.sum(1) % 2

    def has(self, split):
        return split == "val"

    def describe(self):
        return "random digits"


class Parity(Task):
    name = "parity"
    help = "toy: is the sum of the digits even"
    models = {"toy": ModelChoice("toy", ToyConfig)}
    default_model = "toy"
    data_config = ParityData
    tokenized = False
    noun = "a parity"

    def prepare(self, req: TrainRequest, d) -> Prepared:
        cfg = ToyConfig(**req.model_config)
        config = {
            "family": "toy",
            "model": vars(cfg),
            "train": vars(req.train),
            "data": vars(req.data),
            "task": {"kind": self.name},
        }
        return Prepared(ParityBatches(req.data.length), lambda: build_model("toy", cfg), config)

    def predict(self, run, text, options):
        x = torch.tensor([[int(c) for c in text]])
        return {"odd": bool(run.model(x).argmax(-1))}

    def show_prediction(self, result):
        return "odd" if result["odd"] else "even"


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FAMILIES, "toy", (ToyConfig, ToyModel))
    monkeypatch.setitem(TASKS, "parity", Parity())


def test_a_family_and_task_from_outside_train_load_and_predict(toy, tmp_path, capsys):
    train = TrainConfig(max_steps=3, batch_size=4, eval_interval=3, eval_batches=1, warmup_steps=1, device="cpu")
    result = attnlab.train(tmp_path / "lib", ToyConfig(width=6), train, ParityData(), task="parity", progress=False)
    assert result["step"] == 3 and result["val_loss"] is not None
    run = attnlab.load(tmp_path / "lib")
    assert isinstance(run.model, ToyModel) and run.model.cfg.width == 6 and run.task is TASKS["parity"]
    assert run.tokenizer is None and run.step == 3
    assert run.task.predict(run, "1234", {}) in ({"odd": True}, {"odd": False})
    # The command line is built from the registry: the new task has its own `train` sub-command.
    code, _, err = run_cli(
        [
            "train",
            "parity",
            "--out",
            tmp_path / "cli",
            *flags(max_steps=3, batch_size=4, eval_interval=3, length=7, device="cpu"),
        ],
        capsys,
    )
    assert code == 0, err
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert config["data"] == {"length": 7} and task_of(config) is TASKS["parity"]
    code, out, _ = run_cli(["predict", tmp_path / "cli", "1234567"], capsys)
    assert code == 0 and out.strip() in ("odd", "even")
    code, _, err = run_cli(["train", "parity", "--out", tmp_path / "cli", "--resume", "--max-steps", "5"], capsys)
    assert code == 0, err
    assert attnlab.load(tmp_path / "cli").step == 5


def test_a_task_without_hooks_answers_in_one_line(toy, tmp_path, capsys):
    train = TrainConfig(max_steps=1, batch_size=2, eval_interval=1, eval_batches=1, warmup_steps=0, device="cpu")
    attnlab.train(tmp_path / "r", None, train, None, task="parity", progress=False)
    capsys.readouterr()
    code, _, err = run_cli(["eval", tmp_path / "r"], capsys)
    assert code == 2 and "a parity run" in err and len(err.strip().splitlines()) == 1


# ---- exact resume, every task -------------------------------------------------------------------


def losses(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


TINY = dict(max_steps=12, batch_size=8, eval_interval=6, eval_batches=1, warmup_steps=2, device="cpu", dtype="float32")


def case(name: str, tmp_path):
    """(task, model, model fields, data[, request extras]) of a small run of each task, with dropout on."""
    if name in ("sft-lora", "dpo"):  # from a base; LoRA's own dropout on, and the base's
        base = tiny_chat_base(tmp_path)
        if name == "dpo":
            return (
                "dpo",
                "gpt",
                {},
                PreferenceData(examples=40, test_examples=4),
                dict(init=base, options={"beta": 0.5}),
            )
        options = {"lora_rank": 2, "lora_dropout": 0.1, "lora_targets": ("q", "v", "down")}
        return "sft", "gpt", {}, ChatData(examples=40, test_examples=4), dict(init=base, options=options)
    if name == "mlm":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    pass\n" * 200)  # a val split too
        data = DataConfig(data=str(corpus), tokenizer="word", vocab_size=64)
        fields = dict(n_layer=1, n_head=2, d_model=16, context=32, dropout=0.1)
        return "mlm", "encoder", fields, data
    if name in ("classify", "tag"):
        data = LabeledDataConfig(data="sentiment" if name == "classify" else "tagging", max_len=32)
        return name, "encoder", dict(preset="encoder-tiny", n_layer=1, d_model=16, dropout=0.1), data
    if name == "translate":
        data = ParallelDataConfig(data="reverse", n_train=100, max_len=32, vocab_size=40)
        return "translate", "transformer", dict(n_layer=1, d_model=16, n_head=2, d_ff=32, dropout=0.1), data
    return "image", "vit", dict(n_layer=1, d_model=16, n_head=2, dropout=0.1), ImageDataConfig(data="digits")


@pytest.mark.parametrize("name", ["classify", "tag", "mlm", "translate", "image", "sft-lora", "dpo"])
def test_every_task_resumes_exactly(name, tmp_path, monkeypatch):
    """Interrupt a 12-step run twice, by a real Ctrl-C during the validation pass of step 6 and in
    the middle of step 8, resuming each time: the same losses, validation rows and weights, bit for
    bit, as 12 uninterrupted steps (float32 on the CPU; dropout on, so every RNG must return)."""
    monkeypatch.setattr(parallel, "TEST_SIZE", 100)  # translate's test scores: 100 pairs decoded, not 2000
    task, model, fields, data, *extras = case(name, tmp_path)
    block = {"block_size": 16} if task == "mlm" else {}
    full, cut = tmp_path / "full", tmp_path / "cut"

    def request(out, **kw):
        return python_request(
            TASKS[task],
            out,
            model,
            dict(fields),
            TrainConfig(**TINY, **block),
            data,
            progress=False,
            **kw,
            **(extras[0] if extras else {}),
        )

    run_task(TASKS[task], request(full))
    real_step, real_estimate = loop_mod.train_step, loop_mod.estimate_loss

    def ctrl_c_in_validation(s, *args):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the validation pass runs
        return real_estimate(s, *args)

    monkeypatch.setattr(loop_mod, "estimate_loss", ctrl_c_in_validation)
    with pytest.raises(attnlab.AttnlabError, match=f"interrupted at step 6.*attnlab train {task} "):
        run_task(TASKS[task], request(cut))
    monkeypatch.setattr(loop_mod, "estimate_loss", real_estimate)

    def interrupted(s):
        if s.step == 7:  # Ctrl-C after the first micro-batch of step 8 was drawn
            s.data.batch("train", 2, s.rng, (0, 1))
            torch.rand(3)
            raise KeyboardInterrupt
        return real_step(s)

    monkeypatch.setattr(loop_mod, "train_step", interrupted)
    with pytest.raises(attnlab.AttnlabError, match="interrupted at step 7"):
        run_task(TASKS[task], python_request(TASKS[task], cut, resume=True, progress=False))
    monkeypatch.setattr(loop_mod, "train_step", real_step)
    result = run_task(TASKS[task], python_request(TASKS[task], cut, resume=True, progress=False))
    a, b = losses(full), losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    assert [a[k] for k in a] == [b[k] for k in a]  # bit for bit
    assert validation_rows(full) == validation_rows(cut) and [r["step"] for r in validation_rows(cut)] == [6, 12]
    wa, wb = attnlab.load(full).model.state_dict(), attnlab.load(cut).model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    if "test" in result:  # the resumed run is scored as the uninterrupted one was
        assert json.loads((full / "eval.json").read_text()) == json.loads((cut / "eval.json").read_text())
    for run in (full, cut):  # the marker lists every file of the run: --force would remove them all
        assert owned(run) == {p.name for p in run.iterdir()}


def validation_rows(run) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]


@pytest.mark.parametrize("name", ["classify", "translate", "image", "mlm"])
def test_every_task_starts_from_an_init_run(name, tmp_path, monkeypatch):
    """--init: a new run starts from another run's weights (and tokenizer), then trains on."""
    monkeypatch.setattr(parallel, "TEST_SIZE", 100)  # translate's test scores: the weights are checked here
    task, model, fields, data = case(name, tmp_path)
    train = TrainConfig(**{**TINY, "max_steps": 2}, **({"block_size": 16} if task == "mlm" else {}))
    base = tmp_path / "base"
    if task == "classify":  # an encoder's body comes from a masked LM
        _, _, mlm_fields, corpus = case("mlm", tmp_path)
        run_task(TASKS["mlm"], python_request(TASKS["mlm"], base, "encoder", mlm_fields, train, corpus, progress=False))
        data = LabeledDataConfig(data=str(write_labeled(tmp_path)), max_len=24)
    else:
        run_task(TASKS[task], python_request(TASKS[task], base, model, fields, train, data, progress=False))
    run_task(
        TASKS[task], python_request(TASKS[task], tmp_path / "ft", model, {}, train, data, init=base, progress=False)
    )
    a, b = attnlab.load(base).model.state_dict(), attnlab.load(tmp_path / "ft").model.state_dict()
    body = [k for k in b if k in a and not k.startswith(("out.", "transform"))]
    assert body and all(a[k].shape == b[k].shape for k in body)
    moved = np.mean([float((a[k] - b[k]).abs().max()) for k in body])
    assert 0 < moved < 0.1  # started from the init weights, then trained two small steps
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["init"] == str(base)


def write_labeled(tmp_path):
    path = tmp_path / "labeled.tsv"
    rows = ["text\tlabel"] + [f"def add a b {i}\tpos" if i % 2 else f"class Point pass {i}\tneg" for i in range(80)]
    path.write_text("\n".join(rows) + "\n")
    return path
