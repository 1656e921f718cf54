"""The lectures' steps from pooled embeddings to the Transformer: simple self-attention, then Q, K, V."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.models import build_model
from attnlab.models.attention_ladder import QKVAttentionConfig, SelfAttentionConfig
from tests.conftest import run_cli


def _loop_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """y_i = sum_j softmax_j(scale * q_i . k_j) v_j, one query at a time: (T, D) -> (T, D)."""
    out = []
    for i in range(q.shape[0]):
        w = torch.softmax(torch.stack([scale * (q[i] @ k[j]) for j in range(k.shape[0])]), 0)
        out.append(sum(w[j] * v[j] for j in range(k.shape[0])))
    return torch.stack(out)


def test_simple_self_attention_is_softmax_of_x_xt_times_x_and_learns_nothing_else():
    torch.manual_seed(0)
    model = build_model("self-attention", SelfAttentionConfig(vocab_size=30, d_embed=8, task="tag"))
    ids = torch.tensor([[3, 7, 7, 12]])
    y, weights = model.mix(ids, ids != 0, return_weights=True)
    x = model.embed(ids)[0]
    assert torch.allclose(y[0], _loop_attention(x, x, x, 1.0), atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 1, 4))
    # The only weights are the embedding and the head: no projections.
    assert {n.split(".")[0] for n, _ in model.named_parameters()} == {"embed", "head"}


@pytest.mark.parametrize("name, cfg", [("self-attention", SelfAttentionConfig), ("qkv-attention", QKVAttentionConfig)])
def test_padding_changes_nothing(name, cfg):
    torch.manual_seed(0)
    model = build_model(name, cfg(vocab_size=30, d_embed=8, n_labels=3)).eval()
    short, padded = torch.tensor([[4, 9, 2]]), torch.tensor([[4, 9, 2, 0, 0]])
    assert torch.allclose(model(short), model(padded), atol=1e-6)


def test_qkv_attention_is_one_head_of_learned_queries_keys_and_values():
    torch.manual_seed(0)
    model = build_model("qkv-attention", QKVAttentionConfig(vocab_size=30, d_embed=8, task="tag"))
    ids = torch.tensor([[5, 1, 9]])
    y, weights = model.mix(ids, ids != 0, return_weights=True)
    x = model.embed(ids)[0]
    wq, wk, wv = model.attn.qkv_proj.weight.split(8)
    bq, bk, bv = model.attn.qkv_proj.bias.split(8)
    mixed = _loop_attention(x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv, 8**-0.5)
    assert weights.shape == (1, 1, 3, 3)
    assert torch.allclose(y[0], model.attn.out_proj(mixed), atol=1e-5)


def test_compare_climbs_the_ladder_with_and_without_frozen_vectors(tmp_path, capsys, monkeypatch):
    import attnlab.tasks.labeled as classify
    from attnlab.data.sentiment import generate
    from attnlab.wordvec.config import VectorsConfig
    from attnlab.wordvec.train import train_vectors

    reviews = "\n".join(text for text, _ in generate(400, seed=0))
    train_vectors(
        tmp_path / "vec", VectorsConfig(dim=16, epochs=2, min_count=1, threads=1), text=reviews, progress=False
    )
    models = ["self-attention"]
    for name in models:  # a short budget: this checks the command, not the scores
        monkeypatch.setitem(
            classify.TRAIN_DEFAULTS,
            name,
            dict(max_steps=20, batch_size=32, eval_interval=20, eval_batches=1, lr=0.01, device="cpu"),
        )
    code, out, err = run_cli(
        [
            "compare",
            "--task",
            "sentiment",
            "--models",
            ",".join(models),
            "--out",
            tmp_path / "cmp",
            "--word-vectors",
            tmp_path / "vec",
        ],
        capsys,
    )
    assert code == 0, err
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["self-attention", "self-attention+vectors"]
    assert "word vectors:" in out and "self-attention+vectors" in out
    # The frozen embedding holds the vectors, unchanged by training.
    from attnlab.runs.run import load
    from attnlab.wordvec import load_vectors

    run = load(tmp_path / "cmp" / "self-attention+vectors", device="cpu")
    wv = load_vectors(tmp_path / "vec")
    row = run.tokenizer.stoi["food"] if hasattr(run.tokenizer, "stoi") else run.tokenizer.itos.index("food")
    assert np.allclose(run.model.word_embedding.weight[row].detach().numpy(), wv["food"], atol=1e-6)
