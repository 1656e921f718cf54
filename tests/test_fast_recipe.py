"""The fast recipe end to end: the gpt-nano-fast preset and its training settings, Muon in the
training loop (learning rate, exact resume), and `attnlab compare --task lm`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import attnlab
from attnlab.engine.optim import make_optimizer, set_lr
from attnlab.models.gpt import PRESET_TRAINING, PRESETS
from attnlab.tasks import lm_compare
from tests.conftest import ctrl_c_at, flags, run_cli, tiny_data, tiny_model, tiny_train
from tests.test_train import losses

MUON = dict(optimizer="muon", muon_lr=0.05, schedule="wsd", cooldown=0.5, min_lr=0.0)


def test_the_preset_brings_its_training_settings_and_flags_still_win(tmp_path, corpus, capsys):
    args = [
        "train",
        "lm",
        "--preset",
        "gpt-nano-fast",
        "--data",
        corpus,
        *flags(max_steps=2, batch_size=2, eval_interval=2, eval_batches=1),
    ]
    assert run_cli([*args, "--out", tmp_path / "a"], capsys)[0] == 0
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert {k: config["train"][k] for k in PRESET_TRAINING["gpt-nano-fast"] if k != "batch_size"} == {
        k: v for k, v in PRESET_TRAINING["gpt-nano-fast"].items() if k != "batch_size"
    }
    assert config["train"]["batch_size"] == 2  # the flag over the preset's 32
    assert config["model"]["positions"] == "rope" and config["model"]["bigram_vocab"] == 4096
    assert run_cli([*args, "--optimizer", "adamw", "--out", tmp_path / "b"], capsys)[0] == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["train"]["optimizer"] == "adamw"
    assert run_cli([*args[:4], "--preset", "gpt-nano", *args[4:], "--out", tmp_path / "c"], capsys)[0] == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["train"]["optimizer"] == "adamw"


def test_muon_trains_the_blocks_matrices_at_its_own_rate():
    model = attnlab.GPT(tiny_model(vocab_size=20, tie_weights=False))
    opt = make_optimizer(model, tiny_train(**MUON))
    set_lr(opt, 1e-3)
    by_role = {g["role"]: g for g in opt.param_groups}
    muon = {id(p) for p in by_role["muon"]["params"]}
    assert id(model.blocks[0].attn.qkv_proj.weight) in muon and id(model.blocks[1].ff.down.weight) in muon
    assert id(model.head.weight) in {id(p) for p in by_role["decay"]["params"]}  # the head stays with AdamW
    assert id(model.tok.weight) not in muon and not any(p.dim() < 2 for p in by_role["muon"]["params"])
    assert by_role["muon"]["lr"] == pytest.approx(1e-3 * 0.05 / 3e-3) and by_role["decay"]["lr"] == 1e-3
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params()


def test_muon_runs_resume_exactly(tmp_path, corpus, monkeypatch):
    data = tiny_data(corpus)
    full, half = tmp_path / "full", tmp_path / "half"
    attnlab.train(full, tiny_model(), tiny_train(max_steps=12, **MUON), data, progress=False)
    with ctrl_c_at(monkeypatch, 6), pytest.raises(attnlab.AttnlabError, match="interrupted at step 6"):
        attnlab.train(half, tiny_model(), tiny_train(max_steps=12, **MUON), data, progress=False)
    attnlab.train(half, resume=True, progress=False)
    a, b = losses(full), losses(half)
    assert sorted(a) == list(range(1, 13)) and [a[s] for s in a] == [b[s] for s in a]  # bit for bit
    run_a, run_b = attnlab.load(full), attnlab.load(half)
    idx = torch.randint(0, run_a.tokenizer.vocab_size, (1, 16))
    assert torch.equal(run_a.model(idx), run_b.model(idx))


def test_muon_and_fsdp_do_not_mix():
    with pytest.raises(ValueError, match="ddp"):
        tiny_train(optimizer="muon", parallel="fsdp")


def test_recipes_take_out_one_part_each():
    recipes = lm_compare.recipes()
    assert list(recipes)[:2] == ["gpt-nano", "gpt-nano-fast"]
    assert len(recipes) == 2 + len(lm_compare.PARTS)
    fast_model, fast_train = recipes["gpt-nano-fast"]
    for part, (model_change, train_change) in lm_compare.PARTS.items():
        model, train = recipes[f"- {part}"]
        changed = {k for k in model if model[k] != fast_model[k]} | {k for k in train if train[k] != fast_train.get(k)}
        assert changed == set(model_change) | set(train_change), part  # that part, and nothing else
    assert recipes["gpt-nano"][0] == {**vars(PRESETS["gpt-nano"])}
    with pytest.raises(attnlab.AttnlabError, match="unknown part"):
        lm_compare.recipes(["dropout"])


def test_compare_lm_trains_each_recipe_for_the_budget_and_draws_the_table(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setattr(lm_compare, "EVAL_TOKENS", 300)
    code, out, err = run_cli(
        ["compare", "--task", "lm", "--budget", "1s", "--data", corpus, "--parts", "Muon", "--out", tmp_path], capsys
    )
    assert code == 0, err
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["gpt-nano", "gpt-nano-fast", "- Muon"]
    for r in rows:
        assert r["steps"] >= 1 and r["tokens"] == r["steps"] * 32 * 64 and r["loss"] > 0 and r["other_loss"] > 0
        assert r["train_seconds"] >= 1.0  # stopped by the budget, not by max_steps
    assert rows[1]["vs_fast"] == 0 and rows[2]["vs_fast"] == pytest.approx(rows[2]["loss"] - rows[1]["loss"])
    assert json.loads((tmp_path / "no-Muon" / "config.json").read_text())["train"]["optimizer"] == "adamw"
    assert "gpt-nano-fast" in out and "- Muon" in out and "vs fast" in out
    assert (tmp_path / "compare.png").stat().st_size > 5000
    code, _, err = run_cli(["compare", "--task", "lm", "--budget", "soon", "--out", tmp_path / "x"], capsys)
    assert code != 0 and "time_budget" in err


def test_compare_blocks_reports_total_and_active_parameters(tmp_path, corpus, capsys, monkeypatch):
    assert list(lm_compare.block_recipes()) == [
        "classic block (gpt-nano)",
        "Llama block (llama-nano)",
        "MoE block (moe-nano)",
    ]
    monkeypatch.setattr(lm_compare, "EVAL_TOKENS", 300)
    monkeypatch.setattr(lm_compare, "BLOCKS", {"MoE block": "moe-nano"})  # one short run is enough here
    code, out, err = run_cli(
        ["compare", "--task", "lm", "--blocks", "--budget", "1s", "--data", corpus, "--out", tmp_path], capsys
    )
    assert code == 0, err
    (row,) = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert row["recipe"] == "MoE block (moe-nano)" and row["vs_fast"] == 0
    assert row["active_parameters"] < row["parameters"] and row["tokens_per_s"] > 0
    assert f"{row['active_parameters']:,}" in out and "vs first" in out


def test_the_held_out_corpus_is_pip_found_without_switching_off_setuptools_distutils():
    # A search for "pip" on the import path makes setuptools' finder stand down for the rest of the
    # process; a later `import setuptools` (torch.compile's C++ builder) then failed in the suite.
    code = (
        "from attnlab.tasks.lm_compare import held_out_corpus\n"
        "folder = held_out_corpus()\n"
        "assert folder is not None and (folder / '_internal').is_dir(), folder\n"
        "import setuptools, distutils.core\n"
        "assert '_distutils' in distutils.core.__file__, distutils.core.__file__\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
