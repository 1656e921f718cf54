"""The decode step's cheaper path: the token window written in place, no calls to dropout when it
is the identity, positions read as a slice of their table, the bigram's one-token step. Each is
checked against the plain computation it replaces, and the same modules still train."""

from __future__ import annotations

import pytest
import torch

from attnlab.decoding.sampling import stream, stream_rows
from attnlab.models.gpt import GPT
from attnlab.nn.block import Block, BlockConfig
from attnlab.nn.position import LearnedPositions
from tests.conftest import perturb, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

OPTIONS = [
    {},
    dict(positions="rope", qk_norm=True, norm_kind="rmsnorm", activation="relu2"),
    dict(bigram_vocab=53, logit_softcap=5.0, tie_weights=False),
]


def model(**kw) -> GPT:
    torch.manual_seed(0)
    return perturb(GPT(tiny_model(vocab_size=29, context=12, **kw)), 0.3)


def greedy_reference(gpt: GPT, ids: list[int], n: int) -> list[int]:
    """Greedy decoding written plainly: the whole window every step, torch.cat to grow it, and the
    window's jump to its last half when it outgrows the context. On the model's device."""
    ctx, seq, start, out = gpt.cfg.context, torch.tensor([ids], device=gpt.tok.weight.device), 0, []
    with torch.no_grad():
        for _ in range(n):
            if seq.shape[1] - start > ctx:
                start = seq.shape[1] - ctx // 2
            token = gpt(seq[:, start:])[0, -1].argmax()
            seq = torch.cat([seq, token.view(1, 1)], dim=1)
            out.append(int(token))
    return out


@pytest.mark.parametrize("options", OPTIONS, ids=["gpt2", "rope-qknorm", "bigram-softcap"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_stream_is_the_plain_greedy_loop_also_past_the_context(options, use_cache):
    gpt = model(**options)
    want = greedy_reference(gpt, [3, 1, 4, 1, 5], 40)  # 40 > context 12: the window jumps several times
    got = list(stream(gpt, [3, 1, 4, 1, 5], 40, temperature=0, use_cache=use_cache, dtype="float32"))
    assert got == want


def test_a_prompt_of_a_full_context_then_a_jump():
    gpt = model()
    ids = list(range(1, 13))  # exactly the context: the first new token fills the window's spare slot
    assert list(stream(gpt, ids, 9, temperature=0, dtype="float32")) == greedy_reference(gpt, ids, 9)


@pytest.mark.parametrize("options", OPTIONS, ids=["gpt2", "rope-qknorm", "bigram-softcap"])
def test_one_token_steps_give_the_logits_of_the_whole_sequence(options):
    gpt = model(**options)
    ids = torch.randint(0, 29, (3, 10))
    with torch.inference_mode():
        full = gpt(ids)
        caches = gpt.new_caches()
        steps = [gpt(ids[:, :4], caches=caches)]  # the prompt, then one token per step
        steps += [gpt(ids[:, t : t + 1], caches=caches, offset=t) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_the_bigram_cache_keeps_its_own_copy_of_the_last_token():
    gpt = model(bigram_vocab=53)
    ids = torch.tensor([[5, 6, 7]])
    caches = gpt.new_caches()
    with torch.inference_mode():
        gpt(ids, caches=caches)
    ids[0, 2] = 1  # the caller reuses its buffer (as stream_rows does with its window)
    assert caches[0].last_token.tolist() == [[7]]


def test_the_yielded_tokens_are_not_views_of_the_window():
    gpt = model()
    steps = list(stream_rows(gpt, [1, 2], 3, 20, temperature=1.0, seed=0, dtype="float32"))
    assert all(s.shape == (3,) for s in steps)
    assert len({s.data_ptr() for s in steps}) == len(steps)


def test_learned_positions_slice_equals_the_lookup_in_value_and_gradient():
    torch.manual_seed(0)
    pos = LearnedPositions(16, 8)
    x = torch.randn(2, 5, 8)
    out = pos(x, offset=3)
    want = x + pos.embedding(torch.arange(3, 8))
    torch.testing.assert_close(out, want)
    out.square().sum().backward()
    grad = pos.embedding.weight.grad.clone()
    pos.zero_grad()
    want.square().sum().backward()  # the lookup's gradient, into the same table
    torch.testing.assert_close(grad, pos.embedding.weight.grad)
    assert grad[:3].abs().sum() == 0 and grad[8:].abs().sum() == 0
    with pytest.raises(ValueError, match="exceed the context"):
        pos(x, offset=12)


def test_dropout_is_skipped_only_where_it_is_the_identity():
    torch.manual_seed(0)
    block = Block(BlockConfig(d_model=16, n_head=2, d_ff=32, dropout=0.5, causal=True))
    x = torch.randn(2, 6, 16)
    block.train()
    a, b = block(x)[0], block(x)[0]
    assert not torch.allclose(a, b)  # training with p > 0: dropout applied, a new draw each call
    block.eval()
    torch.testing.assert_close(block(x)[0], block(x)[0])
    block.drop.p = block.attn.dropout = 0.0  # residual and attention dropout off: training = eval
    block.train()
    torch.testing.assert_close(block(x)[0], block.eval()(x)[0])


@pytest.mark.parametrize("options", OPTIONS, ids=["gpt2", "rope-qknorm", "bigram-softcap"])
def test_the_model_trains_after_decoding(options):
    """Nothing decoding builds and keeps (rotary tables, say) may be unusable by autograd later:
    the reason decoding runs under no_grad rather than inference_mode."""
    gpt = model(**options)
    list(stream(gpt, [1, 2, 3], 5, temperature=0, dtype="float32"))
    gpt.train()
    ids = torch.randint(0, 29, (2, 8))
    _, loss = gpt(ids, targets=ids)
    loss.backward()
    assert all(p.grad is not None for p in gpt.parameters() if p.requires_grad)
