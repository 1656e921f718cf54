"""attnlab train grpo: a few steps on a tiny chat model log finite metrics; the random control runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

import attnlab
from attnlab.data.finetune import ChatData
from attnlab.tasks.sampled import answer_text
from tests.conftest import ctrl_c_at, run_cli, tiny_chat_base, tiny_train
from tests.test_old_runs import copied

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = ChatData(examples=32, test_examples=4)
LOGGED = ("reward", "exact", "kl", "answer_length", "clip_frac", "generate_s", "loss")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"), dropout=0.0)


def grpo(out, base, steps=2, **options):
    cfg = tiny_train(max_steps=steps, eval_interval=steps, batch_size=2, lr=1e-3, warmup_steps=0)
    return attnlab.train(
        out, None, cfg, DATA, init=base, task="grpo", progress=False, **{"group": 3, "max_new_tokens": 8, **options}
    )


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("options", [dict(loss="grpo"), dict(loss="dapo", beta=0.1, clip_high=0.28, reward="random")])
def test_a_few_steps_log_finite_metrics_and_score_the_held_out(tmp_path, base, options):
    result = grpo(tmp_path / "g", base, steps=3, **options)
    steps = [r for r in rows(tmp_path / "g") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert all(math.isfinite(r[k]) for k in LOGGED), r
        assert 0 <= r["exact"] <= 1 and 1 <= r["answer_length"] <= 8 and r["clip_frac"] <= 0.05
    # the KL is measured against a reference alone; the coin's first step moved the policy off it
    assert (max(r["kl"] for r in steps) > 0) == ("beta" in options) and steps[0]["kl"] < 1e-9
    assert result["test"]["examples"] == 4 and 0 <= result["test"]["exact"] <= 1
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["task"]["kind"] == "grpo" and config["task"]["group"] == 3
    assert attnlab.load(tmp_path / "g").model.cfg.d_model == 16  # a GPT run like sft's


def test_the_weights_move(tmp_path, base):
    grpo(tmp_path / "g", base, steps=2, reward="random")  # a coin: groups of unequal rewards, a gradient
    before, after = attnlab.load(base).model.state_dict(), attnlab.load(tmp_path / "g").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    shares = [r["reward"] * 6 for r in rows(tmp_path / "g") if "reward" in r]  # 2 prompts x 3 answers, 0 or 1 each
    assert len(shares) == 2 and all(abs(x - round(x)) < 1e-5 for x in shares)


def test_a_group_of_one_is_one_line_from_the_command_line(tmp_path, base, capsys):
    code, _, err = run_cli(["train", "grpo", "--init", base, "--out", tmp_path / "g", "--group", "1"], capsys)
    assert code != 0 and "at least 2 answers" in err and "Traceback" not in err
    assert not (tmp_path / "g").exists()


def test_the_exact_reward_reads_the_answer_without_its_end_of_turn():
    from attnlab.data.tokenizers import CharTokenizer

    tok = CharTokenizer("ab<|>imend \n")
    stop = tok.encode("<|im_end|>")
    text = lambda ids: answer_text(tok, [stop], ids)  # noqa: E731  (what sampled.draw hands the rewards)
    assert text(tok.encode(" ab") + stop) == "ab"
    assert text(tok.encode("ab ")) == "ab"  # cut by the length: no end of turn
    assert text(tok.encode("ba") + stop) != "ab"


def test_a_resumed_run_is_the_uninterrupted_one_bit_for_bit(tmp_path, base, monkeypatch):
    """4 steps at once, or interrupted after step 3 and resumed: the same rollouts (their seeds come
    from the run's generator; with --epochs 2 step 4 reuses step 3's rollout, read back from the run's
    folder), losses, rewards and weights (float32 on the CPU)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    grpo(full, base, steps=4, reward="random", beta=0.1, epochs=2)
    with ctrl_c_at(monkeypatch, 3), pytest.raises(attnlab.AttnlabError, match="interrupted at step 3"):
        grpo(cut, base, steps=4, reward="random", beta=0.1, epochs=2)
    attnlab.train(cut, task="grpo", resume=True, progress=False)
    keep = ("step", "loss", "reward", "kl", "answer_length", "clip_frac")
    a, b = ([{k: r[k] for k in keep} for r in rows(run) if "reward" in r] for run in (full, cut))
    assert len(a) == 4 and a == b and a[-1]["kl"] > 0
    logged = [r for r in rows(full) if "reward" in r]
    # each rollout feeds two updates: the second logs the same rollout's reward and spends no time sampling
    assert [r["generate_s"] > 0 for r in logged] == [True, False, True, False]
    assert logged[1]["reward"] == logged[0]["reward"] and logged[3]["answer_length"] == logged[2]["answer_length"]
    wa, wb = attnlab.load(full).model.state_dict(), attnlab.load(cut).model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


GIVEN_AGAIN = ["--group", "3", "--clip", "0.3", "--reward", "exact"]  # exact: the run's own, given again


def test_a_resumed_run_takes_the_flags_over_its_own_settings(tmp_path, monkeypatch, capsys):
    """An old grpo run (group 2) resumed with --group 3 --clip 0.3: the new step samples groups of 3
    and config.json records the new settings (they were read from the run and the flags ignored)."""
    import attnlab.tasks.sampled as sampled

    run = copied(tmp_path) / "grpo"
    groups = []
    real = sampled.draw
    monkeypatch.setattr(sampled, "draw", lambda *a: groups.append(a[2]) or real(*a))
    code, _, err = run_cli(["train", "grpo", "--out", run, "--resume", "--max-steps", "3", *GIVEN_AGAIN], capsys)
    assert code == 0, err
    assert groups == [3]
    config = json.loads((run / "config.json").read_text())
    assert (config["options"]["group"], config["options"]["clip"], config["task"]["group"]) == (3, 0.3, 3)


@pytest.mark.parametrize(
    ("flag", "saved"), [("--epochs 2", "1"), ("--reward random", "exact"), ("--max-new-tokens 8", "4")]
)
def test_a_resumed_run_refuses_a_setting_that_would_change_what_it_is(flag, saved, tmp_path, capsys):
    run = copied(tmp_path) / "grpo"
    before = (run / "metrics.jsonl").read_text()
    code, _, err = run_cli(["train", "grpo", "--out", run, "--resume", "--max-steps", "3", *flag.split()], capsys)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{flag} differs from the run's {saved}" in err and f"give {flag.split()[0]} {saved}" in err
    assert (run / "metrics.jsonl").read_text() == before  # refused before anything was touched
