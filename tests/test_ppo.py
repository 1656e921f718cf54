"""attnlab train ppo: GAE, the clipped value loss and the KL-shaped rewards against their formulas
written as loops; a few steps on a tiny chat model and a tiny reward model; exact resume; the
reward-hacking alarm on hand-written evaluations; one-line errors."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import attnlab
from attnlab.data.finetune import ChatData
from attnlab.nn.policy import PolicyLoss, policy_loss
from attnlab.nn.ppo import gae, kl_shaped_rewards, value_loss
from attnlab.tasks.hacking import reward_hacking
from attnlab.tasks.ppo import relative_scores
from tests.conftest import ctrl_c_at, run_cli, tiny_chat_base, tiny_reward_model, tiny_train
from tests.test_old_runs import copied

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = ChatData(examples=32, test_examples=4)
LOGGED = ("reward", "exact", "kl", "answer_length", "clip_frac", "value_loss", "generate_s", "loss")
LENGTHS = [4, 1, 3, 2]  # answers of different lengths, padded to 4


def fixed(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, t = len(LENGTHS), max(LENGTHS)
    mask = torch.tensor([[True] * n + [False] * (t - n) for n in LENGTHS])
    return torch.randn(b, t, generator=g), torch.randn(b, t, generator=g), mask


# ---- the math ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0)])
def test_gae_equals_a_loop_over_time(gamma, lam):
    rewards, values, mask = fixed()
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for i, n in enumerate(LENGTHS):
        a = 0.0
        for t in reversed(range(n)):
            after = values[i, t + 1].item() if t + 1 < n else 0.0  # the episode ends after the last token
            a = rewards[i, t].item() + gamma * after - values[i, t].item() + gamma * lam * a
            assert adv[i, t].item() == pytest.approx(a, abs=1e-5)
            assert ret[i, t].item() == pytest.approx(a + values[i, t].item(), abs=1e-5)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_with_lambda_one_the_return_is_the_sum_of_the_rewards_to_come():
    rewards, values, mask = fixed(1)
    _, ret = gae(rewards, values, mask, 1.0, 1.0)
    for i, n in enumerate(LENGTHS):
        assert ret[i, 0].item() == pytest.approx(rewards[i, :n].sum().item(), abs=1e-5)


def test_the_clipped_value_loss_equals_its_formula_and_clips_exactly_outside_the_range():
    old, returns, mask = fixed(2)
    eps = 0.2
    moves = torch.tensor(
        [[-0.5, -0.2001, -0.1, 0.0], [0.1, 0.0, 0.0, 0.0], [0.1999, 0.2001, 0.7, 0.0], [-0.3, 0.3, 0.0, 0.0]]
    )
    values = (old + moves).requires_grad_(True)
    loss, _ = value_loss(values, old, returns, mask, eps)
    want, count = 0.0, 0
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            v, o, r = values[i, t].item(), old[i, t].item(), returns[i, t].item()
            vc = o + min(max(v - o, -eps), eps)
            want, count = want + 0.5 * max((v - r) ** 2, (vc - r) ** 2), count + 1
    assert loss.item() == pytest.approx(want / count, abs=1e-5)
    loss.backward()
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            v, o, r = values[i, t].item(), old[i, t].item(), returns[i, t].item()
            outside = abs(v - o) > eps
            clipped_worse = (o + max(-eps, min(eps, v - o)) - r) ** 2 > (v - r) ** 2
            # the gradient is zero exactly where the clipped side is taken: outside the range, and worse
            assert (values.grad[i, t].item() == 0) == (outside and clipped_worse), (i, t)
    assert (values.grad[~mask] == 0).all()


def test_kl_shaped_rewards_equal_the_formula():
    logp, ref, mask = fixed(3)
    scores = torch.tensor([1.5, -2.0, 0.25, 3.0])
    beta = 0.05
    got = kl_shaped_rewards(scores, logp, ref, mask, beta)
    for i, n in enumerate(LENGTHS):
        for t in range(max(LENGTHS)):
            want = -beta * (logp[i, t] - ref[i, t]).item() if t < n else 0.0
            want += scores[i].item() if t == n - 1 else 0.0
            assert got[i, t].item() == pytest.approx(want, abs=1e-6)


def test_with_a_group_each_score_counts_against_its_prompts_mean():
    scores = torch.tensor([1.0, 3.0, -2.0, -2.0, 0.5, 4.0])
    assert torch.equal(relative_scores(scores, 1), scores)  # one answer per prompt: the scores themselves
    got = relative_scores(scores, 2)
    want = [1.0 - 2.0, 3.0 - 2.0, 0.0, 0.0, 0.5 - 2.25, 4.0 - 2.25]
    assert got.tolist() == pytest.approx(want)
    assert relative_scores(scores + 7.0, 3).tolist() == pytest.approx(relative_scores(scores, 3).tolist())


def test_the_policy_loss_takes_per_token_advantages():
    """nn/policy.py's surrogate with PPO's (B, T) advantages: an answer's advantage on each of its
    tokens gives the (B,) loss; a token's own changes that token's term alone."""
    logp, old, mask = fixed(4)
    old = logp + 0.1 * old  # ratios near 1
    per_answer = torch.tensor([1.0, -0.5, 2.0, -1.0])
    cfg = PolicyLoss("dapo", 0.2)
    want = policy_loss(logp, old, per_answer, mask, cfg).loss
    per_token = per_answer[:, None].expand(-1, max(LENGTHS)).clone()
    assert policy_loss(logp, old, per_token, mask, cfg).loss.item() == pytest.approx(want.item(), abs=1e-6)
    per_token[0, 2] = 5.0
    ratio = math.exp(logp[0, 2].item() - old[0, 2].item())
    term = lambda a: -min(ratio * a, min(max(ratio, 0.8), 1.2) * a)  # noqa: E731
    shift = (term(5.0) - term(1.0)) / mask.sum().item()
    assert policy_loss(logp, old, per_token, mask, cfg).loss.item() == pytest.approx(want.item() + shift, abs=1e-6)


# ---- the alarm -----------------------------------------------------------------------------------
def test_the_alarm_rings_when_the_score_is_up_and_exact_down_from_the_start_and_not_on_an_honest_run():
    hacking = [(0, 0.1, 0.95), (20, 0.3, 0.975), (40, 0.5, 0.925), (60, 0.9, 0.85), (80, 1.2, 0.80)]
    rang = [reward_hacking(hacking[: k + 1], 2) for k in range(len(hacking))]
    assert [a is not None for a in rang] == [False, False, False, True, False]  # once per streak
    alarm = rang[3]
    assert alarm.step == 60 and alarm.score == (0.1, 0.9) and alarm.exact == (0.95, 0.85)
    line = alarm.line()
    assert "\n" not in line and "step 60" in line and "+0.800" in line and "-10.0 points" in line
    honest = [(0, 0.1, 0.95), (20, 0.3, 0.96), (40, 0.5, 0.94), (60, 0.9, 0.97), (80, 0.8, 0.9), (100, 1.0, 0.95)]
    assert all(reward_hacking(honest[: k + 1], 2) is None for k in range(len(honest)))
    assert reward_hacking(hacking[:3], 1) is not None  # patience 1: the first evaluation up and down rings
    # a hack that lands at once and stays: one step-to-step rise and fall, then flat; against the start, twice
    landed = [(0, -0.183, 0.975), (20, 0.001, 0.975), (40, -0.155, 0.95), (60, -0.155, 0.95)]
    assert reward_hacking(landed, 2) is not None and reward_hacking(landed[:3], 2) is None


# ---- the task ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"), dropout=0.0)


@pytest.fixture(scope="module")
def rm(base, tmp_path_factory):
    return tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", base, examples=16)


def ppo(out, base, rm, steps=4, **options):
    cfg = tiny_train(max_steps=steps, eval_interval=2, batch_size=4, lr=1e-3, warmup_steps=0)
    return attnlab.train(
        out,
        None,
        cfg,
        DATA,
        init=base,
        task="ppo",
        progress=False,
        **{"reward": str(rm), "max_new_tokens": 8, "group": 1, **options},  # test_a_group_... takes a group
    )


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_few_steps_log_finite_metrics_and_score_the_held_out(tmp_path, base, rm):
    result = ppo(tmp_path / "p", base, rm, steps=4)
    steps = [r for r in rows(tmp_path / "p") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert all(math.isfinite(r[k]) for k in LOGGED), r
        assert 0 <= r["exact"] <= 1 and 1 <= r["answer_length"] <= 8 and 0 <= r["clip_frac"] <= 1
    # a rollout every 2 x 2 steps: sampled at steps 1 and 5, its numbers logged with each update
    assert [r["generate_s"] > 0 for r in steps] == [True, False, False, False]
    assert steps[0]["kl"] == pytest.approx(0, abs=1e-5) and steps[1]["reward"] == steps[0]["reward"]
    watched = [r["step"] for r in rows(tmp_path / "p") if "heldout_score" in r]
    assert watched == [1, 3]  # every --eval-interval (2) steps, before the update
    assert result["test"]["examples"] == 4 and 0 <= result["test"]["exact"] <= 1
    assert math.isfinite(result["test"]["reward_score"])
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["task"]["kind"] == "ppo" and config["task"]["ppo_epochs"] == 2
    run = attnlab.load(tmp_path / "p")
    assert run.model.cfg.d_model == 16 and run.task.generates  # a GPT (with its value head) that chats
    before, after = attnlab.load(base).model.state_dict(), run.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert after["reward_head.weight"].abs().sum() > 0  # the value head learned


def test_a_group_samples_that_many_answers_to_each_prompt(tmp_path, base, rm):
    from attnlab.io import read_safetensors

    ppo(tmp_path / "g", base, rm, steps=1, group=3, minibatches=3)
    tensors, _ = read_safetensors(tmp_path / "g" / "ppo_rollout.safetensors")
    assert tensors["ids"].shape[0] == 4 * 3  # --batch-size 4 prompts, 3 answers each
    assert json.loads((tmp_path / "g" / "config.json").read_text())["task"]["group"] == 3


def test_a_resumed_run_is_the_uninterrupted_one_bit_for_bit(tmp_path, base, rm, monkeypatch):
    """6 steps at once, or interrupted before step 3 (mid-way through the first rollout's 4 updates)
    and resumed: the same rollouts, losses, held-out numbers and weights (float32 on the CPU)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    ppo(full, base, rm, steps=6)
    with ctrl_c_at(monkeypatch, 2), pytest.raises(attnlab.AttnlabError, match="interrupted at step 2"):
        ppo(cut, base, rm, steps=6)
    config = json.loads((cut / "config.json").read_text())
    del config["task"]["group"]  # as a run stored before --group: it resumes with one answer a prompt
    (cut / "config.json").write_text(json.dumps(config))
    attnlab.train(cut, task="ppo", resume=True, progress=False)
    a, b = (
        [{k: v for k, v in r.items() if not k.endswith("_per_s") and k != "generate_s"} for r in rows(run)]
        for run in (full, cut)
    )
    assert len(a) >= 6 and a == b and any("heldout_score" in r for r in a[3:])
    wa, wb = attnlab.load(full).model.state_dict(), attnlab.load(cut).model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_stop_on_hacking_ends_the_run_with_one_line(tmp_path, base, rm, monkeypatch):
    import attnlab.tasks.hacking as hacking

    monkeypatch.setattr(hacking, "held_out", lambda *a: next(scores))  # the score rises, exact falls
    scores = iter({"exact": 1 - k / 10, "reward_score": k, "examples": 4} for k in range(10))
    with pytest.raises(hacking.HackingStopped, match="reward hacking.*step 4.*rose.*fell"):
        ppo(tmp_path / "p", base, rm, steps=8, hacking_patience=2, stop_on_hacking=True)
    last = rows(tmp_path / "p")[-1]
    assert last["hacking"] == 1.0 and last["step"] == 5 and last["heldout_score"] == 2


def test_a_missing_reward_is_one_line_from_the_command_line(tmp_path, base, capsys):
    code, _, err = run_cli(["train", "ppo", "--init", base, "--out", tmp_path / "p"], capsys)
    assert code != 0 and "needs --reward RUN" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists()


def test_a_reward_run_of_the_wrong_kind_is_one_line(tmp_path, base, capsys):
    code, _, err = run_cli(["train", "ppo", "--init", base, "--reward", base, "--out", tmp_path / "p"], capsys)
    assert code != 0 and "give a reward run" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_the_help_says_what_ppo_takes(capsys):
    code, out, _ = run_cli(["train", "ppo", "--help"], capsys)
    assert code == 0
    for flag in (
        "--reward",
        "--beta",
        "--gamma",
        "--lam",
        "--ppo-epochs",
        "--minibatches",
        "--value-clip",
        "--vf-coef",
        "--hacking-patience",
        "--stop-on-hacking",
    ):
        assert flag in out


def test_a_resumed_run_takes_the_flags_over_its_own_settings(tmp_path, monkeypatch, capsys):
    """An old ppo run (group 2, stopped mid-way through its first rollout's 4 updates) resumed with
    --group 3 --hacking-patience 3 and its reward run given again by a relative path: the next
    rollout samples groups of 3, and config.json records the new settings."""
    import attnlab.tasks.sampled as sampled

    root = copied(tmp_path)
    groups = []
    real = sampled.draw
    monkeypatch.setattr(sampled, "draw", lambda *a: groups.append(a[2]) or real(*a))
    again = ["--reward", os.path.relpath(root / "reward"), "--group", "3", "--hacking-patience", "3"]
    code, _, err = run_cli(["train", "ppo", "--out", root / "ppo", "--resume", "--max-steps", "5", *again], capsys)
    assert code == 0, err
    assert groups == [3]  # steps 3 and 4 learn from the rollout of step 1; step 5 samples anew
    config = json.loads((root / "ppo" / "config.json").read_text())
    assert (config["options"]["group"], config["options"]["hacking_patience"]) == (3, 3)
    assert config["options"]["reward"] == config["task"]["reward"] == str(root / "reward")


@pytest.mark.parametrize("flag", ["--ppo-epochs 3", "--minibatches 1", "--max-new-tokens 8", "--reward OTHER"])
def test_a_resumed_run_refuses_a_setting_that_would_change_what_it_is(flag, tmp_path, capsys):
    root = copied(tmp_path)
    run = root / "ppo"
    saved = json.loads((run / "config.json").read_text())["task"]
    name, given = flag.split()
    given = str(root / "sft") if given == "OTHER" else given  # another run than the reward model
    before = (run / "metrics.jsonl").read_text()
    code, _, err = run_cli(["train", "ppo", "--out", run, "--resume", "--max-steps", "3", name, given], capsys)
    own = saved[name[2:].replace("-", "_")]
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{name} {given} differs from the run's {own}" in err and f"give {name} {own}" in err
    assert (run / "metrics.jsonl").read_text() == before  # refused before anything was touched
