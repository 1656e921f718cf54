"""Checks for lesson 11 (finding the mechanism): explained variance, CE loss recovered, a patching
effect, attribution patching's estimate, which head is the induction head."""

from __future__ import annotations

import torch

from attnlab.interpret.sae_train import ce_loss_recovered
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


@exercise
def check_explained_variance(my_explained_variance) -> None:
    """my_explained_variance(x (n, D), x_hat (n, D)) -> a float: 1 - SSE / total sum of squares."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=g) + 3.0  # far from zero: centring matters
    x_hat = x + 0.5 * torch.randn(50, 6, generator=g)
    want = 1 - float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    got = float(my_explained_variance(x, x_hat))
    if abs(got - want) > 1e-4:
        if abs(got - (1 - float((x - x_hat).pow(2).sum() / x.pow(2).sum()))) < 1e-4:
            raise WrongAnswer(
                "divided by the sum of x^2: centre x first (x - x.mean(0)), or a constant offset counts as explained"
            )
        if abs(got - float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())) < 1e-4:
            raise WrongAnswer("that is the share left unexplained: 1 minus it")
        raise WrongAnswer(f"got {got:.4f}, expected {want:.4f}")
    correct("1 - sum (x - x_hat)^2 / sum (x - mean)^2: the share of the variance the reconstruction keeps")


@exercise
def check_ce_loss_recovered(my_ce_loss_recovered) -> None:
    """my_ce_loss_recovered(clean, sae, zero) -> (zero - sae) / (zero - clean)."""
    cases = [(1.2, 1.5, 4.0), (2.0, 2.0, 3.0), (1.0, 3.5, 3.0)]
    for clean, sae, zero in cases:
        want, got = ce_loss_recovered(clean, sae, zero), float(my_ce_loss_recovered(clean, sae, zero))
        if abs(got - want) > 1e-6:
            if abs(got - (sae - clean) / (zero - clean)) < 1e-6:
                raise WrongAnswer(
                    "that is the share lost: recovered is 1 when the SAE costs nothing "
                    "(sae == clean), (zero - sae) / (zero - clean)"
                )
            raise WrongAnswer(f"for clean {clean}, sae {sae}, zero {zero}: got {got:.4f}, expected {want:.4f}")
    correct("(CE_zero - CE_sae) / (CE_zero - CE_clean): 1 = as good as the layer itself, 0 = as bad as nothing")


@exercise
def check_patching_effect(my_patching_effect) -> None:
    """my_patching_effect(patched, clean, corrupt) -> (patched - corrupt) / (clean - corrupt)."""
    for patched, clean, corrupt in [(-1.0, -0.5, -4.0), (2.0, 8.0, -1.0), (0.3, 1.0, 1.5)]:
        want, got = (patched - corrupt) / (clean - corrupt), float(my_patching_effect(patched, clean, corrupt))
        if abs(got - want) > 1e-6:
            if abs(got - (patched - clean) / (clean - corrupt)) < 1e-6:
                raise WrongAnswer(
                    "measured from the clean run: the effect counts from the corrupted run, "
                    "(patched - corrupt), 0 for a site that changes nothing"
                )
            if abs(got - (patched - corrupt)) < 1e-6:
                raise WrongAnswer("not normalised: divide by the whole difference (clean - corrupt)")
            raise WrongAnswer(f"for {patched}, {clean}, {corrupt}: got {got:.4f}, expected {want:.4f}")
    correct("(m_patched - m_corrupt) / (m_clean - m_corrupt): 1 when the site alone brings the clean answer back")


@exercise
def check_atp(my_atp) -> None:
    """my_atp(clean_act (T, C), corrupt_act (T, C), grad (T, C)) -> (T,): sum_c (clean - corrupt) * grad."""
    g = torch.Generator().manual_seed(1)
    clean, corrupt, grad = (torch.randn(5, 8, generator=g) for _ in range(3))
    got = as_tensor(my_atp(clean, corrupt, grad), "my_atp(clean_act, corrupt_act, grad)")
    want = ((clean - corrupt) * grad).sum(-1)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        if torch.allclose(got, -want, atol=1e-5):
            raise WrongAnswer("the sign: patching moves the activation from corrupt to clean, (clean - corrupt)")
        if torch.allclose(got, (clean * grad).sum(-1), atol=1e-5):
            raise WrongAnswer("the clean value alone: AtP multiplies the gradient by the change, clean - corrupt")
    compare("my_atp(clean_act, corrupt_act, grad)", got, want)
    correct("the first-order change: (clean - corrupt) . grad at each position, one backward pass for all")


@exercise
def check_induction_head(my_induction_head) -> None:
    """my_induction_head(effects (L, H), induction (L, H)) -> (layer, head), 0-based: of the heads the
    detector flags (induction score above 0.5), the one whose patching effect is largest."""
    cases = [  # the lesson's own figures, then a head that matches best but carries little
        ([[0.13, -0.01, 0.99, -0.01], [0.0, 0.93, 0.34, 0.11]], [[0.0, 0.0, 0.0, 0.0], [0.58, 0.88, 0.82, 0.8]]),
        ([[0.9, 0.0, 0.1], [0.05, 0.7, 0.2], [0.0, 0.1, 0.0]], [[0.0, 0.0, 0.1], [0.95, 0.6, 0.2], [0.3, 0.7, 0.1]]),
    ]
    for effects, scores in cases:
        effects, scores = torch.tensor(effects), torch.tensor(scores)
        flat = effects.masked_fill(scores <= 0.5, float("-inf")).argmax()
        want = divmod(int(flat), effects.shape[1])
        got = tuple(int(i) for i in my_induction_head(effects, scores))
        if got != want:
            if got == divmod(int(effects.argmax()), effects.shape[1]):
                raise WrongAnswer(
                    f"{got} carries the largest effect but is no induction head (score "
                    f"{float(scores[got]):.2f}): patching says a site matters, not what it does; "
                    f"ask the detector too"
                )
            if got == divmod(int(scores.argmax()), effects.shape[1]):
                raise WrongAnswer(
                    f"{got} matches the pattern best but carries an effect of only "
                    f"{float(effects[got]):.2f}: a head can look like induction and not be the one "
                    f"that predicts this answer"
                )
            raise WrongAnswer(f"got {got}, expected {want} (0-based layer, head)")
    correct("the head that both looks like induction and carries the effect: the detector and patching agree")
