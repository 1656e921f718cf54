"""The encoder-decoder Transformer and decoding: causality, padding, caches, beam search, references."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.data.batches import BOS_ID, EOS_ID, IGNORE, Pairs
from attnlab.decoding.beam import beam_search, greedy, length_penalty
from attnlab.engine.config import TrainConfig
from attnlab.engine.optim import lr_at
from attnlab.models.seq2seq import PAPER_PARAMS, PRESETS, Seq2Seq, Seq2SeqConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def tiny(norm: str = "post", **kw) -> Seq2Seq:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(
        n_layer=2, n_head=2, d_model=16, d_ff=32, context=32, src_vocab=23, tgt_vocab=19, dropout=0.0, norm=norm, **kw
    )
    return Seq2Seq(cfg).eval()


def batch(b: int = 3, s: int = 7, t: int = 6, pad_from: int | None = 4):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 23, (b, s), generator=g)
    if pad_from is not None:
        src[1, pad_from:] = 0
    tgt = torch.randint(3, 19, (b, t), generator=g)
    tgt[:, 0] = BOS_ID
    return src, tgt


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_is_causal(norm):
    m = tiny(norm)
    src, tgt = batch()
    before = m(src, tgt)
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % 16 + 3  # change target token 4
    after = m(src, changed)
    assert torch.allclose(before[:, :4], after[:, :4], atol=1e-6)  # outputs up to 3 never saw it
    assert not torch.allclose(before[:, 4:], after[:, 4:], atol=1e-4)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_source_padding_changes_nothing(norm):
    m = tiny(norm)
    src, tgt = batch(pad_from=None)
    padded = torch.cat([src, torch.zeros(3, 5, dtype=torch.long)], dim=1)
    assert torch.allclose(m(src, tgt), m(padded, tgt), atol=1e-5)


def test_cross_attention_sums_to_one_over_real_source_tokens():
    m = tiny()
    src, tgt = batch(pad_from=4)
    w = m.alignment(src, tgt)  # (B, L, H, T, S)
    assert w.shape == (3, 2, 2, 6, 7)
    assert torch.allclose(w.sum(-1), torch.ones(3, 2, 2, 6), atol=1e-6)
    assert w[1, ..., 4:].abs().max() == 0  # padded source positions get no attention
    weights = m.attention(src, tgt)
    assert [len(weights[k]) for k in ("encoder", "decoder", "cross")] == [2, 2, 2]
    assert torch.triu(weights["decoder"][0][0, 0], diagonal=1).abs().max() == 0  # causal


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_steps_equal_the_full_pass(norm):
    m = tiny(norm)
    src, tgt = batch()
    full = m(src, tgt)  # (B, T, V)
    state = m.start(src)
    steps = []
    for t in range(tgt.shape[1]):
        logits, state = m.step(tgt[:, t], state)
        steps.append(logits)
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)


def _uncached_greedy(m: Seq2Seq, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding that re-runs the whole target prefix every step (no cache)."""
    out = []
    for row in src:
        ys = [BOS_ID]
        for _ in range(max_len):
            logits = m(row[None], torch.tensor([ys]))[0, -1]
            logits[:EOS_ID] = float("-inf")
            nxt = int(logits.argmax())
            if nxt == EOS_ID:
                break
            ys.append(nxt)
        out.append(ys[1:])
    return out


def test_cached_decoding_equals_uncached():
    m = tiny()
    src, _ = batch()
    assert greedy(m, src, 12) == _uncached_greedy(m, src, 12)


def test_beam_width_one_is_greedy_and_wider_beams_score_no_worse():
    m = tiny("pre")
    src, _ = batch(b=4)
    g = greedy(m, src, 10)
    assert beam_search(m, src, beam=1, max_len=10) == g
    wide = beam_search(m, src, beam=4, max_len=10, alpha=0.0)
    for row, (a, b) in enumerate(zip(g, wide)):
        assert _logprob(m, src[row], b) >= _logprob(m, src[row], a) - 1e-5


@torch.no_grad()
def _logprob(m: Seq2Seq, src: torch.Tensor, ys: list[int]) -> float:
    """log P(ys + EOS | src), or of ys alone when it was cut at max_len without EOS."""
    full = [*ys, EOS_ID] if len(ys) < 10 else ys
    logits = m(src[None], torch.tensor([[BOS_ID, *full[:-1]]]))[0]
    return float(torch.log_softmax(logits, -1)[torch.arange(len(full)), torch.tensor(full)].sum())


class Toy(nn.Module):
    """A hand-built decoder: the next-token distribution depends only on the last token."""

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 8):
        super().__init__()
        self.table, self.vocab = table, vocab

    def start(self, src):
        return _ToyState()

    def step(self, tokens, state):
        rows = []
        for t in tokens.tolist():
            p = torch.full((self.vocab,), 1e-9)
            for tok, q in self.table.get(t, {EOS_ID: 1.0}).items():  # unknown: end here
                p[tok] = q
            rows.append(p.log())
        return torch.stack(rows), state


class _ToyState:
    def select(self, rows):
        return self


def test_beam_search_finds_the_better_sequence_greedy_misses():
    # Greedy takes 3 (0.6), after which every ending is at most 0.6 * 0.5; beam keeps 4 (0.4), which ends at once.
    toy = Toy({BOS_ID: {3: 0.6, 4: 0.4}, 3: {EOS_ID: 0.1, 5: 0.5, 6: 0.4}, 4: {EOS_ID: 1.0}})
    src = torch.ones(1, 3, dtype=torch.long)
    assert greedy(toy, src, 1) == [[3]]
    assert beam_search(toy, src, beam=2, max_len=5, alpha=0.0) == [[4]]


def test_beam_search_waits_for_the_likely_hypothesis_that_ends_late():
    # 4 and 5 end at once (0.2 each) and improbable ones end next; 3 6 7 (0.6) ends last but wins.
    toy = Toy(
        {
            BOS_ID: {3: 0.6, 4: 0.2, 5: 0.2},
            4: {EOS_ID: 1.0},
            5: {EOS_ID: 1.0},
            3: {6: 1.0},
            6: {7: 1.0},
            7: {EOS_ID: 1.0},
        }
    )
    src = torch.ones(2, 3, dtype=torch.long)
    assert beam_search(toy, src, beam=3, max_len=8, alpha=0.0) == [[3, 6, 7]] * 2
    assert beam_search(toy, src, beam=3, max_len=8, alpha=0.6) == [[3, 6, 7]] * 2


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0
    assert math.isclose(length_penalty(7, 0.6), 2.0**0.6)


def test_pairs_batches_teacher_forcing():
    src = {"train": [torch.tensor([5, 6]).numpy(), torch.tensor([7]).numpy()]}
    tgt = {"train": [torch.tensor([8]).numpy(), torch.tensor([9, 10, 11]).numpy()]}
    s, t_in, y = Pairs(src, tgt).collate("train", [0, 1])
    assert s.tolist() == [[5, 6], [7, 0]]
    assert t_in.tolist() == [[BOS_ID, 8, 0, 0], [BOS_ID, 9, 10, 11]]
    assert y.tolist() == [[8, EOS_ID, IGNORE, IGNORE], [9, 10, 11, EOS_ID]]


def test_matches_torch_nn_transformer_layers():
    """Post-norm attnlab == nn.TransformerEncoder/Decoder (norm=None) with the same weights.

    Documented difference: nn.Transformer adds a final LayerNorm after each stack even in
    post-norm; the paper (and attnlab) do not, so the reference stacks are built with norm=None.
    """
    m = tiny("post")
    c, h = 16, 2
    kw = dict(dim_feedforward=32, dropout=0.0, activation="relu", batch_first=True, norm_first=False)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(c, h, **kw), 2, norm=None, enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(c, h, **kw), 2, norm=None)
    for ours, ref in zip(m.encoder, enc.layers):
        _copy(ours.attn, ref.self_attn)
        _copy_rest(ours, ref, [("norm_attn", "norm1"), ("norm_ff", "norm2")])
    for ours, ref in zip(m.decoder, dec.layers):
        _copy(ours.attn, ref.self_attn)
        _copy(ours.cross, ref.multihead_attn)
        _copy_rest(ours, ref, [("norm_attn", "norm1"), ("norm_cross", "norm2"), ("norm_ff", "norm3")])
    enc.eval(), dec.eval()
    src, tgt = batch(pad_from=4)
    x_src = m._embed(m.src_tok, m.src_pos, src)
    x_tgt = m._embed(m.tgt_tok, m.tgt_pos, tgt)
    pad = src == 0
    memory = enc(x_src, src_key_padding_mask=pad)
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    ref = dec(x_tgt, memory, tgt_mask=causal, memory_key_padding_mask=pad)
    ours_mem, mem_mask, _ = m.encode(src)
    ours, _ = m.decode(tgt, ours_mem, mem_mask)
    real = ~pad
    assert torch.allclose(ours_mem[real], memory[real], atol=1e-5)  # padded rows: theirs are not zeroed
    assert torch.allclose(ours, ref, atol=1e-5)


def _copy(ours, ref: nn.MultiheadAttention) -> None:
    # Both stack W_Q, W_K, W_V row-wise, heads contiguous within each: the same layout.
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv_proj.weight)
        ref.in_proj_bias.copy_(ours.qkv_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_rest(ours, ref, norms) -> None:
    with torch.no_grad():
        ref.linear1.weight.copy_(ours.ff.up.weight), ref.linear1.bias.copy_(ours.ff.up.bias)
        ref.linear2.weight.copy_(ours.ff.down.weight), ref.linear2.bias.copy_(ours.ff.down.bias)
        for a, b in norms:
            getattr(ref, b).weight.copy_(getattr(ours, a).weight)
            getattr(ref, b).bias.copy_(getattr(ours, a).bias)


def test_tied_and_shared_embeddings():
    m = tiny(share_embeddings=False)
    assert m.out.weight is m.tgt_tok.weight and m.src_tok is not m.tgt_tok
    torch.manual_seed(0)
    shared = Seq2Seq(Seq2SeqConfig(n_layer=1, n_head=2, d_model=16, src_vocab=30, tgt_vocab=30, share_embeddings=True))
    assert shared.src_tok is shared.tgt_tok and shared.out.weight is shared.src_tok.weight
    with pytest.raises(ValueError, match="one vocabulary"):
        Seq2SeqConfig(src_vocab=30, tgt_vocab=31, share_embeddings=True)


def test_label_smoothing_only_while_training():
    m = tiny(label_smoothing=0.1)
    src, tgt = batch()
    labels = torch.cat([tgt[:, 1:], torch.full((3, 1), EOS_ID)], dim=1)
    logits, eval_loss = m(src, tgt, labels)
    plain = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert torch.isclose(eval_loss, plain)
    m.train()
    _, train_loss = m(src, tgt, labels)
    smoothed = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=0.1)
    assert torch.isclose(train_loss, smoothed, atol=1e-6)


def test_paper_presets_parameter_counts():
    for name, paper in PAPER_PARAMS.items():
        with torch.device("meta"):  # shapes only: the big preset's 213 M weights are never drawn
            n = sum(p.numel() for p in Seq2Seq(PRESETS[name]).parameters())
        assert abs(n - paper) / paper < 0.04, (name, n)


def test_inverse_sqrt_schedule():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100, schedule="inverse_sqrt", max_steps=10_000)
    assert math.isclose(lr_at(99, cfg), 1e-3)  # peak at the end of warmup
    assert math.isclose(lr_at(399, cfg), 0.5e-3)  # 4x the steps: half the rate
    assert lr_at(49, cfg) < lr_at(99, cfg)
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="linear")
