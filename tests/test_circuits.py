"""Transcoders and attribution graphs (interpret/transcoder.py, circuits*.py): a transcoder that is
the MLP reproduces the model; every node's edges in sum to its value minus its bias; the graph's
total effects are what ablating a feature does in the replacement model; influence, the scores and
pruning against small graphs worked by hand; the command line end to end and its one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.cli.circuits import KINDS as CLI_KINDS
from attnlab.errors import AttnlabError
from attnlab.interpret.circuits import Attribution, Nodes, attribute
from attnlab.interpret.circuits_check import replacement_deltas, total_effects
from attnlab.interpret.circuits_graph import influence, normalised, prune, scores
from attnlab.interpret.circuits_run import trace_circuit
from attnlab.interpret.sae import KINDS, SAEConfig
from attnlab.interpret.transcoder import (
    Transcoder,
    evaluate_transcoders,
    load_transcoders,
    mlp_blocks,
    mlps_replaced,
    save_transcoders,
)
from attnlab.models.gpt import GPT
from tests.conftest import flags, perturb, run_cli, tiny_code_lm, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "def add(a, b):\n    return a"


def relu_gpt(**kw) -> torch.nn.Module:
    """A GPT whose MLPs are act(x W1 + b1) W2 + b2 with act = relu: a relu transcoder can be them."""
    torch.manual_seed(0)
    return perturb(GPT(tiny_model(activation="relu", feedforward="mlp", vocab_size=64, **kw))).eval()


def perfect(model: torch.nn.Module) -> list[Transcoder]:
    """Transcoders whose weights are the MLPs' own: encoder W1, b1; decoder W2, b2; no normalisation."""
    return [Transcoder.of_mlp(block.ff) for block in mlp_blocks(model)]


def noisy(model: torch.nn.Module, latents: int = 48, k: int = 6) -> list[Transcoder]:
    """Untrained topk transcoders fitted to nothing: large error nodes, many active features."""
    tcs = []
    for i, _ in enumerate(mlp_blocks(model)):
        tc = Transcoder(model.cfg.d_model, SAEConfig(latents=latents, kind="topk", k=k, seed=i))
        with torch.no_grad():
            tc.b_enc.fill_(0.5)  # every kept code positive: k features a position
        tcs.append(tc.eval())
    return tcs


def prompt(model: torch.nn.Module, T: int = 9) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(3))


def test_the_command_line_offers_the_sae_kinds():
    assert CLI_KINDS == KINDS


def test_a_perfect_transcoder_is_the_mlp():
    model = relu_gpt()
    ids = prompt(model, 12)
    clean = model(ids)
    tcs = perfect(model)
    with mlps_replaced(model, {i: lambda x, y, i=i: tcs[i](x) for i in range(len(tcs))}):
        spliced = model(ids)
    torch.testing.assert_close(spliced, clean, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "blocks",
    [
        {},
        {
            "norm_kind": "rmsnorm",
            "feedforward": "swiglu",
            "bias": False,
            "positions": "rope",
            "n_kv_head": 1,
            "qk_norm": True,
        },
    ],
)
def test_edges_into_each_node_sum_to_its_value_minus_its_bias(blocks):
    torch.manual_seed(0)
    model = perturb(GPT(tiny_model(vocab_size=64, **blocks))).eval()  # no zero-initialised writes
    ids = prompt(model)
    tcs = noisy(model)
    attr = attribute(model, ids, target=5, tcs=tcs, batch=7)  # several backward passes
    s = attr.nodes.slices()
    assert attr.nodes.n_features >= 6 * ids.shape[1]  # k features per position in every layer
    assert float(attr.errors.abs().max()) > 0.1  # the error nodes carry real weight
    assert attr.linearity_gap() < 1e-4
    with torch.no_grad():  # the logit node's value is the real model's metric
        logits = model(ids)[0, -1]
    assert float(attr.value[s["logit"]]) == pytest.approx(float(logits[5] - logits.mean()), abs=1e-5)
    # and the feature nodes' values are their activations on the clean pass
    assert torch.equal(attr.value[s["features"]], attr.nodes.act)


def test_perfect_transcoders_give_a_complete_graph_and_exact_effects():
    model = relu_gpt(n_layer=3)
    ids = prompt(model)
    tcs = perfect(model)
    attr = attribute(model, ids, target=7, tcs=tcs)
    assert float(attr.errors.abs().max()) < 1e-5
    got = scores(attr, normalised(attr.adjacency))
    assert got["replacement_score"] == pytest.approx(1.0, abs=1e-4)
    assert got["completeness_score"] == pytest.approx(1.0, abs=1e-4)
    # a last-layer feature changes nothing else: ablating it moves the metric by exactly its total effect
    n = attr.nodes
    last = ((n.layer == 2) & (n.pos == ids.shape[1] - 1)).nonzero().flatten()[:8]
    predicted = -total_effects(attr)[last]
    measured = replacement_deltas(model, attr, tcs, last).double()
    torch.testing.assert_close(measured, predicted, atol=1e-4, rtol=1e-3)
    assert bool((predicted.abs() > 1e-6).any())


def test_an_attention_only_model_has_a_graph_of_its_embeddings_alone():
    torch.manual_seed(0)
    model = perturb(GPT(tiny_model(vocab_size=64, feedforward="none", positions="rope")))
    ids = prompt(model)
    attr = attribute(model, ids, target=5, tcs=[])
    s = attr.nodes.slices()
    assert attr.nodes.n_features == 0 and len(attr.nodes) == ids.shape[1] + 1  # embeddings and the logit
    assert attr.linearity_gap() < 1e-4  # each position's direct share, plus the bias, is the logit
    assert bool(attr.adjacency[s["logit"].start, s["embeddings"]].abs().gt(0).all())
    assert scores(attr, normalised(attr.adjacency))["replacement_score"] == 1.0  # no error node
    assert prune(attr).nodes[s["logit"]].all()


def graph(adjacency: list[list[float]], n_features: int, acts: list[float]) -> Attribution:
    """An attribution over hand-written edges: n_features features at layer 0, one position, then one
    error, one embedding and the logit (n = n_features + 3)."""
    nodes = Nodes(
        torch.zeros(n_features, dtype=torch.long),
        torch.zeros(n_features, dtype=torch.long),
        torch.arange(n_features),
        torch.tensor(acts, dtype=torch.float64),
        1,
        1,
    )
    a = torch.tensor(adjacency, dtype=torch.float64)
    zeros = torch.zeros(len(a), dtype=torch.float64)
    return Attribution(nodes, a, zeros, zeros, torch.zeros(1, 1, 1), None, 0)


# nodes: f0, f1, error, embedding, logit. The embedding drives f0 (3) and f1 (1); f0 drives f1 (2);
# the logit reads f0 (1), f1 (-2) and the error (1). Rows are targets, columns sources.
HAND = [[0, 0, 0, 3, 0], [2, 0, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, -2, 1, 0, 0]]


def test_influence_and_scores_by_hand():
    attr = graph(HAND, 2, [3.0, 7.0])
    an = normalised(attr.adjacency)
    # shares: f1's inputs 2/3 from f0, 1/3 from the embedding; the logit's 1/4, 2/4, 1/4
    w = torch.tensor([0, 0, 0, 0, 1.0], dtype=torch.float64)
    inf = influence(an, w)
    # f0: 1/4 direct + 2/4 * 2/3 through f1 = 7/12; f1: 1/2; error 1/4; embedding: f0's 7/12 + f1's 1/2 * 1/3
    expected = torch.tensor([7 / 12, 1 / 2, 1 / 4, 7 / 12 + 1 / 6, 0], dtype=torch.float64)
    torch.testing.assert_close(inf, expected)
    got = scores(attr, an)
    assert got["replacement_score"] == pytest.approx((7 / 12 + 1 / 6) / (7 / 12 + 1 / 6 + 1 / 4))
    # completeness: f0 and f1 take nothing from errors (1 each); the logit 3/4; weights I + w
    weights = [7 / 12, 1 / 2, 1]
    assert got["completeness_score"] == pytest.approx((7 / 12 + 1 / 2 + 3 / 4) / sum(weights))


def test_total_effects_sum_the_paths():
    # per unit of activation: f0 -> f1 2/3, f0 -> logit 1/3, f1 -> logit -2/7; so per unit of f0 the
    # logit moves 1/3 + 2/3 * (-2/7), and f0's total effect is 3 times that
    attr = graph(HAND, 2, [3.0, 7.0])
    e = total_effects(attr)
    assert float(e[0]) == pytest.approx(3 * (1 / 3 + (2 / 3) * (-2 / 7)))
    assert float(e[1]) == pytest.approx(-2.0)


def test_pruning_drops_what_does_not_reach_the_logit():
    # f2 has an input but reaches nothing: its influence is 0 and it goes, with its edge
    hand = [
        [0, 0, 0, 0, 3, 0],
        [2, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 5, 0],
        [0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [1, -2, 0, 1, 0, 0],
    ]
    attr = graph(hand, 3, [3.0, 7.0, 1.0])
    p = prune(attr, node_threshold=1.0, edge_threshold=1.0)
    assert p.nodes.tolist() == [True, True, False, True, True, True]
    assert not bool(p.edges[2].any()) and bool(p.edges[5, 0]) and bool(p.edges[1, 0])
    assert p.after == p.before  # nothing that mattered was dropped
    tight = prune(attr, node_threshold=0.5, edge_threshold=1.0)  # f0 alone carries over half
    assert tight.nodes[:3].tolist() == [True, False, False]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_code_lm(tmp_path_factory.mktemp("circuits"), activation="relu", feedforward="mlp")


def test_the_command_line_end_to_end(lm, tmp_path, capsys):
    out = tmp_path / "graph"
    args = [
        "circuits",
        str(lm),
        "--prompt",
        PROMPT,
        "--out",
        str(out),
        *flags(latents=64, k=4, tokens=8192, top=4, json=True),
    ]
    code, printed, _ = run_cli(args, capsys)
    assert code == 0
    got = json.loads(printed)
    assert got["transcoders"]["trained"] and got["transcoders"]["explained_variance"] <= 1
    assert 0 <= got["replacement_score"] <= 1 and 0 <= got["completeness_score"] <= 1
    data = json.loads((out / "graph.json").read_text())
    assert data["linearity_gap"] < 1e-3 and len(data["intervention"]["features"]) == 4
    assert {n["kind"] for n in data["nodes"]} >= {"feature", "embedding", "logit"}
    # each edge [source, target, weight] joins two kept nodes and carries the attribution's weight
    kept = {n["id"] for n in data["nodes"]}
    tcs, _ = load_transcoders(out / "transcoders")
    circuit = trace_circuit(attnlab.load(lm, device="cpu"), PROMPT, None, tcs)
    adjacency = circuit.attribution.adjacency
    shown = circuit._repr_html_()  # a notebook's view: the page inside a frame, every quote escaped
    assert shown.startswith("<iframe srcdoc=") and "showCircuit" in shown and "<script" not in shown
    assert data["edges"] and all(s in kept and t in kept for s, t, _ in data["edges"])
    assert all(w != 0 and w == pytest.approx(float(adjacency[t, s])) for s, t, w in data["edges"])
    page = (out / "graph.html").read_text()
    assert "https://" not in page and "<script src" not in page and "<link" not in page and '"notes"' in page
    # the same --out again: refused in one line, nothing replaced
    before = (out / "graph.json").read_bytes()
    code, _, err = run_cli(args, capsys)
    assert code != 0 and "--force" in err and len(err.strip().splitlines()) == 1
    assert (out / "graph.json").read_bytes() == before
    # reusing the trained transcoders elsewhere: no training, the same graph
    again = tmp_path / "again"
    code, printed, _ = run_cli([*args[:5], str(again), "--transcoders", str(out / "transcoders"), "--json"], capsys)
    assert code == 0 and not json.loads(printed)["transcoders"]["trained"]
    assert json.loads((again / "graph.json").read_text())["edges"] == data["edges"]


def test_a_target_of_several_tokens_is_one_line(lm, tmp_path, capsys):
    code, _, err = run_cli(
        ["circuits", str(lm), "--prompt", PROMPT, "--target", "ab", "--out", str(tmp_path / "g"), "--tokens", "4096"],
        capsys,
    )
    assert code != 0 and "not one" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "g" / "transcoders").exists()  # refused before any training


def test_a_model_that_is_not_a_pre_norm_decoder_is_refused():
    model = GPT(tiny_model(norm="post"))
    with pytest.raises(AttnlabError, match="pre-norm decoder"):
        mlp_blocks(model)


def test_evaluation_of_perfect_transcoders(lm):
    run = attnlab.load(lm, device="cpu")
    got = evaluate_transcoders(run, perfect(run.model), tokens=512)
    assert got["tokens"] > 0 and len(got["layers"]) == 2 and got["ce_zero"] > got["ce_clean"]
    assert got["ce_transcoders"] == pytest.approx(got["ce_clean"], abs=1e-5)
    assert got["ce_loss_recovered"] == pytest.approx(1.0, abs=1e-4)
    assert got["explained_variance"] == pytest.approx(1.0, abs=1e-5)


def test_the_explorer_draws_a_graph_of_a_run_served_with_transcoders(lm, tmp_path):
    testclient = pytest.importorskip("fastapi.testclient", reason="fastapi is needed to serve")
    from attnlab.serve.app import create_app

    folder = tmp_path / "tcs"
    save_transcoders(folder, perfect(attnlab.load(lm, device="cpu").model), {"run": str(lm)})
    client = testclient.TestClient(create_app([lm], transcoders=[folder]), raise_server_exceptions=False)
    assert client.get("/api/runs").json()[0]["graphs"] is True
    got = client.post("/api/circuit", json={"run": lm.name, "text": PROMPT})
    assert got.status_code == 200, got.text
    body = got.json()
    assert "showCircuit" in body["page"] and body["target"]  # the page the explorer puts in a frame
    assert body["scores"]["before"]["replacement_score"] == pytest.approx(1.0, abs=1e-4)  # perfect transcoders
    # a run served without transcoders: a 400 that says how to give them
    bare = testclient.TestClient(create_app([lm]), raise_server_exceptions=False)
    refused = bare.post("/api/circuit", json={"run": lm.name, "text": PROMPT})
    assert refused.status_code == 400 and "--transcoders" in refused.json()["error"]
    assert bare.get("/api/runs").json()[0]["graphs"] is False


def test_transcoders_of_a_run_not_served_are_refused_in_one_line(lm, tmp_path):
    from attnlab.serve.app import create_app

    save_transcoders(tmp_path / "tcs", perfect(attnlab.load(lm, device="cpu").model), {"run": str(tmp_path / "other")})
    with pytest.raises(AttnlabError, match="not among the runs served"):
        create_app([lm], transcoders=[tmp_path / "tcs"])
