"""The RNN encoder-decoder: Bahdanau's alignment by hand, padding, forward == step by step, beam
reordering, learning to copy with each cell and variant, config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.data.batches import BOS_ID, EOS_ID, IGNORE, N_SPECIAL, PAD_ID, Pairs
from attnlab.models.rnn import AdditiveAttention, RNNSeq2Seq, RNNSeq2SeqConfig, additive_attention

V = N_SPECIAL + 6  # six real tokens, ids 3..8
TINY = dict(src_vocab=V, tgt_vocab=V, d_emb=16, d_hidden=24, d_attn=12)
VARIANTS = [(cell, attention) for cell in ("gru", "lstm") for attention in (True, False)]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def tiny(**kw) -> RNNSeq2Seq:
    return RNNSeq2Seq(RNNSeq2SeqConfig(**{**TINY, **kw})).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three pairs of different lengths, so both sides carry padding."""
    src = {"train": [np.array([3, 4, 5, 6]), np.array([7, 8]), np.array([5, 3, 8])]}
    tgt = {"train": [np.array([8, 7]), np.array([4, 5, 6, 3]), np.array([6])]}
    return Pairs(src, tgt).collate("train", [0, 1, 2])


def test_additive_attention_matches_a_hand_computed_example():
    # W (A=2, H=2), U (A=2, C=2), v (A=2); query s (H=2); three source states, the last one padding.
    W, U, v, s = [[0.5, -1.0], [0.25, 0.75]], [[1.0, 0.5], [-0.5, 0.25]], [1.5, -2.0], [0.2, -0.4]
    h, real = [[1.0, 2.0], [-1.0, 0.5], [2.0, -1.0]], [True, True, False]
    # e_j = sum_a v_a tanh((W s)_a + (U h_j)_a), softmax over real j, c = sum_j alpha_j h_j, in plain Python.
    Ws = [sum(W[a][k] * s[k] for k in range(2)) for a in range(2)]
    e = [sum(v[a] * math.tanh(Ws[a] + sum(U[a][k] * h[j][k] for k in range(2))) for a in range(2)) for j in range(3)]
    z = sum(math.exp(e[j]) for j in range(3) if real[j])
    alpha = [math.exp(e[j]) / z if real[j] else 0.0 for j in range(3)]
    c = [sum(alpha[j] * h[j][k] for j in range(3)) for k in range(2)]
    # The same numbers written out, so a mistake in the loops above cannot hide one in the code.
    assert alpha == pytest.approx([0.954949, 0.045051, 0.0], abs=1e-6)
    assert c == pytest.approx([0.909897, 1.932423], abs=1e-6)

    attn = AdditiveAttention(2, 2, 2)
    with torch.no_grad():
        attn.query.weight.copy_(torch.tensor(W))
        attn.key.weight.copy_(torch.tensor(U))
        attn.score.weight.copy_(torch.tensor([v]))
    values, mask = torch.tensor([h]), torch.tensor([real])  # (1, 3, 2), (1, 3)
    context, weights = attn(torch.tensor([s]), attn.key(values), values, mask)
    torch.testing.assert_close(weights, torch.tensor([alpha]), atol=1e-6, rtol=0)
    torch.testing.assert_close(context, torch.tensor([c]), atol=1e-6, rtol=0)
    assert weights[0, 2] == 0  # exactly, not just small
    # The bare function with projected inputs gives the same.
    ctx2, w2 = additive_attention(torch.tensor([Ws]), attn.key(values), values, mask, torch.tensor(v))
    torch.testing.assert_close((ctx2, w2), (context, weights))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_alignment_sums_to_one_over_real_tokens_and_is_zero_on_padding(cell):
    model = tiny(cell=cell)
    src, tgt_in, _ = batch()
    a = model.alignment(src, tgt_in)  # (B, 1, 1, T, S)
    assert a.shape == (3, 1, 1, tgt_in.shape[1], src.shape[1])
    real = (src != PAD_ID)[:, None, None, None, :]  # (B, 1, 1, 1, S)
    assert a.masked_select(~real.expand_as(a)).abs().max() == 0
    torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))


def test_alignment_row_i_is_queried_by_the_top_layer_state_before_step_i():
    model = tiny(n_layer=2)
    src, tgt_in, _ = batch()
    state = model.start(src)
    for i in range(tgt_in.shape[1]):
        query = model.attn.query(state.hidden[-1])  # W s_{i-1}, s_{i-1} the top layer's previous state (B, A)
        _, want = additive_attention(query, state.keys, state.memory, state.mask, model.attn.score.weight[0])
        torch.testing.assert_close(model.alignment(src, tgt_in)[:, 0, 0, i], want)
        _, state = model.step(tgt_in[:, i], state)


def test_plain_variant_has_no_alignment_and_a_fixed_context():
    model = tiny(attention=False)
    src, tgt_in, _ = batch()
    with pytest.raises(ValueError, match="no attention"):
        model.alignment(src, tgt_in)
    state = model.start(src)
    assert state.memory is None and state.keys is None  # the source is only this one vector:
    assert state.summary.shape == (3, TINY["d_hidden"])
    _, after = model.step(tgt_in[:, 0], state)
    assert after.summary is state.summary  # the same at every step
    torch.testing.assert_close(state.summary, state.hidden[-1])  # and the decoder's starting state


@pytest.mark.parametrize("cell, attention", VARIANTS)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_source_padding_changes_nothing(cell, attention, bidirectional):
    model = tiny(cell=cell, attention=attention, bidirectional=bidirectional, n_layer=2)
    with torch.no_grad():
        model.src_embed.weight[PAD_ID].normal_()  # a padding row that is not zero: only packing can hide it
    src, tgt_in, _ = batch()
    padded = torch.cat([src, torch.full((3, 5), PAD_ID)], dim=1)
    torch.testing.assert_close(model(src, tgt_in), model(padded, tgt_in), atol=1e-6, rtol=0)
    if attention:
        a, b = model.alignment(src, tgt_in), model.alignment(padded, tgt_in)
        torch.testing.assert_close(a, b[..., : src.shape[1]], atol=1e-6, rtol=0)
        assert b[..., src.shape[1] :].abs().max() == 0


@pytest.mark.parametrize("cell, attention", VARIANTS)
def test_forward_equals_start_then_step_and_the_loss_is_label_smoothed(cell, attention):
    model = tiny(cell=cell, attention=attention, n_layer=2, dropout=0.0)
    src, tgt_in, labels = batch()
    logits, loss = model(src, tgt_in, labels)
    assert logits.shape == (3, tgt_in.shape[1], V)
    state, steps = model.start(src), []
    for t in range(tgt_in.shape[1]):
        step_logits, state = model.step(tgt_in[:, t], state)
        steps.append(step_logits)
    torch.testing.assert_close(logits, torch.stack(steps, 1), atol=1e-5, rtol=0)
    real = labels != IGNORE
    torch.testing.assert_close(loss, F.cross_entropy(logits[real], labels[real]))  # eval: no smoothing
    model.train()
    _, train_loss = model(src, tgt_in, labels)  # dropout 0: the same logits
    torch.testing.assert_close(train_loss, F.cross_entropy(logits[real], labels[real], label_smoothing=0.1))


@pytest.mark.parametrize("cell, attention", VARIANTS)
def test_select_reorders_every_row_of_the_state(cell, attention):
    model = tiny(cell=cell, attention=attention)
    src, tgt_in, _ = batch()
    rows = torch.tensor([2, 0, 0, 1])  # reorder, repeat (beam search) and keep
    _, state = model.step(tgt_in[:, 0], model.start(src))
    got, _ = model.step(tgt_in[rows, 1], state.select(rows))
    _, alone = model.step(tgt_in[rows, 0], model.start(src[rows]))
    want, _ = model.step(tgt_in[rows, 1], alone)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def greedy(model: RNNSeq2Seq, src: torch.Tensor, max_len: int = 10) -> list[list[int]]:
    """Step-by-step greedy decoding: each row's tokens up to (not including) EOS."""
    state, tokens = model.start(src), torch.full((src.shape[0],), BOS_ID)
    out = []
    for _ in range(max_len):
        logits, state = model.step(tokens, state)
        tokens = logits.argmax(-1)  # (B,)
        out.append(tokens)
    rows = torch.stack(out, 1).tolist()
    return [r[: r.index(EOS_ID)] if EOS_ID in r else r for r in rows]


@pytest.mark.parametrize("cell, attention", VARIANTS)
def test_a_tiny_model_learns_to_copy(cell, attention):
    seqs = [np.array(s) for s in ([3, 4, 5], [6, 7, 8, 3], [5, 5, 8], [8, 7, 6, 5, 4])]
    src, tgt_in, labels = Pairs({"train": seqs}, {"train": seqs}).collate("train", range(4))
    model = RNNSeq2Seq(RNNSeq2SeqConfig(**TINY, cell=cell, attention=attention, dropout=0.0, label_smoothing=0.0))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(300):
        _, loss = model(src, tgt_in, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, loss.item()
    assert greedy(model.eval(), src) == [s.tolist() for s in seqs]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"src_vocab": N_SPECIAL}, "src_vocab"),
        ({"tgt_vocab": 2}, "tgt_vocab"),
        ({"d_hidden": 0}, "d_hidden"),
        ({"n_layer": 0}, "n_layer"),
        ({"d_attn": 0}, "d_attn"),
        ({"cell": "rnn"}, "cell"),
        ({"dropout": 1.0}, "dropout"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
    ],
)
def test_config_errors_name_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        RNNSeq2SeqConfig(**{**TINY, **bad})
