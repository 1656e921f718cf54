"""Rollouts on the one decoding engine: their log-probabilities equal the policy's recomputed ones."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import engine_for
from attnlab.decoding.rollouts import answer_token_logprobs, rollouts
from attnlab.decoding.sampling import stream
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPT
from tests.conftest import perturb, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TOK = CharTokenizer("abcdefgh ?!\n")
PROMPTS = ["ab", "hgfe d", "c"]  # of different lengths


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return perturb(GPT(tiny_model(vocab_size=TOK.vocab_size, context=32)), 0.5)


def test_rollout_logprobs_equal_the_recomputed_ones(model):
    prompts = [TOK.encode(p) for p in PROMPTS]
    r = rollouts(model, prompts, group=4, max_new_tokens=12, seed=5, stops=[TOK.encode("!")])
    assert len(r.answers) == 12 and r.prompts[4] == prompts[1]
    assert any(r.stopped) and any(len(a) < 12 for a in r.answers)  # rows of different lengths
    assert all(a[-1] == TOK.encode("!")[0] for a, s in zip(r.answers, r.stopped) if s)
    assert engine_for(model, "float32").stats["batched rows"] > 0  # decoded together
    b = r.batch()
    with torch.no_grad():
        again = answer_token_logprobs(model, b)
    assert b.mask.sum().item() == sum(len(a) for a in r.answers)
    assert (again - b.old).abs().max().item() <= 1e-5
    assert b.old[b.mask].max().item() < 0 and (b.old[~b.mask] == 0).all()


def test_rows_are_what_the_engine_draws_for_each_seed(model):
    """Row k of the batch is the sequence `stream` draws alone with seed + k: the rollout is the engine's."""
    ids = TOK.encode("ab")
    r = rollouts(model, [ids], group=3, max_new_tokens=10, seed=11)
    for k in range(3):
        assert r.answers[k] == list(stream(model, ids, 10, temperature=1.0, seed=11 + k, dtype="float32"))


def test_the_recomputed_logprobs_carry_the_gradient_and_training_mode_is_kept(model):
    model.train()
    r = rollouts(model, [TOK.encode("a")], group=2, max_new_tokens=5, seed=0)
    assert model.training
    logp = answer_token_logprobs(model.eval(), r.batch())
    logp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(top_k=3), dict(top_p=0.9)])
def test_other_distributions_are_refused(model, kw):
    with pytest.raises(AttnlabError, match="temperature 1"):
        rollouts(model, [TOK.encode("a")], group=2, max_new_tokens=5, draw=Draw(**{"temperature": 1.0, **kw}))


def test_answers_that_cannot_fit_the_context_are_a_one_line_error(model):
    with pytest.raises(AttnlabError, match="context of 32"):
        rollouts(model, [TOK.encode("abcd")], group=2, max_new_tokens=30)
