"""Which expert each token goes to in a mixture-of-experts run: the arrays viz/experts.py draws,
and the expert view's data for the HTML page and the explorer.

Shapes: L MoE layers, T tokens, E experts, k experts per token.

    routing = expert_routing(run, "def main():\\n    return 0")   # tokens, (L, T, k) experts, (L, T, k) gates
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.models.protocols import OneSequence
from attnlab.nn.moe import moe_layers
from attnlab.viz.experts import Routing


@torch.no_grad()
def expert_routing(run, text: str) -> Routing:
    """Route `text` through a GPT run's MoE layers (the last context window of it)."""
    model = run.model
    layers = moe_layers(model)
    if not layers:
        raise AttnlabError(f"{run.path} has no mixture-of-experts layers (train with --feedforward moe)")
    ids = run.tokenizer.encode(text)[-model.cfg.context :]
    if not ids:
        raise AttnlabError("the text is empty")
    idx = torch.tensor([ids], device=next(model.parameters()).device)
    model.eval()
    model(idx)  # each MoE layer keeps what it chose
    experts = np.stack([m.choice[0].cpu().numpy() for m in layers])  # (L, T, k)
    gates = np.stack([m.choice_gates[0].float().cpu().numpy() for m in layers])
    tokens = [run.tokenizer.decode([i]) for i in ids]
    return Routing(tokens, experts, gates, layers[0].n_experts)


def routing_json(run, text: str) -> dict | None:
    """The expert view's data for the HTML page and the explorer: {tokens, experts (L, T) first
    choices, gates (L, T) their gates, n experts}; None for a model without MoE layers, or not
    reading one token sequence (a translation model's two are not routed here)."""
    if not moe_layers(run.model) or not isinstance(run.model, OneSequence):
        return None
    r = expert_routing(run, text)
    return {
        "tokens": r.tokens,
        "experts": r.experts[..., 0].tolist(),
        "gates": np.round(r.gates[..., 0], 3).tolist(),
        "n": r.n_experts,
    }
