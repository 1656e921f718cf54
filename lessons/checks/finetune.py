"""Checks for lesson 9 (pretrained to assistant): a LoRA layer's output, DPO's loss, int8 quantization."""

from __future__ import annotations

import torch

from attnlab.nn.lora import LoRALinear
from attnlab.nn.preference import dpo_loss
from attnlab.quant.quantize import dequantize_int8, quantize_int8
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


@exercise
def check_lora(my_lora) -> None:
    """my_lora(x (N, I), W (O, I), A (r, I), B (O, r), alpha) -> x W^T + (alpha / r) x A^T B^T."""
    g = torch.Generator().manual_seed(0)
    base = torch.nn.Linear(6, 5, bias=False)
    layer = LoRALinear(base, {"all": (0, 5)}, rank=2, alpha=8.0)
    with torch.no_grad():
        base.weight.copy_(torch.randn(5, 6, generator=g))
        layer.lora_A["all"].copy_(torch.randn(2, 6, generator=g))
        layer.lora_B["all"].copy_(torch.randn(5, 2, generator=g))
    x = torch.randn(4, 6, generator=g)
    w, a, b = base.weight.detach(), layer.lora_A["all"].detach(), layer.lora_B["all"].detach()
    got = as_tensor(my_lora(x, w, a, b, 8.0), "my_lora(x, W, A, B, 8)")
    want = layer(x).detach()
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-4):
        if torch.allclose(got, x @ w.T + x @ a.T @ b.T, atol=1e-4):
            raise WrongAnswer("the update is not scaled: multiply x A^T B^T by alpha / r (here 8 / 2 = 4)")
        if torch.allclose(got, x @ w.T + 8.0 * x @ a.T @ b.T, atol=1e-4):
            raise WrongAnswer("scaled by alpha, not alpha / r: divide by the rank r = A.shape[0]")
        if torch.allclose(got, 4.0 * x @ a.T @ b.T, atol=1e-4):
            raise WrongAnswer("the frozen base x W^T is missing: LoRA adds its update to it")
    compare("my_lora(x, W, A, B, 8)", got, want)
    correct("y = x W^T + (alpha / r) x A^T B^T: the frozen layer plus a rank-r update")


@exercise
def check_dpo(my_dpo) -> None:
    """my_dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) -> the mean DPO loss (a scalar)."""
    g = torch.Generator().manual_seed(1)
    pc, pr, rc, rr = (torch.randn(6, generator=g) * 3 - 20 for _ in range(4))  # sequence log-probabilities
    got = as_tensor(my_dpo(pc, pr, rc, rr, 0.1), "my_dpo(...)")
    want = dpo_loss(pc, pr, rc, rr, 0.1).loss
    if got.numel() != 1:
        raise WrongAnswer(f"the loss should be one number, the mean over the batch; got shape {tuple(got.shape)}")
    got = got.reshape(())
    if not torch.allclose(got, want, atol=1e-5):
        margin = 0.1 * ((pc - rc) - (pr - rr))
        if torch.allclose(got, -torch.nn.functional.logsigmoid(-margin).mean(), atol=1e-5):
            raise WrongAnswer(
                "chosen and rejected are swapped: the loss is -log sigmoid(beta * (chosen's log-ratio "
                "- rejected's log-ratio)), low when the chosen answer gained more"
            )
        no_ref = 0.1 * (pc - pr)
        if torch.allclose(got, -torch.nn.functional.logsigmoid(no_ref).mean(), atol=1e-5):
            raise WrongAnswer("the reference is missing: each answer's term is log pi(y) - log ref(y)")
        if torch.allclose(got, -torch.nn.functional.logsigmoid(margin / 0.1).mean(), atol=1e-5):
            raise WrongAnswer("beta is missing: multiply the difference of log-ratios by beta")
    compare("my_dpo(...)", got, want)
    correct("DPO = -log sigmoid(beta [(log pi - log ref)(chosen) - (log pi - log ref)(rejected)]), averaged")


@exercise
def check_int8(my_quantize) -> None:
    """my_quantize(W (O, I)) -> (codes int8 (O, I), scales (O,)): per row, scale = max |w| / 127 and
    codes = round(w / scale)."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 9, generator=g) * torch.tensor([[0.1], [1.0], [5.0], [0.01]])  # rows of very different size
    got = my_quantize(w)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise WrongAnswer("return a pair (codes, scales)")
    codes, scales = as_tensor(got[0], "codes"), as_tensor(got[1], "scales")
    want_codes, want_scales = quantize_int8(w)
    if scales.numel() == 1:
        raise WrongAnswer(
            "one scale for the whole matrix: take one per output row (w.abs().amax(dim=1) / 127), "
            "so that a row of small weights keeps its precision"
        )
    if scales.shape == want_scales.shape and torch.allclose(scales, w.abs().amax(dim=0)[: len(scales)] / 127):
        raise WrongAnswer("scales taken per column: take the max over each row (dim=1)")
    compare("scales", scales, want_scales)
    if codes.dtype != torch.int8:
        raise WrongAnswer(f"codes should be torch.int8, got {codes.dtype}")
    compare("codes", codes.float(), want_codes.float(), atol=0)
    error = (dequantize_int8(codes, scales) - w).abs().max(dim=1).values
    correct(f"per-row absmax int8; the largest error per row {[f'{e:.1e}' for e in error.tolist()]} (<= scale / 2)")
