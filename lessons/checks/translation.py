"""Checks for lesson 3 (translation): teacher forcing, Bahdanau's additive attention."""

from __future__ import annotations

import torch

from attnlab.data.batches import BOS_ID, EOS_ID
from attnlab.models.rnn import additive_attention
from checks._common import WrongAnswer, compare, correct, exercise


@exercise
def check_teacher_forcing(make) -> None:
    """make(target_ids: list[int]) -> (decoder_input, labels): [BOS] + target and target + [EOS]."""
    target = [7, 12, 5, 9]
    answer = make(list(target))
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        raise WrongAnswer("return two lists: (decoder_input, labels)")
    decoder_in, labels = (list(map(int, a)) for a in answer)
    want_in, want_labels = [BOS_ID, *target], [*target, EOS_ID]
    if (decoder_in, labels) == (want_labels, want_in):
        raise WrongAnswer("the two are swapped: the decoder input starts with BOS, the labels end with EOS")
    if decoder_in != want_in:
        hint = (
            " (the input must not end with EOS: nothing is predicted after it)" if decoder_in[-1:] == [EOS_ID] else ""
        )
        raise WrongAnswer(f"decoder input {decoder_in}, expected {want_in}: BOS, then the target{hint}")
    if labels != want_labels:
        raise WrongAnswer(f"labels {labels}, expected {want_labels}: the target shifted left, ending with EOS")
    correct("input = BOS + target, labels = target + EOS: position i predicts token i from tokens before it")


@exercise
def check_additive_attention(attend) -> None:
    """attend(query (B, A), keys (B, S, A), values (B, S, C), mask (B, S), v (A,)) -> (context, weights)."""
    g = torch.Generator().manual_seed(0)
    b, s, a, c = 2, 5, 4, 6
    query, keys, values = (
        torch.randn(b, a, generator=g),
        torch.randn(b, s, a, generator=g),
        torch.randn(b, s, c, generator=g),
    )
    v = torch.randn(a, generator=g)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    answer = attend(query, keys, values, mask, v)
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        raise WrongAnswer("return two tensors: (context (B, C), weights (B, S))")
    context, weights = answer
    want_context, want_weights = additive_attention(query, keys, values, mask, v)
    if isinstance(weights, torch.Tensor) and weights.shape == want_weights.shape:
        hidden = weights[0].isnan().all() or (weights[0] == 0).all()  # row 0 has no padding: all of it masked
        if hidden and (weights[1, :3] == 0).all():
            raise WrongAnswer(
                "row 0 is entirely masked, giving nan: the mask is inverted, it hides the real source "
                "tokens and shows the padding; True marks a real token: fill the scores where the "
                "mask is False (~mask) with -inf"
            )
        if (weights[1, 3:].abs() > 0).any():
            raise WrongAnswer("padding gets weight: set masked scores to -inf before the softmax (row 1, keys 3-4)")
        if not torch.allclose(weights.sum(-1), torch.ones(b), atol=1e-5):
            raise WrongAnswer("the weights of a row do not sum to 1: softmax over the source positions (dim=-1)")
    compare("weights", weights, want_weights)
    compare("context", context, want_context)
    correct("e_j = v . tanh(W s + U h_j), softmax over the real source tokens, context = sum_j a_j h_j")
