"""The translate task and its commands: train translate, translate/predict, eval, compare, pictures."""

from __future__ import annotations

import functools
import json

import pytest

from attnlab.cli.main import main
from attnlab.data import parallel
from attnlab.data.parallel import ParallelDataConfig
from attnlab.tasks.translate import scores
from tests.conftest import flags, run_cli

FAST = ("--n-train 400 --max-steps 40 --batch-size 32 --eval-interval 40 --eval-batches 1 --device cpu").split()


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


@pytest.fixture(scope="module")
def numbers_run(tmp_path_factory):
    """A Transformer trained briefly on `numbers` (the command is checked, not the quality)."""
    run = tmp_path_factory.mktemp("tr") / "numbers"
    assert main([str(a) for a in ["train", "translate", "--data", "numbers", "--out", run, *FAST]]) == 0
    return run


def test_train_translate_writes_a_run_with_test_scores(numbers_run):
    result = json.loads((numbers_run / "eval.json").read_text())
    assert result["examples"] == 2000 and 0 <= result["exact_match"] <= 1 and 0 <= result["chrf"] <= 100
    config = json.loads((numbers_run / "config.json").read_text())
    assert config["family"] == "seq2seq" and config["task"]["kind"] == "translate"
    assert config["model"]["norm"] == "post" and config["model"]["label_smoothing"] == 0.1
    assert (numbers_run / "tokenizer_target.json").is_file()  # one tokenizer per side by default


def test_translate_predict_and_attention_picture(numbers_run, capsys, tmp_path):
    code, out, _ = run_cli(["translate", numbers_run, "three hundred forty-two", "--json"], capsys)
    assert code == 0 and isinstance(json.loads(out)["translation"], str)
    code, out2, _ = run_cli(["predict", numbers_run, "three hundred forty-two", "--json"], capsys)
    assert code == 0 and out2 == out  # predict reaches the same function
    png = tmp_path / "align.png"
    code, out, _ = run_cli(["translate", numbers_run, "ninety-seven", "--beam", "3", "--attention", png], capsys)
    assert code == 0 and f"alignment: {png}" in out and png.stat().st_size > 2000


def test_eval_reports_exact_match_bleu_chrf_and_loss(numbers_run, capsys):
    code, out, _ = run_cli(["eval", numbers_run, "--json", "--beam", "2", "--split", "val"], capsys)
    r = json.loads(out)
    assert code == 0 and r["split"] == "val" and r["beam"] == 2 and r["examples"] == 1000
    assert {"exact_match", "bleu", "chrf", "loss"} <= set(r) and r["loss"] > 0


def test_eval_on_a_tsv_file(numbers_run, capsys, tmp_path):
    f = tmp_path / "pairs.tsv"
    f.write_text("one\tun\ntwo\tdeux\n", encoding="utf-8")
    code, out, _ = run_cli(["eval", numbers_run, "--data", f, "--json"], capsys)
    assert code == 0 and json.loads(out)["examples"] == 2


def test_scores_exact_bleu_chrf():
    perfect = scores(["trois cent quarante-deux", "mille"], ["trois cent quarante-deux", "mille"])
    assert perfect["exact_match"] == 1.0 and perfect["chrf"] == pytest.approx(100.0)
    half = scores(["trois cent", "mille"], ["trois cent deux", "mille"])
    assert half["exact_match"] == 0.5 and half["chrf"] < 100


@pytest.mark.parametrize("model", ["rnn-attention", "rnn"])
def test_rnn_models_train_from_a_tsv_file(model, tmp_path, capsys):
    f = tmp_path / "train.tsv"
    f.write_text("".join(f"{w}\t{w[::-1]}\n" for w in ["abc", "hello", "xyz", "attention", "rnn"] * 20))
    run = tmp_path / model
    code, out, _ = run_cli(
        [
            "train",
            "translate",
            "--model",
            model,
            "--data",
            f,
            "--out",
            run,
            *flags(tokenizer="char", split_fraction="0.1", cell="lstm"),
            *FAST[2:],
        ],
        capsys,
    )
    assert code == 0 and "exact match" in out
    assert json.loads((run / "config.json").read_text())["model"]["attention"] == (model == "rnn-attention")
    code, _, err = run_cli(["translate", run, "abc", "--attention", tmp_path / "a.png"], capsys)
    if model == "rnn":  # the plain encoder-decoder has no alignment to draw: one line, exit 2
        assert code == 2 and "no attention" in err and len(err.strip().splitlines()) == 1
    else:
        assert code == 0 and (tmp_path / "a.png").is_file()


def test_flags_of_another_model_and_bad_files_are_one_line_errors(tmp_path, capsys):
    code, _, err = run_cli(["train", "translate", "--out", tmp_path / "r", "--cell", "lstm", *FAST], capsys)
    assert code == 2 and "--cell does not apply to --model transformer" in err
    bad = tmp_path / "bad.tsv"
    bad.write_text("only one side\n")
    code, _, err = run_cli(["train", "translate", "--data", bad, "--out", tmp_path / "r2", *FAST[2:]], capsys)
    assert code == 2 and "bad.tsv" in err and len(err.strip().splitlines()) == 1


def test_compare_translation_table_and_chart(tmp_path, capsys, monkeypatch):
    import attnlab.tasks.compare as cmp
    import attnlab.tasks.translate as tr

    budget = dict(max_steps=10, batch_size=16, eval_interval=10, eval_batches=1, device="cpu", dtype="float32")
    for name in tr.MODELS:  # a short budget: this checks the command, not the scores
        monkeypatch.setitem(tr.TRAIN_DEFAULTS, name, budget)
    monkeypatch.setattr(cmp, "ParallelDataConfig", functools.partial(ParallelDataConfig, n_train=200))
    monkeypatch.setattr(parallel, "TEST_SIZE", 200)  # each model's test scores: 200 pairs decoded, not 2000
    code, out, _ = run_cli(["compare", "--task", "reverse", "--out", tmp_path], capsys)
    assert code == 0 and "exact" in out and "BLEU" in out
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["transformer", "rnn-attention", "rnn"]
    assert all(r["parameters"] > 0 and 0 <= r["exact_match"] <= 1 for r in rows)
    assert (tmp_path / "compare.png").stat().st_size > 1000
