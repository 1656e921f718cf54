"""The mixture-of-experts feed-forward (nn/moe.py): the routed path against the dense masked
reference, renormalised top-k gates, the balancing loss on a hand-made routing, the capacity's
dropped tokens, decoding with the cache, active parameters, and the engine's use of the loss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli.main import main
from attnlab.models.gpt import GPT
from attnlab.nn import MixtureOfExperts, aux_loss
from tests.conftest import decode_stepwise, perturb, tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")


def moe(**kw) -> MixtureOfExperts:
    torch.manual_seed(0)
    return perturb(MixtureOfExperts(12, 20, **{"n_experts": 4, "k": 2, **kw}))


@pytest.mark.parametrize("expert", ["mlp", "swiglu"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("capacity", [None, 0.5])
def test_routed_path_equals_every_expert_on_every_token_masked(k, capacity, expert):
    layer = moe(k=k, capacity_factor=capacity, expert=expert)
    x = torch.randn(3, 5, 12)
    torch.testing.assert_close(layer(x), layer.forward_dense(x), atol=1e-5, rtol=1e-5)
    if capacity is not None:  # 15 tokens * k assignments over 4 experts at half their share
        assert float(layer.dropped) > 0


def test_the_gates_are_the_top_k_probabilities_renormalised():
    layer = moe(k=2)
    x = torch.randn(7, 12)
    gates, experts, kept = layer.route(x)
    probs = torch.softmax(x @ layer.router.weight.T, -1)
    top = probs.topk(2, -1)
    torch.testing.assert_close(gates, top.values / top.values.sum(-1, keepdim=True))
    assert torch.equal(experts, top.indices) and bool(kept.all())
    torch.testing.assert_close(gates.sum(-1), torch.ones(7))
    # one token by hand: the output is g1 * expert_a(x) + g2 * expert_b(x)
    out = layer(x[None, :1])[0, 0]
    a, b = experts[0].tolist()
    want = gates[0, 0] * layer.experts[a](x[:1])[0] + gates[0, 1] * layer.experts[b](x[:1])[0]
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


def hand_routed(probs: list[list[float]]) -> tuple[MixtureOfExperts, torch.Tensor]:
    """A layer whose router gives these probabilities: inputs one-hot, router = log(probs)^T."""
    n, e = len(probs), len(probs[0])
    layer = MixtureOfExperts(n, 8, n_experts=e, k=1)
    with torch.no_grad():
        layer.router.weight.copy_(torch.tensor(probs).log().T)  # (E, N): token i's logits are log p_i
    return layer, torch.eye(n)[None]  # (1, N, N)


def test_balancing_loss_is_its_formula_on_a_hand_made_routing():
    probs = [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1], [0.5, 0.25, 0.25]]
    layer, x = hand_routed(probs)
    layer(x)
    # top-1 choices: experts 0, 0, 1, 0 -> f = (3/4, 1/4, 0); P = mean probabilities per expert
    f = [3 / 4, 1 / 4, 0]
    p = [(0.7 + 0.6 + 0.1 + 0.5) / 4, (0.2 + 0.3 + 0.8 + 0.25) / 4, (0.1 + 0.1 + 0.1 + 0.25) / 4]
    assert float(layer.aux.detach()) == pytest.approx(3 * sum(a * b for a, b in zip(f, p)), rel=1e-5)
    torch.testing.assert_close(layer.load, torch.tensor(f))
    # uniform routing gives 1, the minimum
    even, x = hand_routed([[1 / 3] * 3] * 3)
    even(x)
    assert float(even.aux.detach()) == pytest.approx(1.0, rel=1e-5)


def test_capacity_keeps_first_choices_in_token_order_and_counts_the_dropped():
    layer, x = hand_routed([[0.9, 0.05, 0.05]] * 6)  # every token wants expert 0
    layer.capacity_factor = 1.0  # capacity ceil(1.0 * 6 * 1 / 3) = 2
    y = layer(x)
    gates, experts, kept = layer.route(x[0])
    assert kept[:, 0].tolist() == [True, True, False, False, False, False]
    assert float(layer.dropped) == pytest.approx(4 / 6)
    assert torch.equal(y[0, 2:], torch.zeros(4, 6))  # dropped: nothing added (the residual carries them)
    torch.testing.assert_close(y, layer.forward_dense(x))


def test_moe_gpt_decodes_with_the_cache_as_without_and_counts_active_parameters():
    torch.manual_seed(0)
    cfg = tiny_model(vocab_size=23, feedforward="moe", n_experts=4, experts_per_token=2, d_ff=24)
    model = perturb(GPT(cfg))
    ids = torch.randint(0, 23, (2, 9))
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(decode_stepwise(model, ids, 4)[0], full, atol=1e-5, rtol=1e-5)
    expert = sum(p.numel() for p in model.blocks[0].ff.experts[0].parameters())
    assert model.num_params() - model.num_params(active=True) == 2 * (4 - 2) * expert


def test_the_engine_trains_on_the_balancing_loss_and_logs_the_routing(tmp_path, corpus):
    def run(name: str, weight: float):
        cfg = tiny_model(feedforward="moe", n_experts=4, experts_per_token=1, d_ff=16, aux_loss_weight=weight)
        out = tmp_path / name
        attnlab.train(out, cfg, tiny_train(max_steps=3, eval_interval=3), tiny_data(corpus), progress=False)
        return out, load_file(out / "model.safetensors")

    (plain, a), (_, b) = run("plain", 0.0), run("balanced", 10.0)
    assert aux_loss(GPT(tiny_model(feedforward="moe"))) is None  # no forward yet: nothing to add
    router = "blocks.0.ff.router.weight"
    assert not torch.allclose(a[router], b[router])  # the loss moved the router
    rows = [json.loads(r) for r in (plain / "metrics.jsonl").read_text().splitlines()]
    routed = [r for r in rows if "expert_load" in r]
    assert routed and routed[-1]["step"] == 3 and math.isfinite(routed[-1]["moe_aux"])
    loads = routed[-1]["expert_load"]
    assert len(loads) == 2 and all(len(layer) == 4 and abs(sum(layer) - 1) < 1e-3 for layer in loads)


def test_expert_pictures_of_a_trained_run(tmp_path, corpus):
    out = tmp_path / "moe"
    cfg = tiny_model(feedforward="moe", n_experts=3, experts_per_token=1, d_ff=16)
    attnlab.train(out, cfg, tiny_train(max_steps=4, eval_interval=2), tiny_data(corpus), progress=False)
    run = attnlab.load(out, device="cpu")
    from attnlab.interpret.experts import expert_routing

    text = "def f(x):\n    return x\n"
    routing = expert_routing(run, text)
    n = len(run.tokenizer.encode(text))
    assert len(routing.tokens) == n and routing.experts.shape == (2, n, 1)
    assert routing.experts.max() < 3 and np.allclose(routing.gates, 1.0)  # top-1: the gate renormalises to 1
    assert main(["plot", str(out), "--what", "experts", "--text", text, "--out", str(tmp_path / "e.png")]) == 0
    assert main(["plot", str(out), "--what", "expert-load", "--out", str(tmp_path / "l.png")]) == 0
    assert (tmp_path / "e.png").stat().st_size > 5000 and (tmp_path / "l.png").stat().st_size > 5000
    # the exported page and the explorer's /api/attention carry the expert view's data
    assert main(["attention", str(out), text, "--out", str(tmp_path / "a.html")]) == 0
    assert '"experts":{"tokens":' in (tmp_path / "a.html").read_text()
    from fastapi.testclient import TestClient

    from attnlab.serve.app import create_app

    answer = TestClient(create_app([out])).post("/api/attention", json={"run": "moe", "text": text}).json()
    assert answer["experts"]["n"] == 3 and len(answer["experts"]["experts"]) == 2
    assert answer["experts"]["experts"][1] == routing.experts[1, :, 0].tolist()
    with pytest.raises(attnlab.AttnlabError, match="no mixture-of-experts layers"):
        attnlab.train(tmp_path / "dense", tiny_model(), tiny_train(max_steps=1), tiny_data(corpus), progress=False)
        expert_routing(attnlab.load(tmp_path / "dense", device="cpu"), text)


def test_an_expert_given_no_token_still_gets_a_gradient():
    layer, x = hand_routed([[0.9, 0.05, 0.05]] * 4)  # expert 0 takes every token
    layer(x).sum().backward()
    for e in (1, 2):
        assert all(p.grad is not None and not p.grad.any() for p in layer.experts[e].parameters())
