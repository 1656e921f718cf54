"""`attnlab demo --chat` continues where it stopped, Ctrl-C is an interruption (exit 130, one line
saying how to go on), and the long phases of the chain show progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnlab
import attnlab.cli.demo_chat as demo
from attnlab.data.finetune import ChatData, PreferenceData
from attnlab.tasks.sft import EXACT, SupervisedFineTuning
from tests.conftest import ctrl_c_at, quick_stages, run_cli, tiny_chat_base, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"))


@pytest.fixture
def quick(monkeypatch) -> list[tuple[str, bool]]:
    """The chain at a size that runs in seconds; returns the list of (stage, resumed) it trains."""
    quick_stages(monkeypatch, demo, ("SFT_TRAIN", "DPO_TRAIN", "REWARD_TRAIN", "GRPO_CHAIN"), eval_interval=1)
    for name, value in {"TEST": 4, "SAMPLED": 2, "BEST_OF": 2, "EXAMPLES": 48, "PAIRS": 48}.items():
        monkeypatch.setattr(demo, name, value)
    trained, real = [], demo.train

    def train(out, *args, resume=False, **kw):
        trained.append((Path(out).name, resume))
        return real(out, *args, resume=resume, **kw)

    monkeypatch.setattr(demo, "train", train)
    return trained


def said(err: str) -> list[str]:
    """The lines attnlab itself printed to stderr (not the progress bars)."""
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith("attnlab:")]


def test_an_interrupted_chain_continues_where_it_stopped(base, tmp_path, quick, monkeypatch, capsys):
    out = tmp_path / "chat"
    with ctrl_c_at(monkeypatch, 1, "dpo"):
        code, _, err = run_cli(["demo", "--chat", "--base", base, "--out", out], capsys)
    assert code == 130
    assert said(err) == [
        f"attnlab: interrupted at step 1; saved in stage dpo; finished stages are kept. "
        f"Continue with: attnlab demo --chat --out {out}"
    ]
    assert quick == [("sft", False), ("dpo", False)]
    assert EXACT in err and "reference log-probabilities" in err  # sft's final scoring, dpo's reference
    sft_weights = (out / "sft" / "model.safetensors").stat().st_mtime_ns
    quick.clear()
    with monkeypatch.context() as m:  # what the first run measured is read back, never measured again
        m.setattr(demo, "exact_share", lambda *a: pytest.fail("the exact answers before sft were measured again"))
        code, printed, err = run_cli(["demo", "--chat", "--out", out], capsys)  # --base: the chain's own
    assert code == 0, err
    assert quick == [("dpo", True), ("reward", False), ("grpo", False)]
    assert f"resuming {out / 'dpo'} from step 1 of 2" in err
    assert (out / "sft" / "model.safetensors").stat().st_mtime_ns == sft_weights
    assert "kept from an earlier run: before, sft" in printed
    for phase in ("held-out log-probabilities", "scoring the held-out pairs", "best of 2"):
        assert phase in err, phase
    sft_data = json.loads((out / "sft" / "config.json").read_text())["data"]
    assert sft_data["chained"] == demo.CHAINED > 0  # unrelated questions in a row: what later turns need
    record = json.loads((out / demo.CHAIN).read_text())
    assert record["base"] == str(base.resolve()) and set(record["seconds"]) == {
        "before",
        "sft",
        "dpo",
        "reward",
        "best_of",
        "grpo",
    }
    grpo = json.loads((out / "grpo" / "config.json").read_text())
    assert grpo["task"]["reward"] == "exact" and grpo["init"].endswith("sft")  # RL from the sft run
    quick.clear()
    code, again, _ = run_cli(["demo", "--chat", "--out", out], capsys)  # all done: read back, nothing trained
    assert code == 0 and quick == []
    numbers = [line for line in printed.splitlines() if line.startswith(("exact answers on", "held-out", "sampling"))]
    assert len(numbers) == 3 and all(line in again.splitlines() for line in numbers)


def test_a_stage_interrupted_while_scored_is_scored_not_trained_again(base, tmp_path, quick, monkeypatch, capsys):
    out = tmp_path / "chat"
    with monkeypatch.context() as m:
        m.setattr(SupervisedFineTuning, "test_scores", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        code, _, err = run_cli(["demo", "--chat", "--base", base, "--out", out], capsys)
    assert code == 130 and said(err) == [
        f"attnlab: interrupted in stage sft; finished stages are kept. Continue with: attnlab demo --chat --out {out}"
    ]
    assert not (out / "sft" / "eval.json").exists()
    quick.clear()
    with ctrl_c_at(monkeypatch, 0, "dpo"):  # the rerun scores sft, then stops at dpo's first step
        code, _, err = run_cli(["demo", "--chat", "--out", out], capsys)
    assert code == 130 and quick == [("dpo", False)]
    scores = json.loads((out / "sft" / "eval.json").read_text())
    assert scores["split"] == "test" and scores["examples"] == 4 and 0 <= scores["exact"] <= 1


def test_the_chain_never_writes_into_a_folder_of_someone_else(base, tmp_path, capsys):
    theirs = tmp_path / "chat"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    code, _, err = run_cli(["demo", "--chat", "--base", base, "--out", theirs], capsys)
    assert code == 2 and said(err) == [
        f"attnlab: error: {theirs} exists and is not a chat demo's folder (no "
        f"chain.json): choose another --out, e.g. --out {theirs}-2"
    ]
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]
    own = tmp_path / "own"
    own.mkdir()
    (own / demo.CHAIN).write_text(json.dumps({"demo": "chat", "base": None}))
    code, _, err = run_cli(["demo", "--chat", "--base", base, "--out", own], capsys)
    assert code == 2 and f"continues a chain from its own base ({own / 'base'})" in err
    assert [p.name for p in own.iterdir()] == [demo.CHAIN]


def test_ctrl_c_in_attnlab_train_exits_130_with_the_line_that_continues(corpus, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    tiny = (
        "--max-steps 5 --batch-size 2 --eval-interval 5 --device cpu --n-layer 1 "
        "--d-model 16 --n-head 2 --context 16 --tokenizer char --dtype float32 "
        "--warmup-steps 1"
    ).split()
    with ctrl_c_at(monkeypatch, 2, "lm"):
        code, _, err = run_cli(["train", "lm", "--data", corpus, "--out", run, *tiny], capsys)
    assert code == 130
    assert said(err) == [f"attnlab: interrupted at step 2; saved. Continue with: attnlab train lm --out {run} --resume"]
    code, _, err = run_cli(["train", "lm", "--out", run, "--resume"], capsys)
    assert code == 0 and f"resuming {run} from step 2 of 5" in err


def test_dpo_shows_its_reference_and_scoring_phases(base, tmp_path, capsys):
    sft = tmp_path / "sft"
    data = ChatData(examples=48, test_examples=6)
    attnlab.train(sft, None, tiny_train(max_steps=1), data, init=base, task="sft", progress=False)
    capsys.readouterr()
    pairs = PreferenceData(examples=48, test_examples=6)
    attnlab.train(tmp_path / "dpo", None, tiny_train(max_steps=1), pairs, init=sft, task="dpo")
    err = capsys.readouterr().err
    for phase in ("reference log-probabilities", "held-out log-probabilities", EXACT):
        assert f"{phase}: " in err, phase
    attnlab.train(tmp_path / "quiet", None, tiny_train(max_steps=1), pairs, init=sft, task="dpo", progress=False)
    assert "log-probabilities" not in capsys.readouterr().err


def test_the_chains_base_carries_what_sft_teaches_to_later_turns():
    """Rotary positions (a learned position table leaves the offsets of later turns untrained: 0 of 60
    held-out questions right after earlier turns, docs/fine-tuning.md "Turns"), a context of several
    turns, and the fast recipe's optimizer for its pretraining."""
    assert demo.BASE_MODEL.positions == "rope" and demo.BASE_MODEL.context >= 512
    assert demo.BASE_TRAIN["optimizer"] == "muon" and demo.BASE_TRAIN["max_steps"] >= 300


def test_seed_sets_every_stage_s_seed_and_a_chain_keeps_its_own(base, tmp_path, quick, monkeypatch, capsys):
    out = tmp_path / "chat"
    with ctrl_c_at(monkeypatch, 0, "dpo"):
        code, _, _ = run_cli(["demo", "--chat", "--base", base, "--out", out, "--seed", "7"], capsys)
    assert code == 130
    assert json.loads((out / demo.CHAIN).read_text())["seed"] == 7
    assert json.loads((out / "sft" / "config.json").read_text())["train"]["seed"] == 7
    code, _, err = run_cli(["demo", "--chat", "--out", out, "--seed", "8"], capsys)
    assert code == 2 and said(err) == [
        f"attnlab: error: {out} continues a chain with --seed 7: leave --seed out, or give another --out"
    ]
    code, _, err = run_cli(["demo", "--seed", "3"], capsys)
    assert code == 2 and "--seed is for the assistant chain: give --chat too" in err


def test_sampled_answers_have_room_for_the_longest_right_answer_and_its_end_of_turn():
    """A character model writes one token a character: the longest held-out answer and ChatML's end of
    turn must fit in what plain and best-of-8 sampling may write (24 cut "eight eight six<|im_end|>")."""
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.finetune import TEST_SEED
    from attnlab.data.instructions import instructions

    longest = max(len(c.messages[-1].content) for c in instructions("test", demo.TEST, TEST_SEED))
    assert longest + len(ChatTemplate().end_of_turn()) <= demo.SAMPLE_TOKENS
