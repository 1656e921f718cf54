"""Worked answers to lesson 9's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch
import torch.nn.functional as F


def lora(x, W, A, B, alpha):
    rank = A.shape[0]
    return x @ W.T + (alpha / rank) * (x @ A.T @ B.T)


def lora_unscaled(x, W, A, B, alpha):
    return x @ W.T + x @ A.T @ B.T


def dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean()


def dpo_without_reference(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    return -F.logsigmoid(beta * (policy_chosen - policy_rejected)).mean()


def quantize(W):
    scales = W.abs().amax(dim=1) / 127  # (O,)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(W / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


def quantize_one_scale(W):
    scale = W.abs().max() / 127  # one scale for the whole matrix
    return torch.round(W / scale).clamp(-127, 127).to(torch.int8), scale


ANSWERS = {
    "finetune.check_lora": (lora, lora_unscaled, "alpha / r"),
    "finetune.check_dpo": (dpo, dpo_without_reference, "reference"),
    "finetune.check_int8": (quantize, quantize_one_scale, "one scale"),
}
