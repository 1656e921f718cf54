"""`attnlab attention`: the weights the pictures show are the model's own, and every family draws."""

from __future__ import annotations

import pytest
import torch

from attnlab import load
from attnlab.cli.main import main
from attnlab.data import parallel
from attnlab.errors import AttnlabError
from attnlab.interpret.views import select, views, write_attention
from attnlab.nn import attend
from tests.conftest import cli_lm, flags, nano_flags, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

GPT = nano_flags(2, 2, 5)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    return cli_lm(tmp_path_factory.mktemp("att"), GPT, name="gpt")


def test_gpt_view_equals_the_math_path_of_attend_and_rows_sum_to_one(gpt_run):
    run = load(gpt_run, device="cpu")
    (view,) = views(run, "def add(a")
    ids = torch.tensor([run.tokenizer.encode("def add(a")])
    model = run.model
    x = model.pos(model.tok(ids))  # (1, T, C): the first block's input
    block = model.blocks[0]
    h = block.attn.n_heads
    q, k, v = block.attn._heads(block.attn.qkv_proj(block.norm_attn(x)), h, h, h)  # (1, H, T, Dh) each
    _, by_hand = attend(q, k, v, causal=True, return_weights=True)
    assert view.weights.shape == (2, 2, 9, 9) and view.queries == list("def·add(a")
    torch.testing.assert_close(torch.from_numpy(view.weights[0]).float(), by_hand[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.from_numpy(view.weights.sum(-1)).float(), torch.ones(2, 2, 9), atol=1e-5, rtol=0)
    assert (view.weights[:, :, 0, 1:] == 0).all()  # causal: the first token sees only itself


def test_attention_png_of_every_layer_one_layer_and_one_head(gpt_run, tmp_path, capsys):
    for extra in ([], ["--layer", "2"], ["--layer", "1", "--head", "2"]):
        out = tmp_path / f"a{len(extra)}.png"
        code, printed, _ = run_cli(["attention", gpt_run, "def add", "--out", out, *extra], capsys)
        assert code == 0 and out.read_bytes()[:8] == PNG and "self-attention" in printed
    code, _, err = run_cli(["attention", gpt_run, "def", "--out", tmp_path / "x.png", "--layer", "3"], capsys)
    assert code == 2 and "layers 1 to 2" in err
    code, _, err = run_cli(["attention", gpt_run, "def", "--out", tmp_path / "x.jpg"], capsys)
    assert code == 2 and "the suffix picks the format, .png, .svg, .html or .json" in err


def test_attention_html_is_one_self_contained_page(gpt_run, tmp_path, capsys):
    out = tmp_path / "a.html"
    code, printed, _ = run_cli(["attention", gpt_run, "return a", "--out", out], capsys)
    page = out.read_text()
    assert code == 0 and "head view and model view" in printed
    assert page.startswith("<!DOCTYPE html>") and "https://" not in page and "<script src" not in page


def test_select_narrows_layers_and_heads():
    w = torch.rand(3, 4, 5, 5).numpy()
    kept, first, heads = select(w, 2, 3)
    assert kept.shape == (1, 1, 5, 5) and first == 2 and heads == [3] and (kept[0, 0] == w[1, 2]).all()
    assert select(w, None, None)[0].shape == (3, 4, 5, 5)
    with pytest.raises(AttnlabError, match="--head needs --layer"):
        select(w, None, 1)


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("att") / "tr"
    args = [
        "train",
        "translate",
        "--data",
        "reverse",
        "--out",
        run,
        *flags(n_train=200, max_steps=5, batch_size=16, eval_interval=5, eval_batches=1, device="cpu", dtype="float32"),
    ]
    with pytest.MonkeyPatch.context() as mp:  # the views are checked here, not the test scores: 200 pairs, not 2000
        mp.setattr(parallel, "TEST_SIZE", 200)
        assert main([str(a) for a in args]) == 0
    return run


def test_translation_has_encoder_decoder_and_cross_views(translation_run, tmp_path, capsys):
    found = views(load(translation_run, device="cpu"), "abc")
    assert [v.name for v in found] == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    enc, dec, cross = found
    assert enc.weights.shape[-2:] == (3, 3) and cross.keys == enc.keys == ["a", "b", "c"]
    assert cross.weights.shape[-2] == len(cross.queries) == dec.weights.shape[-2]
    assert (dec.weights[..., 0, 1:] == 0).all()  # the decoder is causal
    for view in ("cross", "encoder", "decoder"):
        out = tmp_path / f"{view}.png"
        assert run_cli(["attention", translation_run, "abc", "--out", out, "--view", view], capsys)[0] == 0
        assert out.read_bytes()[:8] == PNG


def test_models_without_attention_say_so(tmp_path):
    run = tmp_path / "bow"
    args = ["train", "classify", "--model", "bow", "--out", run, "--max-steps", "3", "--device", "cpu"]
    assert main([str(a) for a in args]) == 0
    with pytest.raises(AttnlabError, match="no attention to show"):
        write_attention(load(run, device="cpu"), "good food", tmp_path / "a.png")


def test_plot_command_draws_each_picture(gpt_run, tmp_path, capsys):
    for what in ("loss", "lr", "positions", "embeddings"):
        out = tmp_path / "pics" / f"{what}.png"
        code, printed, _ = run_cli(["plot", gpt_run, "--what", what, "--out", out], capsys)
        assert code == 0 and out.read_bytes()[:8] == PNG and printed.strip(), what
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(gpt_run), "--what", "colours", "--out", str(tmp_path / "x.png")])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err
