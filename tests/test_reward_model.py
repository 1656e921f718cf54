"""The reward model's heads (models/reward.py) against their formulas, and its runs old and new."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.data.conversations import Conversation, Message
from attnlab.data.finetune import PreferenceData
from attnlab.data.instructions import preferences
from attnlab.data.supervised import Example, encode
from attnlab.models.gpt import GPT
from attnlab.models.reward import RewardConfig, RewardModel
from attnlab.nn.preference import answer_logprobs
from attnlab.runs.adapted import run_template
from attnlab.tasks import reward
from attnlab.tasks.reward import reward_scores, scores
from tests.conftest import tiny_chat_base, tiny_reward_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(head: str) -> RewardModel:
    torch.manual_seed(0)
    model = RewardModel(RewardConfig(n_layer=2, n_head=2, d_model=32, context=32, vocab_size=20, head=head)).eval()
    with torch.no_grad():  # a head that is not at its init, so every input of it counts
        model.reward_head.weight.normal_()
        model.reward_head.bias.fill_(0.3)
    return model


def rows(lengths: list[int]) -> list[Example]:
    """Random examples of these lengths, each with its last 3 tokens the answer."""
    g = np.random.default_rng(1)
    return [Example(g.integers(0, 20, n), np.arange(n) >= n - 3) for n in lengths]


@pytest.mark.parametrize("head", ["answer", "mean"])
def test_the_answer_heads_are_their_formulas_written_as_a_loop(head):
    model = tiny(head)
    idx = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(2))
    answer = torch.zeros(3, 12, dtype=torch.bool)
    answer[0, 5:9], answer[1, 1:], answer[2, 11] = True, True, True
    with torch.no_grad():
        got = model.score(idx, answer=answer)
        h = model.hidden(idx)[0]  # (B, T, C)
        logp = F.log_softmax(model(idx), dim=-1)  # (B, T, V): row t predicts token t + 1
    w, b = model.reward_head.weight[0], model.reward_head.bias[0]
    for i in range(3):  # r = sum (answer) or mean (mean) over answer tokens t of w . [h_t, log p(x_t | x_<t)] + b
        terms = [w[:-1] @ h[i, t] + w[-1] * logp[i, t - 1, idx[i, t]] + b for t in range(12) if answer[i, t]]
        r = sum(terms) / (len(terms) if head == "mean" else 1)
        assert got[i].item() == pytest.approx(float(r), abs=1e-4)


def test_the_mean_head_has_no_length_term_that_the_summed_one_has():
    """A per-token constant (the bias b: pairs of equal length never see it) is a length term when
    summed, and one constant for every answer when averaged."""
    idx = torch.randint(0, 20, (1, 12), generator=torch.Generator().manual_seed(3)).expand(2, -1)
    short = torch.zeros(2, 12, dtype=torch.bool)
    short[0, 8:10], short[1, 4:10] = True, True  # 2 tokens, 6 tokens: the same tokens at the end
    for head, shift in (("answer", [2.0, 6.0]), ("mean", [1.0, 1.0])):
        model = tiny(head)
        with torch.no_grad():
            before = model.score(idx, answer=short)
            model.reward_head.bias += 1.0
            after = model.score(idx, answer=short)
        assert (after - before).tolist() == pytest.approx(shift, abs=1e-4), head


def test_an_untrained_answer_head_scores_the_policys_log_probability_of_the_answer():
    model = tiny("answer")  # (the mean head's: the same divided by the answer's tokens, by the formula test)
    with torch.no_grad():
        torch.nn.init.zeros_(model.reward_head.bias)
        model.reward_head.weight.zero_()
        model.reward_head.weight[0, -1] = 1.0  # the head's init
        examples = rows([9, 12, 7])
        got = scores(model, examples)
        policy = GPT(model.cfg).eval()
        policy.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("reward_head")})
        for e, r in zip(examples, got, strict=True):
            x, y = torch.from_numpy(e.ids[None, :-1]), torch.from_numpy(np.where(e.trained[1:], e.ids[1:], -1)[None])
            assert r.item() == pytest.approx(answer_logprobs(policy, x, y).item(), abs=1e-4)


@pytest.mark.parametrize("head", ["mean", "answer", "last"])
def test_the_scores_of_a_padded_batch_are_those_of_each_row_alone(head):
    model, examples = tiny(head), rows([5, 11, 8, 3])
    together = scores(model, examples)
    alone = torch.cat([scores(model, [e]) for e in examples])
    assert torch.allclose(together, alone, atol=1e-5) and together.std() > 0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"))


def trained(out, base, **options) -> attnlab.Run:
    return attnlab.load(tiny_reward_model(out, base, **options))


def test_a_reward_run_records_its_head_and_an_old_run_without_one_reads_its_last_token(base, tmp_path):
    new = trained(tmp_path / "new", base)
    assert new.config["model"]["head"] == "mean" and new.model.reward_head.weight.shape[1] == 17
    old = trained(tmp_path / "old", base, head="last")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["model"]["head"]  # a run written before there was a choice of head
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    old = attnlab.load(tmp_path / "old")
    assert old.model.cfg.head == "last" and old.model.reward_head.weight.shape[1] == 16
    prompts, answers = [[Message("user", 'Reverse "abc".')]] * 2, ["cba", "cab"]
    with torch.no_grad():
        old.model.reward_head.weight.normal_()
    got = reward_scores(old, prompts, answers)
    assert got.shape == (2,) and got[0] != got[1]
    for p, a, r in zip(prompts, answers, got, strict=True):  # the last token's hidden state, through the head
        ids = encode(Conversation((*p, Message("assistant", a))), run_template(old.path), old.tokenizer).ids
        with torch.no_grad():
            h = old.model.hidden(torch.from_numpy(ids)[None])[0][0, -1]
            assert r.item() == pytest.approx(old.model.reward_head(h).item(), abs=1e-5)


def test_sampled_negatives_reject_the_policys_own_wrong_answers(base, monkeypatch, tmp_path):
    pairs = preferences("train", 3, 0)
    right = [p.chosen[0].content for p in pairs]
    drawn = ["x", right[0], right[1], right[1], right[2], "y"]  # 2 answers each: wrong first, all right, wrong second
    asked = []

    def sampled(model, tok, template, prompts, seed, temperature, **kw):
        asked.append((prompts, seed, temperature))
        return drawn[seed - 5 : seed - 5 + len(prompts)]

    monkeypatch.setattr(reward, "answers", sampled)
    monkeypatch.setattr(reward, "SAMPLE_CHUNK", 4)  # in chunks, row g seeded seed + g as in one call
    got = reward.sampled_negatives(attnlab.load(base), pairs, 2, seed=5)
    asks = [p.prompt for p in pairs for _ in range(2)]
    assert [prompts for prompts, _, _ in asked] == [asks[:4], asks[4:]]
    assert [(seed, t) for _, seed, t in asked] == [(5, 1.0), (9, 1.0)]
    assert [q.chosen for q in got] == [p.chosen for p in pairs] and [q.prompt for q in got] == [p.prompt for p in pairs]
    assert [q.rejected[0].content for q in got] == ["x", pairs[1].rejected[0].content, "y"]
    monkeypatch.undo()
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n" for _ in range(4)))
    with pytest.raises(attnlab.AttnlabError, match="built-in pairs"):
        attnlab.train(
            tmp_path / "f",
            None,
            tiny_train(max_steps=1),
            PreferenceData(data=str(rows)),
            init=base,
            task="reward",
            progress=False,
            sampled_negatives=1,
        )


def test_a_reward_run_trains_on_sampled_negatives_and_records_how_many(base, tmp_path):
    run = trained(tmp_path / "r", base, sampled_negatives=1)
    assert run.config["task"]["sampled_negatives"] == 1
