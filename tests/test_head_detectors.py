"""Head detectors on patterns whose answer is known, and on a model traced through the hooks."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.interpret.detectors import head_scores, repeated_tokens
from attnlab.models import build_model
from attnlab.models.gpt import GPTConfig


def _pattern(T: int, where) -> torch.Tensor:
    """A causal (T, T) pattern with all of query t's weight on key where(t)."""
    p = torch.zeros(T, T)
    for t in range(T):
        p[t, where(t)] = 1
    return p


def test_each_detector_finds_the_head_built_to_do_its_job():
    ids, half = repeated_tokens(vocab=50, n=6, batch=1, seed=1)
    T = ids.shape[1]
    heads = torch.stack(
        [
            _pattern(T, lambda t: max(t - 1, 0)),  # previous token
            _pattern(T, lambda t: 0),  # first token
            _pattern(T, lambda t: t - half + 1 if t >= half else 0),  # induction
            torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None],  # uniform over the past
        ]
    )[None, None]  # (B=1, L=1, H=4, T, T)
    scores = head_scores(heads[:, 0][:, None], ids, half)
    assert scores["previous-token"][0].tolist()[:2] == pytest.approx([1.0, 1 / (T - 1)])  # t=1 looks at 0
    assert scores["first-token"][0, 1] == 1.0 and float(scores["first-token"][0, 0]) == pytest.approx(1 / (T - 1))
    assert scores["induction"][0, 2] == 1.0 and scores["induction"][0, 0] < 0.2
    assert scores["duplicate-token"][0, 2] == 0.0  # it looks one past the earlier copy, not at it
    # The uniform head spreads itself: no detector gives it much.
    assert all(s[0, 3] < 0.35 for name, s in scores.items() if name != "first-token")


def test_scores_of_a_traced_model_are_shares_of_attention():
    torch.manual_seed(0)
    model = build_model("gpt", GPTConfig(vocab_size=50, context=32, n_layer=2, n_head=2, d_model=16)).eval()
    ids, half = repeated_tokens(50, 10, batch=3)
    t = attnlab.trace(model, ids)
    patterns = t.patterns()  # (B, L, H, T, T)
    assert torch.equal(patterns[:, 1], t["blocks.1.attn.hook_pattern"])
    scores = head_scores(patterns, ids, half)
    assert set(scores) == {"previous-token", "first-token", "duplicate-token", "induction"}
    for s in scores.values():
        assert s.shape == (2, 2) and torch.all((s >= 0) & (s <= 1 + 1e-6))


def test_head_ablation_measures_each_heads_share_of_the_loss():
    from attnlab.interpret.ablation import head_ablation

    torch.manual_seed(0)
    model = build_model("gpt", GPTConfig(vocab_size=50, context=32, n_layer=2, n_head=2, d_model=16)).eval()
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight[:, :8] = 0  # head 0 of block 0 writes nothing
    ids = torch.randint(0, 50, (4, 12))
    loss = lambda: model(ids[:, :-1], ids[:, 1:])[1]
    for mode in ("zero", "mean"):
        table = head_ablation(model, loss, (ids[:, :-1],), mode)
        assert table.shape == (2, 2) and table[0, 0] == 0 and torch.all(table.flatten()[1:] != 0)
    with torch.no_grad(), attnlab.hooks(model, {"blocks.1.attn.hook_head_out": attnlab.zero_head(1)}):
        manual = float(loss())
    with torch.no_grad():
        manual -= float(loss())
    assert head_ablation(model, loss)[1, 1] == pytest.approx(manual)


def test_logit_lens_last_layer_is_the_models_output(tmp_path):
    from attnlab.interpret.lens import logit_lens, plot_lens

    torch.manual_seed(0)
    model = build_model("gpt", GPTConfig(vocab_size=50, context=32, n_layer=3, n_head=2, d_model=16)).eval()
    ids = torch.randint(0, 50, (1, 9))
    lens = logit_lens(model, ids, decode=lambda i: f"t{i}")
    assert lens.layers == ["embed", "block 1", "block 2", "block 3"] and lens.prob.shape == (4, 9)
    out = model(ids).softmax(-1)[0]  # (T, V)
    assert torch.allclose(lens.prob[-1], out.max(-1).values, atol=1e-6)
    assert lens.top[-1] == [f"t{int(i)}" for i in out.argmax(-1)]
    assert torch.allclose(lens.target_prob[-1], out[:-1].gather(-1, ids[0, 1:, None])[:, 0], atol=1e-6)
    for name in ("lens.png", "lens.svg"):
        plot_lens(lens, tmp_path / name)
        assert (tmp_path / name).stat().st_size > 5_000
    with pytest.raises(Exception, match="decoder language model"):
        logit_lens(torch.nn.Linear(2, 2), ids)


def test_translation_decoders_lens_last_layer_is_the_models_output():
    from attnlab.interpret.lens import logit_lens
    from attnlab.models import build_model
    from attnlab.models.seq2seq import Seq2SeqConfig
    from tests.conftest import perturb

    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab=30, tgt_vocab=25, d_model=16, n_head=2, n_layer=2, d_ff=32, context=12)
    model = perturb(build_model("seq2seq", cfg))
    src, tgt_in = torch.randint(3, 30, (1, 7)), torch.randint(3, 25, (1, 5))
    lens = logit_lens(model, tgt_in, src=src)
    out = model(src, tgt_in)[0].softmax(-1)  # (T, V)
    assert lens.layers == ["embed", "block 1", "block 2"] and lens.prob.shape == (3, 5)
    assert torch.allclose(lens.prob[-1], out.max(-1).values, atol=1e-6)
    assert not torch.allclose(lens.prob[1], lens.prob[-1], atol=1e-3)  # the middle reads differently
    with pytest.raises(Exception, match="translation Transformer"):
        logit_lens(model, tgt_in)  # no source


def test_inspect_command_draws_and_writes_numbers(tmp_path, capsys, corpus):
    import json

    from tests.conftest import run_cli, tiny_data, tiny_model, tiny_train

    attnlab.train(tmp_path / "r", tiny_model(), tiny_train(max_steps=2), tiny_data(corpus), progress=False)
    run = str(tmp_path / "r")
    code, out, err = run_cli(
        ["inspect", run, "def add(a, b):", "--what", "lens", "--out", str(tmp_path / "l.svg")], capsys
    )
    assert code == 0, err
    assert "embed: p(actual next token)" in out and (tmp_path / "l.svg").read_text().startswith("<?xml")
    code, out, err = run_cli(
        ["inspect", run, "def add(a, b):", "--what", "heads", "--out", str(tmp_path / "h.json")], capsys
    )
    assert code == 0, err
    heads = json.loads((tmp_path / "h.json").read_text())
    assert set(heads["tables"]) == {"previous-token", "first-token", "duplicate-token", "induction"}
    assert len(heads["tables"]["induction"]) == 2  # layers, each a row of heads
    code, out, err = run_cli(
        ["inspect", run, "def add(a, b):", "--what", "ablate", "--out", str(tmp_path / "a.png")], capsys
    )
    assert code == 0 and "loss change when zeroed" in out and (tmp_path / "a.png").stat().st_size > 5_000
    code, _, err = run_cli(["inspect", run, "d", "--what", "lens"], capsys)
    assert code == 2 and "two tokens" in err
    code, out, err = run_cli(["inspect", run, "--what", "ablate"], capsys)  # no text: the repeated half's loss
    assert code == 0 and "repeated twice" in out and len(out.splitlines()) == 2 + 2  # title, caption, 2 layers
    code, out, err = run_cli(["inspect", run, "--what", "ablate", "--on", "val"], capsys)  # the run's own held-out text
    assert code == 0 and "of the validation split" in out, err
    for what, out_file, row in (("heads", "h.html", "layer 2"), ("lens", "l.html", "block 2")):  # shaded tables
        code, _, err = run_cli(["inspect", run, "def add", "--what", what, "--out", str(tmp_path / out_file)], capsys)
        page = (tmp_path / out_file).read_text()
        assert code == 0 and page.startswith("<!DOCTYPE html>") and "<script" not in page and row in page
    code, out, err = run_cli(
        ["inspect", run, "def add", "--what", "rollout", "--out", str(tmp_path / "r.html")], capsys
    )
    assert code == 0 and "self-attention rollout: the last position" in out
    assert "attention-data" in (tmp_path / "r.html").read_text()  # the attention page, with the rollout
    code, _, err = run_cli(["inspect", run, "def add", "--what", "flow", "--out", str(tmp_path / "f.gif")], capsys)
    assert code == 2 and ".png, .svg" in err


def test_snapshots_follow_the_heads_over_training(tmp_path, capsys, corpus):
    import json

    from tests.conftest import run_cli, tiny_data, tiny_model, tiny_train

    out = tmp_path / "r"
    attnlab.train(out, tiny_model(), tiny_train(max_steps=4, snapshot_every=2), tiny_data(corpus), progress=False)
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == [f"step_{s:07d}.safetensors" for s in (0, 2, 4)]
    code, text, err = run_cli(
        ["inspect", str(out), "--what", "over-training", "--out", str(tmp_path / "o.json")], capsys
    )
    assert code == 0, err
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["steps"] == [0, 2, 4] and len(result["repeat_loss"]) == 3
    assert len(result["scores"]["induction"]) == 3 and "best induction" in text
    # The snapshots hold the weights of their step: the last is the run's final weights.
    from attnlab.io import read_safetensors

    last, _ = read_safetensors(out / "snapshots" / "step_0000004.safetensors")
    final, _ = read_safetensors(out / "model.safetensors")
    assert all(torch.equal(last[k], final[k]) for k in final)
    code, _, err = run_cli(["inspect", str(out), "--what", "lens"], capsys)
    assert code == 2 and "needs an input" in err


def test_the_repeats_corpus_rewards_induction_and_no_fixed_offset():
    """Copying the letter after the current letter's last occurrence predicts a large share of the
    text; looking a fixed distance back predicts little, whatever the distance."""
    import numpy as np

    from attnlab.data.repeats import LETTERS, WINDOW, repeats_text

    text = repeats_text(20_000, seed=1).replace("\n", "")
    assert set(text) <= set(LETTERS) and len(text) == 20_000
    x = np.array([ord(c) for c in text])
    last: dict[int, int] = {}
    hits = 0
    for t in range(len(x) - 1):
        j = last.get(x[t])
        hits += j is not None and t - j <= WINDOW and x[j + 1] == x[t + 1]
        last[x[t]] = t
    assert hits / len(x) > 0.4
    offsets = [float(np.mean(x[d:] == x[:-d])) for d in range(1, WINDOW + 1)]
    assert max(offsets) < 0.1
