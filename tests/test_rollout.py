"""Attention rollout and flow: against loop and max-flow references, and on a run of every family."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab import load
from attnlab.cli.main import main
from attnlab.data import parallel
from attnlab.errors import AttnlabError
from attnlab.interpret.patches import attention_rollout
from attnlab.interpret.rollout import flow, mixed_layers, rollout, run_rollouts
from tests.conftest import flags

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

FAST = ["--eval-batches", "1", "--device", "cpu", "--dtype", "float32"]  # float32: no bf16 speed trial


def random_attention(rng, n_layer, n_head, t, causal=False) -> np.ndarray:
    """(L, H, T, T) softmaxes of random scores; causal: key j > query i gets no weight."""
    scores = rng.normal(size=(n_layer, n_head, t, t)) * 2
    if causal:
        scores = np.where(np.tril(np.ones((t, t))) > 0, scores, -np.inf)
    p = np.exp(scores)
    return p / p.sum(-1, keepdims=True)


def rollout_loops(w, residual) -> np.ndarray:
    """The rollout written out entry by entry: each layer mixed and renormalized, then applied."""
    n_layer, n_head, t, _ = w.shape
    out = np.eye(t)
    for layer in range(n_layer):
        a = np.zeros((t, t))
        for i in range(t):
            for j in range(t):
                a[i, j] = residual * (i == j) + (1 - residual) * sum(w[layer, h, i, j] for h in range(n_head)) / n_head
            a[i] /= a[i].sum()
        out = np.array([[sum(a[i, k] * out[k, j] for k in range(t)) for j in range(t)] for i in range(t)])
    return out


def max_flow_reference(cap: np.ndarray, source: int, sink: int) -> float:
    """Edmonds-Karp on a dense float capacity matrix: shortest augmenting paths until none is left."""
    left = cap.astype(float).copy()  # residual capacities
    total = 0.0
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v in np.nonzero(left[u] > 1e-12)[0]:
                if int(v) not in parent:
                    parent[int(v)] = u
                    queue.append(int(v))
        if sink not in parent:
            return total
        path = [sink]
        while path[-1] != source:
            path.append(parent[path[-1]])
        edges = list(zip(path[1:], path[:-1]))  # (u, v) from source to sink
        push = min(left[u, v] for u, v in edges)
        for u, v in edges:
            left[u, v] -= push
            left[v, u] += push
        total += push


def flow_reference(w, residual) -> np.ndarray:
    """flow() from a dense layered graph and the reference max-flow, pair by pair."""
    a = mixed_layers(w, residual)  # (L, T, T)
    n_layer, t, _ = a.shape
    cap = np.zeros(((n_layer + 1) * t,) * 2)
    for layer in range(n_layer):
        cap[layer * t : (layer + 1) * t, (layer + 1) * t : (layer + 2) * t] = a[layer].T  # (j -> i) = a[i, j]
    return np.array([[max_flow_reference(cap, j, n_layer * t + i) for j in range(t)] for i in range(t)])


@pytest.mark.parametrize("residual", [0.0, 0.3, 0.5, 1.0])
def test_rollout_matches_loop_reference(residual):
    w = random_attention(np.random.default_rng(0), 3, 2, 5)
    np.testing.assert_allclose(rollout(w, residual), rollout_loops(w, residual), atol=1e-12)


def test_rollout_rows_sum_to_one_and_inputs_agree():
    w = random_attention(np.random.default_rng(1), 4, 3, 6, causal=True)
    r = rollout(w)
    np.testing.assert_allclose(r.sum(-1), 1.0, atol=1e-12)
    assert (np.triu(r, 1) == 0).all()  # causal layers compose to a causal rollout
    np.testing.assert_allclose(rollout(list(w)), r)  # L arrays (H, T, T)
    np.testing.assert_allclose(rollout(torch.tensor(w, requires_grad=True)), r)
    np.testing.assert_array_equal(attention_rollout(w), r)  # interpret.patches uses this one implementation


def test_rollout_with_residual_one_is_identity():
    w = random_attention(np.random.default_rng(2), 3, 2, 7)
    np.testing.assert_array_equal(rollout(w, residual=1.0), np.eye(7))
    np.testing.assert_allclose(flow(w, residual=1.0), np.eye(7), atol=1e-6)


def test_one_layer_flow_is_the_mixed_attention():
    w = random_attention(np.random.default_rng(3), 1, 4, 6)
    a = mixed_layers(w, 0.5)[0]  # (T, T): with one layer the only path from j to i is the edge a[i, j]
    np.testing.assert_allclose(flow(w, 0.5), a, atol=1e-6)
    np.testing.assert_allclose(rollout(w, 0.5), a, atol=1e-12)


def test_two_layer_flow_by_hand():
    a1 = np.array([[0.5, 0.5, 0.0], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]])  # layer 1: row = query k, column = input j
    a2 = np.array([[0.7, 0.2, 0.1], [0.3, 0.3, 0.4], [0.0, 0.5, 0.5]])  # layer 2: row = output i, column = k
    w = np.stack([a1, a2])[:, None]  # (L, H, T, T), one head; residual 0 keeps the rows as they are
    f = flow(w, residual=0.0)
    # input 0 -> output 0: the paths through k = 0, 1, 2 share no edge, so each carries its narrowest
    # edge: min(.5, .7) + min(.2, .2) + min(.1, .1) = .8, where rollout sums products: .35 + .04 + .01
    assert f[0, 0] == pytest.approx(0.8, abs=1e-6)
    assert rollout(w, 0.0)[0, 0] == pytest.approx(0.4, abs=1e-12)
    # input 2 -> output 2: min(0, 0) + min(.2, .5) + min(.8, .5) = .7
    assert f[2, 2] == pytest.approx(0.7, abs=1e-6)
    by_hand = np.array([[sum(min(a1[k, j], a2[i, k]) for k in range(3)) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(f, by_hand, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_flow_matches_max_flow_reference(causal):
    w = random_attention(np.random.default_rng(4), 3, 2, 5, causal=causal)
    f = flow(w, 0.4)
    np.testing.assert_allclose(f, flow_reference(w, 0.4), atol=1e-5)
    assert (f <= 1 + 1e-6).all()  # output i takes in at most its row of the last layer, which sums to 1
    assert (f >= rollout(w, 0.4) - 1e-6).all()  # a max flow carries at least the rollout's product paths


def test_flow_refuses_long_inputs_and_bad_settings():
    w = random_attention(np.random.default_rng(5), 1, 1, 65)
    with pytest.raises(AttnlabError, match="use rollout"):
        flow(w)
    with pytest.raises(AttnlabError, match="limited to 4 tokens"):
        flow(w[..., :5, :5], max_tokens=4)
    with pytest.raises(AttnlabError, match="between 0 and 1"):
        rollout(w, residual=1.5)


def train(args) -> None:
    assert main([str(a) for a in ["train", *args]]) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs of each family, trained a few steps (the shapes are checked here, not the skill)."""
    root = tmp_path_factory.mktemp("rollout")
    (root / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 200)
    small = ["--n-layer", "2", "--max-steps", "3", "--batch-size", "8", "--eval-interval", "3", *FAST]
    train(
        [
            "lm",
            "--data",
            root / "corpus.txt",
            "--out",
            root / "gpt",
            *flags(preset="gpt-nano", d_model=32, n_head=2, context=32, tokenizer="char"),
            *small,
        ]
    )
    train(["classify", "--out", root / "encoder", *small])
    with pytest.MonkeyPatch.context() as mp:  # the shapes are checked, not the test scores: 100 pairs, not 2000
        mp.setattr(parallel, "TEST_SIZE", 100)
        train(["translate", "--data", "reverse", "--n-train", "200", "--out", root / "seq2seq", *small])
    return root


def test_run_rollouts_of_a_gpt(runs):
    run = load(runs / "gpt", device="cpu")
    (view,) = run_rollouts(run, "def add(a")
    assert view.name == "self-attention rollout" and view.weights.shape == (1, 1, 9, 9)
    np.testing.assert_allclose(view.weights.sum(-1), 1.0, atol=1e-9)
    assert (np.triu(view.weights[0, 0], 1) == 0).all()  # causal
    (flowed,) = run_rollouts(run, "def add(a", method="flow")
    assert flowed.name == "self-attention flow" and flowed.weights.shape == (1, 1, 9, 9)
    with pytest.raises(AttnlabError, match="rollout or flow"):
        run_rollouts(run, "def", method="saliency")


def test_run_rollouts_of_an_encoder(runs):
    run = load(runs / "encoder", device="cpu")
    (view,) = run_rollouts(run, "good food")
    assert view.name == "self-attention rollout"
    assert view.weights.shape == (1, 1, len(view.queries), len(view.keys)) and view.queries == view.keys
    assert view.queries[0] == "[CLS]"


def test_run_rollouts_of_a_seq2seq(runs):
    run = load(runs / "seq2seq", device="cpu")
    enc, dec, cross = run_rollouts(run, "abc")
    assert enc.name == "encoder self-attention rollout" and enc.weights.shape == (1, 1, 3, 3)
    assert dec.name == "decoder self-attention rollout"
    assert cross.name == "cross-attention through the encoder rollout" and cross.keys == enc.keys
    tt = len(dec.queries)
    assert dec.weights.shape == (1, 1, tt, tt) and cross.weights.shape == (1, 1, tt, 3)
    np.testing.assert_allclose(cross.weights.sum(-1), 1.0, atol=1e-9)  # a distribution over the source
    names = [v.name for v in run_rollouts(run, "abc", method="flow")]
    assert names == [
        "encoder self-attention flow",
        "decoder self-attention flow",
        "cross-attention through the encoder flow",
    ]


@pytest.fixture(scope="module")
def more_runs(tmp_path_factory):
    """The families without a stack of self-attention: the Bahdanau RNN and a ViT."""
    root = tmp_path_factory.mktemp("rollout")
    steps = ["--max-steps", "2", "--batch-size", "8", "--eval-interval", "2", *FAST]
    with pytest.MonkeyPatch.context() as mp:  # (its test scores: 100 pairs decoded, not 2000)
        mp.setattr(parallel, "TEST_SIZE", 100)
        train(
            [
                "translate",
                *flags(model="rnn-attention", data="reverse", n_train=100),
                "--out",
                root / "rnn",
                *flags(d_emb=16, d_hidden=16, d_attn=16),
                *steps,
            ]
        )
    train(["image", "--data", "digits", "--n-layer", "2", "--out", root / "vit", *steps])
    return root


def test_run_rollouts_of_an_rnn_gives_its_alignment(more_runs):
    (view,) = run_rollouts(load(more_runs / "rnn", device="cpu"), "abc", method="flow")
    assert view.name == "cross-attention" and view.weights.shape[:2] == (1, 1) and view.weights.shape[-1] == 3


def test_run_rollouts_of_a_vit(more_runs, tmp_path):
    path = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(6).random((8, 8)) * 255).astype(np.uint8)).save(path)
    run = load(more_runs / "vit", device="cpu")
    (view,) = run_rollouts(run, str(path))
    t = 1 + run.model.cfg.grid[0] * run.model.cfg.grid[1]
    assert view.name == "self-attention rollout" and view.weights.shape == (1, 1, t, t)
    assert view.queries[0] == "[CLS]" and view.queries[1] == "patch 1,1"
