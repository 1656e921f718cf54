"""attnlab train lm --init RUN: fine-tuning starts from a GPT run's weights and tokenizer."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors
from attnlab.runs.folder import TOKENIZER, WEIGHTS, read_run_config
from attnlab.tasks import train
from tests.conftest import tiny_data, tiny_model, tiny_train
from tests.test_cli import assert_one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--max-steps", "20", "--warmup-steps", "2", "--batch-size", "4", "--eval-interval", "10", "--eval-batches", "1"]
CPU = ["--device", "cpu", "--dtype", "float32"]
ARCH = ["--preset", "gpt-nano", "--n-layer", "1", "--d-model", "32", "--n-head", "2", "--context", "32"]


@pytest.fixture
def base(tmp_path, corpus, capsys):
    """A tiny trained GPT run (run A), character tokens."""
    a = tmp_path / "a"
    flags = ["--tokenizer", "char", "--max-steps", "60", "--lr", "1e-2"]
    code, _, err = run_cli(["train", "lm", "--data", corpus, "--out", a, *ARCH, *TINY, *CPU, *flags], capsys)
    assert code == 0, err
    return a


def fine_tune(corpus, init, out, capsys, *flags):
    return run_cli(["train", "lm", "--init", init, "--data", corpus, "--out", out, *TINY, *CPU, *flags], capsys)


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_zero_steps_keeps_the_weights_and_tokenizer(base, corpus, tmp_path, capsys):
    b = tmp_path / "b"
    code, _, err = fine_tune(corpus, base, b, capsys, "--max-steps", "0", "--dropout", "0.1")
    assert code == 0, err
    weights_a, _ = read_safetensors(base / WEIGHTS)
    weights_b, meta = read_safetensors(b / WEIGHTS)
    assert meta["step"] == "0" and weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert (b / TOKENIZER).read_text() == (base / TOKENIZER).read_text()
    config, source = read_run_config(b), read_run_config(base)
    assert config["init"] == str(base) and config["family"] == "gpt"
    assert config["model"] == {**source["model"], "dropout": 0.1}  # the one model setting that may change
    assert config["data"]["tokenizer"] == "char" and config["data"]["data"] == str(corpus)


def test_fine_tuning_starts_where_the_run_left_off(base, corpus, tmp_path, capsys):
    code, _, err = fine_tune(corpus, base, tmp_path / "b", capsys, "--max-steps", "3")
    assert code == 0, err
    code, _, err = run_cli(
        ["train", "lm", "--data", corpus, "--out", tmp_path / "fresh", *ARCH, *TINY, *CPU, "--max-steps", "1"], capsys
    )
    assert code == 0, err
    a_val = [r["val_loss"] for r in metrics(base) if "val_loss" in r][-1]
    first = metrics(tmp_path / "b")[0]
    fresh = metrics(tmp_path / "fresh")[0]
    vocab = read_run_config(base)["model"]["vocab_size"]
    assert first["step"] == 1 and first["loss"] < a_val + 0.5
    assert fresh["loss"] > math.log(vocab) - 0.5 > first["loss"] + 0.5  # a fresh model starts near ln(vocab)


@pytest.mark.parametrize(
    "flags",
    [
        ["--n-layer", "2"],
        ["--d-model", "64"],
        ["--preset", "gpt-nano"],
        ["--tokenizer", "bpe"],
        ["--vocab-size", "300"],
    ],
)
def test_flags_that_conflict_with_init_are_refused(base, corpus, tmp_path, capsys, flags):
    code, _, err = fine_tune(corpus, base, tmp_path / "b", capsys, *flags)
    assert_one_line_error(code, err, "--init takes the model and tokenizer")
    assert flags[0] in err and not (tmp_path / "b").exists()


def test_library_refuses_another_architecture(base, corpus, tmp_path):
    with pytest.raises(AttnlabError, match=r"--init takes the model and tokenizer of .*: drop --n-layer"):
        train(tmp_path / "b", tiny_model(n_layer=3), tiny_train(), tiny_data(corpus), progress=False, init=base)


def test_init_needs_a_gpt_run(tmp_path, corpus, capsys):
    bow = tmp_path / "bow"
    code, _, err = run_cli(
        ["train", "classify", "--model", "bow", "--out", bow, "--max-steps", "3", "--device", "cpu"], capsys
    )
    assert code == 0, err
    code, _, err = fine_tune(corpus, bow, tmp_path / "b", capsys)
    assert_one_line_error(code, err, "needs a gpt run")
    code, _, err = fine_tune(corpus, tmp_path / "nothing", tmp_path / "b", capsys)
    assert_one_line_error(code, err, "run directory not found")
    assert not (tmp_path / "b").exists()


def test_resume_of_a_fine_tuned_run(base, corpus, tmp_path, capsys):
    b = tmp_path / "b"
    code, _, err = fine_tune(corpus, base, b, capsys, "--max-steps", "3")
    assert code == 0, err
    code, _, err = run_cli(["train", "lm", "--out", b, "--resume", "--max-steps", "5"], capsys)
    assert code == 0, err
    assert [r["step"] for r in metrics(b) if "loss" in r] == [1, 2, 3, 4, 5]
    assert read_run_config(b)["init"] == str(base)  # still says where it came from
    _, meta = read_safetensors(b / WEIGHTS)
    assert meta["step"] == "5"
    # The command that started it, --resume appended: its --init names the run it came from, so it passes.
    code, _, err = fine_tune(corpus, base, b, capsys, "--max-steps", "7", "--resume")
    assert code == 0, err
    assert f"resuming {b} from step 5 of 7" in err
    code, _, err = run_cli(["train", "lm", "--out", b, "--resume", "--max-steps", "9", "--init", b], capsys)
    assert_one_line_error(code, err, f"--init {b} differs from the run's --init {base}")


def test_init_from_a_converted_huggingface_gpt2(tmp_path, corpus, capsys):
    """A converted GPT-2 whose embedding has padding rows beyond its tokenizer keeps them."""
    pytest.importorskip("transformers")
    from attnlab.interop.convert import convert_from_hf
    from tests.test_convert_gpt2 import save_hf

    save_hf(tmp_path / "hf", "n_inner")
    convert_from_hf(tmp_path / "hf", tmp_path / "gpt2")
    code, _, err = fine_tune(corpus, tmp_path / "gpt2", tmp_path / "b", capsys, "--max-steps", "2")
    assert code == 0, err
    source, config = read_run_config(tmp_path / "gpt2"), read_run_config(tmp_path / "b")
    assert config["model"] == source["model"] and config["data"]["tokenizer"] == "bpe"
    assert (tmp_path / "b" / TOKENIZER).read_text() == (tmp_path / "gpt2" / TOKENIZER).read_text()
    assert [r["step"] for r in metrics(tmp_path / "b") if "loss" in r] == [1, 2]
