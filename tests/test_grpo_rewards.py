"""grpo's rewards and data: a verifiable task trains sft and grpo and is scored by its checker, a reward
run's scores and a Python callable's values are the rewards the advantages are made of, and the
mistakes (a run of the wrong kind, a callable that raises or returns no number, a resumed callable
run without its callable) are one line."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
import attnlab.decoding.chat as chat
import attnlab.tasks.grpo as grpo_task
import attnlab.tasks.rewards as rewards
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation, Message
from attnlab.data.finetune import ChatData, held_out, splits
from attnlab.data.instructions import in_test
from attnlab.data.tokenizers import CharTokenizer
from attnlab.tasks.rewards import Asked, Exact, reward_source
from tests.conftest import ctrl_c_at, flags, run_cli, tiny_chat_base, tiny_reward_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")
ADD = ChatData(data="add", level=2, examples=32, test_examples=4)
FAST = [
    *flags(max_steps=2, eval_interval=2, batch_size=2, warmup_steps=0, device="cpu", dtype="float32"),
    *flags(examples=32, test_examples=4),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"), dropout=0.0)


def grpo(out, base, data=ADD, steps=2, **options):
    cfg = tiny_train(max_steps=steps, eval_interval=steps, batch_size=2, lr=1e-3, warmup_steps=0)
    return attnlab.train(
        out, None, cfg, data, init=base, task="grpo", progress=False, **{"group": 3, "max_new_tokens": 6, **options}
    )


def steps(run):
    return [r for r in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


def test_sft_and_grpo_train_on_a_verifiable_task_from_the_command_line(tmp_path, base, capsys):
    sft, rl = tmp_path / "sft", tmp_path / "grpo"
    code, _, err = run_cli(
        ["train", "sft", "--init", base, "--out", sft, "--data", "add", "--level", "2", *FAST], capsys
    )
    assert code == 0, err
    code, _, err = run_cli(
        [
            "train",
            "grpo",
            "--init",
            sft,
            "--out",
            rl,
            "--data",
            "add",
            "--level",
            "2",
            *FAST,
            "--group",
            "2",
            "--max-new-tokens",
            "6",
        ],
        capsys,
    )
    assert code == 0, err
    for run in (sft, rl):
        config = json.loads((run / "config.json").read_text())
        assert config["data"]["data"] == "add" and config["data"]["level"] == 2
        assert json.loads((run / "eval.json").read_text())["examples"] == 4
    assert len(steps(rl)) == 2 and all(0 <= r["exact"] <= 1 for r in steps(rl))
    questions = [c.messages[0].content for c in splits(ADD, "instructions")["train"]]
    assert all(q.startswith("What is ") and " + " in q and len(q) == len("What is 12 + 34?") for q in questions)


def test_a_level_for_the_instructions_and_too_few_questions_are_one_line(tmp_path, base, capsys):
    code, _, err = run_cli(["train", "sft", "--init", base, "--out", tmp_path / "a", "--level", "2"], capsys)
    assert code == 2 and "--level sets a verifiable task's difficulty" in err and "Traceback" not in err
    code, _, err = run_cli(
        ["train", "sft", "--init", base, "--out", tmp_path / "b", "--data", "add", "--level", "1"], capsys
    )
    assert code == 2 and "distinct test add problems at level 1: ask for fewer" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_attnlab_eval_holds_out_the_tasks_own_test_questions_at_the_runs_level():
    convs, split = held_out(ChatData(data="countdown", level=3, test_examples=5))
    assert split == "test" and len(convs) == 5
    assert all(
        len(c.messages[0].content.split(" from ")[1].split()) == 3 and in_test(c.messages[0].content) for c in convs
    )
    other, _ = held_out(ChatData(data="countdown", level=3, test_examples=5), "add")  # another task: its default
    assert all(len(c.messages[1].content) >= 3 and " + " in c.messages[0].content for c in other)


def test_held_out_answers_are_judged_by_the_checker(monkeypatch):
    """Any countdown expression the checker accepts counts right, not only the stored one; a question
    of the same shape in a user's file whose stored answer the checker rejects is compared as text."""
    convs = [
        Conversation((Message("user", "Make 24 from 3 5 8 9."), Message("assistant", "3*8"))),
        Conversation((Message("user", "Make 24 from 3 5 8 9."), Message("assistant", "3*8"))),
        Conversation((Message("user", "What is 2 + 3?"), Message("assistant", "It is 5."))),
        Conversation((Message("user", "What is 2 + 3?"), Message("assistant", "5"))),
    ]
    given = ["9*8/3", "3*8*1", "It is 5.", "5"]  # stored: 3*8; 1 is not given; the file's answer; right
    monkeypatch.setattr(chat, "answers", lambda *a, **kw: given)
    assert chat.right_answers(None, CharTokenizer("0123456789*+/-() .Itis"), ChatTemplate(), convs) == [
        True,
        False,
        True,
        True,
    ]
    assert Exact()([Asked(c.messages[:1], c.messages[1].content) for c in convs], given, 0).tolist() == [1, 0, 1, 1]


def test_a_callable_is_called_with_each_question_and_answer_and_its_values_are_the_rewards(tmp_path, base, monkeypatch):
    calls, made = [], []

    def length(question: str, answer: str) -> float:
        calls.append((question, answer))
        return float(len(answer))

    real = grpo_task.group_advantages
    monkeypatch.setattr(grpo_task, "group_advantages", lambda r, *a: made.append(r.clone()) or real(r, *a))
    grpo(tmp_path / "g", base, reward=length)
    assert len(calls) == 2 * 2 * 3 and len(made) == 2  # 2 steps x 2 prompts x 3 answers
    assert torch.cat(made).tolist() == [len(a) for _, a in calls]
    train = {c.messages[0].content for c in splits(ADD, "instructions")["train"]}
    assert {q for q, _ in calls} <= train
    assert [r["reward"] for r in steps(tmp_path / "g")] == pytest.approx([float(m.mean()) for m in made])
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["task"]["reward"] == "callable:" + length.__qualname__  # its name: config.json holds no code


def test_a_reward_runs_scores_are_the_rewards(tmp_path, base, monkeypatch):
    rm = tiny_reward_model(tmp_path / "rm", base)
    real, scored = rewards.reward_scores, []

    def spy(run, prompts, answers):
        scored.append(real(run, prompts, answers))
        return scored[-1]

    monkeypatch.setattr(rewards, "reward_scores", spy)
    grpo(tmp_path / "g", base, data=ChatData(examples=32, test_examples=4), reward=str(rm))
    assert len(scored) == 2 and all(len(s) == 6 for s in scored)
    assert any(s.unique().numel() > 2 for s in scored)  # a score, not a right-or-wrong
    assert [r["reward"] for r in steps(tmp_path / "g")] == pytest.approx([float(s.mean()) for s in scored])
    assert json.loads((tmp_path / "g" / "config.json").read_text())["task"]["reward"] == str(rm.resolve())


def test_a_reward_run_of_the_wrong_kind_or_no_run_is_one_line(tmp_path, base, capsys):
    for reward, says in [
        (base, "give a reward run (attnlab train reward)"),
        (tmp_path / "nowhere", "choose exact, random or a reward run's folder"),
    ]:
        code, _, err = run_cli(["train", "grpo", "--init", base, "--out", tmp_path / "g", "--reward", reward], capsys)
        assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "g").exists()


def test_a_callable_that_raises_or_returns_no_number_is_one_line_naming_it_and_the_question(tmp_path, base):
    def boom(question, answer):
        raise ZeroDivisionError("no")

    with pytest.raises(
        attnlab.AttnlabError,
        match=r"the reward .*boom raised ZeroDivisionError: no \(question "
        r"'What is \d\d \+ \d\d\?', answer",
    ) as e:
        grpo(tmp_path / "a", base, reward=boom)
    assert "\n" not in str(e.value)
    for value in ("1", float("nan"), None):
        with pytest.raises(attnlab.AttnlabError, match=r"the reward .*<lambda> returned .* for the question 'What"):
            reward_source(lambda q, a, v=value: v)([Asked((Message("user", "What is 1 + 2?"),), "3")], ["3"], 0)


def test_a_resumed_callable_run_needs_its_callable_again(tmp_path, base, monkeypatch):
    def right(question, answer):
        return float(Asked((Message("user", question),), "").right(answer))

    full, cut = tmp_path / "full", tmp_path / "cut"
    grpo(full, base, steps=3, reward=right)
    with ctrl_c_at(monkeypatch, 1), pytest.raises(attnlab.AttnlabError, match="interrupted at step 1"):
        grpo(cut, base, steps=3, reward=right)
    with pytest.raises(attnlab.AttnlabError, match=r"came from the Python function .*right.*reward=.*right\)$"):
        attnlab.train(cut, task="grpo", resume=True, progress=False)
    with ctrl_c_at(monkeypatch, 1), pytest.raises(attnlab.AttnlabError, match="interrupted at step 1"):
        grpo(tmp_path / "exact", base, steps=2)
    with pytest.raises(attnlab.AttnlabError, match="this run's reward is exact: resume it without a reward function"):
        attnlab.train(tmp_path / "exact", task="grpo", resume=True, progress=False, reward=right)
    attnlab.train(cut, task="grpo", resume=True, progress=False, reward=right)
    keep = ("step", "loss", "reward", "answer_length")
    assert [{k: r[k] for k in keep} for r in steps(full)] == [{k: r[k] for k in keep} for r in steps(cut)]
