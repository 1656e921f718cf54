"""The command line: help generated from the configs, the whole journey, and every error case
ending in one clear line with exit code 2."""

from __future__ import annotations

import collections
import json
import typing
from pathlib import Path

import pytest

from attnlab.cli.main import build_parser
from tests.conftest import TEXT, run_cli, shown

TINY = (
    "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --max-steps 6 "
    "--eval-interval 3 --eval-batches 1 --device cpu"
).split()


def assert_one_line_error(code, err, fragment):
    assert code == 2
    lines = shown(err)  # progress left out: a bar's redraws on a terminal, its lines in a log
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "code.txt"
    path.write_text(TEXT * 30)
    return path


@pytest.fixture
def trained(tmp_path, text, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "lm", "--data", text, "--out", out, *TINY], capsys)
    assert code == 0, err
    return out


def test_help_comes_from_the_config_dataclasses():
    helptext = build_parser()._subparsers._group_actions[0].choices["train"]
    lm = helptext._subparsers._group_actions[0].choices["lm"].format_help()
    for flag in (
        "--n-layer --d-model --norm --positions --lr --warmup-steps --grad-accum "
        "--block-size --dtype --tokenizer --vocab-size --config --resume --force"
    ).split():
        assert flag in lm, flag
    assert "peak learning rate" in lm  # TrainConfig.lr's metadata


def test_the_parser_resolves_each_config_class_once(monkeypatch):
    """Every flag asks its field's type; resolving a class's annotations for each of its fields
    made each command 10x slower to start (125 ms against 10 ms for `attnlab sample`)."""
    from attnlab import config

    calls, real = collections.Counter(), typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda cls, *a, **k: calls.update([cls]) or real(cls, *a, **k))
    config._hints.cache_clear()
    build_parser()
    assert len(calls) > 10 and max(calls.values()) == 1, calls.most_common(3)


def test_train_sample_eval_resume(tmp_path, trained, text, capsys):
    code, out, _ = run_cli(["sample", trained, "--prompt", "def ", "--max-new-tokens", "20", "--seed", "1"], capsys)
    assert code == 0 and out.startswith("def ") and len(out) > 10
    code, out, _ = run_cli(["eval", trained, "--data", text, "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["loss"] > 0 and result["tokens"] > 0
    assert result["perplexity"] == pytest.approx(2.718281828 ** result["loss"], rel=1e-6)
    code, out, _ = run_cli(["eval", trained, "--data", text], capsys)
    assert "bits per char" in out
    code, _, err = run_cli(["train", "lm", "--out", trained, "--resume", "--max-steps", "9"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 9


def test_many_samples_are_drawn_a_batch_at_a_time_with_the_same_texts(trained, capsys, monkeypatch):
    """--num-samples N decodes SAMPLE_BATCH rows at a time (memory bounded however large N is), and
    sample i is the same text whatever the batch it falls in."""
    from attnlab.cli import commands
    from attnlab.decoding import sampling

    args = ["sample", trained, "--prompt", "de", "--max-new-tokens", "8", "--seed", "4", "--num-samples", "5"]
    whole = run_cli(args, capsys)[1]
    batches, real = [], sampling.sample_texts
    monkeypatch.setattr(commands, "SAMPLE_BATCH", 2)
    monkeypatch.setattr(sampling, "sample_texts", lambda *a, **kw: batches.append(kw["num_samples"]) or real(*a, **kw))
    assert run_cli(args, capsys)[1] == whole and batches == [2, 2, 1]
    assert whole.count("-" * 40) == 4


def train_with_toml(tmp_path, text, capsys, toml: str, *more) -> Path:
    """`attnlab train lm --config` a TOML file of `toml`, with the flags `more` after it; the run's folder."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "lm", "--data", text, "--out", out, "--config", cfg, *more], capsys)
    assert code == 0, err
    return out


def test_preset_then_toml_then_flags(tmp_path, text, capsys):
    """defaults < preset < TOML < flags, and widths derived from d_model follow an override."""
    toml = 'preset = "gpt-micro"\n[model]\nn_layer = 1\ncontext = 16\n[train]\nmax_steps = 1\nbatch_size = 2\n'
    out = train_with_toml(tmp_path, text, capsys, toml + "eval_batches = 1\n", "--d-model", "24")
    saved = json.loads((out / "config.json").read_text())["model"]
    assert saved["n_head"] == 6 and saved["n_layer"] == 1 and saved["d_model"] == 24  # preset, TOML, flag
    import attnlab

    assert attnlab.load(out).model.blocks[0].ff.up.out_features == 96  # 4 * 24, not gpt-micro's 1536


def test_resume_keeps_the_runs_settings(trained, capsys):
    before = json.loads((trained / "config.json").read_text())
    code, _, err = run_cli(["train", "lm", "--out", trained, "--resume", "--max-steps", "7"], capsys)
    assert code == 0, err
    after = json.loads((trained / "config.json").read_text())
    assert after["train"] == {**before["train"], "max_steps": 7}
    assert after["model"] == before["model"] and after["data"] == before["data"]
    code, _, err = run_cli(["train", "lm", "--out", trained, "--resume", "--tokenizer", "bpe"], capsys)
    assert_one_line_error(code, err, "cannot change when resuming")


def test_toml_config_and_flag_precedence(tmp_path, text, capsys):
    model = 'preset = "gpt-nano"\n[model]\nn_layer = 1\nd_model = 16\nn_head = 2\ncontext = 16\n'
    train = "[train]\nmax_steps = 2\nbatch_size = 2\neval_interval = 2\neval_batches = 1\nlr = 0.5\n"
    out = train_with_toml(tmp_path, text, capsys, model + train, "--lr", "0.001")
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["n_layer"] == 1 and saved["model"]["context"] == 16
    assert saved["train"]["max_steps"] == 2 and saved["train"]["lr"] == 0.001  # the flag wins


def test_size_json(capsys):
    code, out, _ = run_cli(["size", "--preset", "gpt3-175b", "--json"], capsys)
    e = json.loads(out)
    assert code == 0 and abs(e["params"] / 175e9 - 1) < 0.02


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("missing_data", "data not found"),
        ("empty_data", "empty"),
        ("unknown_preset", "unknown preset"),
        ("unknown_option", "unrecognized arguments"),
        ("bad_value", "expected int"),
        ("fractional_int", "expected int"),
        ("zero_grad_accum", "at least 1"),
        ("bad_dropout", "dropout"),
        ("bad_top_p", "top_p"),
        ("negative_temperature", "temperature"),
        ("force_non_run_dir", "not an attnlab run"),
        ("bad_choice", "is not one of"),
        ("block_beyond_context", "beyond the model's context"),
        ("existing_run", "already exists"),
        ("existing_non_run", "not an attnlab run"),
        ("resume_missing", "not found"),
        ("sample_missing_run", "not found"),
        ("sample_corrupt_run", "corrupt"),
        ("eval_incomplete_run", "missing"),
        ("bad_toml", "not valid TOML"),
        ("size_unknown_preset", "unknown preset"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(case, fragment, tmp_path, text, capsys, request):
    out = tmp_path / "run"
    args = {
        "missing_data": ["train", "lm", "--data", tmp_path / "nope.txt", "--out", out],
        "empty_data": ["train", "lm", "--data", tmp_path / "empty.txt", "--out", out],
        "unknown_preset": ["train", "lm", "--data", text, "--out", out, "--preset", "gpt-9"],
        "unknown_option": ["train", "lm", "--data", text, "--out", out, "--colour", "red"],
        "bad_value": ["train", "lm", "--data", text, "--out", out, "--n-layer", "many"],
        "fractional_int": ["train", "lm", "--data", text, "--out", out, "--n-layer", "3.7"],
        "zero_grad_accum": ["train", "lm", "--data", text, "--out", out, "--grad-accum", "0"],
        "bad_dropout": ["train", "lm", "--data", text, "--out", out, "--dropout", "2"],
        "bad_top_p": ["sample", out, "--top-p", "0"],
        "negative_temperature": ["sample", out, "--temperature", "-1"],
        "force_non_run_dir": ["train", "lm", "--data", text, "--out", tmp_path, "--force", *TINY],
        "bad_choice": ["train", "lm", "--data", text, "--out", out, "--norm", "middle"],
        "block_beyond_context": ["train", "lm", "--data", text, "--out", out, *TINY, "--block-size", "64"],
        "existing_run": ["train", "lm", "--data", text, "--out", "TRAINED", *TINY],
        "existing_non_run": ["train", "lm", "--data", text, "--out", tmp_path, *TINY],
        "resume_missing": ["train", "lm", "--out", tmp_path / "nothing", "--resume"],
        "sample_missing_run": ["sample", tmp_path / "nothing"],
        "sample_corrupt_run": ["sample", out],
        "eval_incomplete_run": ["eval", out, "--data", text],
        "bad_toml": ["train", "lm", "--data", text, "--out", out, "--config", tmp_path / "bad.toml"],
        "size_unknown_preset": ["size", "--preset", "gpt-9"],
    }[case]
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.toml").write_text("[model\nn_layer = ")
    if case in ("sample_corrupt_run", "eval_incomplete_run"):
        trained = request.getfixturevalue("trained")
        if case == "sample_corrupt_run":
            weights = trained / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:100])  # truncated
        else:
            (trained / "tokenizer.json").unlink()
        args[1] = trained
    if "TRAINED" in args:
        args[args.index("TRAINED")] = request.getfixturevalue("trained")
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, fragment)


def test_force_replaces_an_existing_run(tmp_path, trained, text, capsys):
    (trained / "old.txt").write_text("x")
    with pytest.warns(UserWarning, match="kept old.txt"):  # the user's file stays, and is named
        code, _, err = run_cli(["train", "lm", "--data", text, "--out", trained, "--force", *TINY], capsys)
    assert code == 0, err
    assert (trained / "old.txt").read_text() == "x" and (trained / "model.safetensors").exists()
    assert (tmp_path / "code.txt").exists()  # a folder that is not a run is never replaced (see error cases)


def test_python_api_matches_cli_run(trained):
    import torch

    import attnlab

    run = attnlab.load(trained)
    idx = torch.tensor([run.tokenizer.encode("def ")])
    assert run.model(idx).shape == (1, 4, run.tokenizer.vocab_size)
    text = run.generate("def ", max_new_tokens=10, temperature=0)
    assert text.startswith("def ") and text == run.generate("def ", max_new_tokens=10, temperature=0)


def test_a_failed_forced_start_keeps_the_old_run(tmp_path, trained, capsys):
    """--force replaces a run only once the new one is ready: bad data leaves the old run alone."""
    before = (trained / "model.safetensors").read_bytes()
    code, _, err = run_cli(["train", "lm", "--data", tmp_path / "nope.txt", "--out", trained, "--force"], capsys)
    assert_one_line_error(code, err, "data not found")
    assert (trained / "model.safetensors").read_bytes() == before


def test_readme_opens_with_the_two_commands():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "make test" in ci


def test_a_forced_start_that_fails_while_tokenizing_keeps_the_old_run(tmp_path, trained, text, capsys, monkeypatch):
    before = (trained / "model.safetensors").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("attnlab.tasks.lm.build_token_cache", disk_full)
    code, _, err = run_cli(["train", "lm", "--data", text, "--out", trained, "--force", *TINY], capsys)
    assert_one_line_error(code, err, "No space left")
    assert (trained / "model.safetensors").read_bytes() == before
