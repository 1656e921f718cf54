"""--num-samples N: N continuations sampled as one batch, one forward pass per step."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.sampling import next_token, next_tokens, sample_texts, stream, stream_rows
from attnlab.models.gpt import GPT
from tests.conftest import perturb, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TOK = CharTokenizer("abcdefgh ?!\n")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return perturb(GPT(tiny_model(vocab_size=TOK.vocab_size, context=16)), 0.5)


def test_greedy_rows_are_the_one_sequence_greedy_text(model):
    ids = TOK.encode("abc")
    one = list(stream(model, ids, 40, temperature=0, dtype="float32"))  # 40 > context: the window moves too
    rows = torch.stack(list(stream_rows(model, ids, 4, 40, temperature=0, dtype="float32")), 1)  # (4, 40)
    assert all(r.tolist() == one for r in rows)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_seed_gives_the_same_batch_and_rows_differ(model, use_cache):
    kw = dict(num_samples=5, max_new_tokens=30, temperature=1.0, seed=7, use_cache=use_cache, dtype="float32")
    a, b = sample_texts(model, TOK, "ab", **kw), sample_texts(model, TOK, "ab", **kw)
    assert a == b and len(a) == 5 and len(set(a)) > 1


def test_each_row_stops_at_its_own_stop_text(model):
    texts = sample_texts(
        model, TOK, "a", num_samples=8, max_new_tokens=40, temperature=1.0, seed=3, stop="a", dtype="float32"
    )
    free = sample_texts(model, TOK, "a", num_samples=8, max_new_tokens=40, temperature=1.0, seed=3, dtype="float32")
    for cut, whole in zip(texts, free):
        assert "a" not in cut and whole.startswith(cut)
        assert cut == whole.split("a")[0]


def test_batched_draws_follow_each_rows_filter():
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0], [9.0, 0.0, 0.0, 8.9]])
    g = torch.Generator().manual_seed(0)
    drawn = torch.stack([next_tokens(logits, 1.0, 1, None, g) for _ in range(50)])  # top-1: always the best
    assert (drawn[:, 0] == 1).all() and (drawn[:, 1] == 0).all()
    assert next_tokens(logits, 0.0, None, None, None).tolist() == [1, 0]
    assert next_token(logits[1], 0.0, None, None, None) == 0


def test_an_empty_prompt_needs_an_end_of_text_token(model):
    """A converted Llama's tokenizer has no <|endoftext|>: an empty prompt is one line, not a crash
    deep in torch ("Could not infer dtype of NoneType")."""
    from attnlab.errors import AttnlabError

    tok = CharTokenizer("abcdefgh ?!\n")
    tok.eot_id = None
    with pytest.raises(AttnlabError, match="give a prompt"):
        sample_texts(model, tok, "", num_samples=2, max_new_tokens=3, dtype="float32")
    assert len(sample_texts(model, tok, "ab", num_samples=2, max_new_tokens=3, dtype="float32")) == 2
