"""The compiled verify pass (decoding/compiled_verify.py): T tokens of a lone row through the library
give the eager forward's logits at every position and write the caches where the forward writes them,
for float32 and int8-packed weights, at two positions; the decoder takes it only where it can."""

from __future__ import annotations

import pytest
import torch
from test_compiled_decode import gpt2_tied, llama_int8, nano_fast

from attnlab.decoding import compiled
from attnlab.decoding.adapters import LMDecoder
from attnlab.quant.packed import ROW_LIMIT

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = [gpt2_tied, llama_int8, pytest.param(nano_fast, marks=pytest.mark.slow)]  # float32, int8; a bigram


def filled(decoder: LMDecoder, tokens: list[int]) -> list:
    """A row's caches after `tokens`, fed in one eager pass (a prompt)."""
    state = decoder.start(None)
    decoder.feed(state, tokens, 0)
    return state


@pytest.mark.parametrize("make", MODELS)
def test_a_compiled_verify_pass_computes_and_writes_what_the_forward_does(make, monkeypatch):
    monkeypatch.setattr(compiled, "EXPORT", True)
    model = make()
    eager, fast = LMDecoder(model, "float32"), LMDecoder(model, "float32", compiled=True)
    g = torch.Generator().manual_seed(0)
    text = torch.randint(model.cfg.vocab_size, (30,), generator=g).tolist()
    with torch.inference_mode():
        for offset in (4, 21):  # two positions: the keys before the drafts differ in number
            a, b = filled(eager, text[:offset]), filled(fast, text[:offset])
            for t in (2, 5):
                fed = text[offset : offset + t]
                want, got = eager.verify(a, fed, offset), fast.verify(b, fed, offset)
                assert fast.compiled_verify.exported is not None, fast.compiled_verify.failed
                assert got.shape == want.shape == (t, model.cfg.vocab_size)
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (offset, t, (got - want).abs().max())
                end = offset + t
                assert b[0].length == a[0].length == end
                for x, y in zip(a, b, strict=True):  # every layer's keys/values at the positions written
                    assert torch.allclose(y.k[:, :, :end], x.k[:, :, :end], atol=1e-5)
                    assert torch.allclose(y.v[:, :, :end], x.v[:, :, :end], atol=1e-5)
                    assert not y.k[:, :, end:].any()  # nothing past them
                eager.rollback(a, offset, fed[0])
                fast.rollback(b, offset, fed[0])


def test_the_verify_pass_is_eager_where_it_cannot_be_compiled(monkeypatch):
    """One token, more than ROW_LIMIT, or caches not made for the compiled step (the eager decoder's)
    take the forward; no library is made for them."""

    def never(*a, **k):
        raise AssertionError("the compiled verify pass was taken")

    model = gpt2_tied()
    fast = LMDecoder(model, "float32", compiled=True)
    monkeypatch.setattr(fast.compiled_verify, "feed", never)
    context = model.cfg.context
    with torch.inference_mode():
        state = filled(fast, [1, 2, 3])
        assert fast.verify(state, [4], 3).shape == (1, model.cfg.vocab_size)
        fast.rollback(state, 3, 3)
        many = list(range(ROW_LIMIT + 1))
        assert fast.verify(state, many, 3).shape == (ROW_LIMIT + 1, model.cfg.vocab_size)
        assert fast.compiled_verify.usable(filled(fast, list(range(context - 5))), 5, context - 5)  # to its end
        plain = filled(LMDecoder(model, "float32"), [1, 2, 3])  # buffers of the context only
        assert not fast.compiled_verify.usable(plain, 3, 3)
        assert fast.compiled_verify.usable(filled(fast, [1, 2, 3]), 3, 3)
