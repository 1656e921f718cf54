"""Attention pictures read at a glance: a grid of panels under a pixel cap, labels at least 7 pt that
never overlap (every k-th on long inputs), SVG as text-bearing vector, JSON with the model's numbers."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab import load
from attnlab.errors import AttnlabError
from attnlab.interpret.views import write_attention
from attnlab.nn import attend
from attnlab.viz.alignment import MAX_PX, alignment_figure, grid_shape, plan, plot_alignment
from tests.conftest import cli_lm, nano_flags, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TEXT = "def hello(world): return 42 "  # the issue's input: 28 characters, one token each
GPT = nano_flags(2, 4, 3)


@pytest.fixture(scope="module")
def four_heads(tmp_path_factory):
    """A 2-layer, 4-head character GPT: `--layer 2` draws the issue's 5 panels (4 heads and their mean)."""
    return cli_lm(tmp_path_factory.mktemp("pic"), GPT, "def hello(world): return 42\n" * 200, name="gpt")


def random_weights(n_layer: int, n_head: int, t: int, s: int) -> np.ndarray:
    return np.random.default_rng(0).dirichlet(np.ones(s), size=(n_layer, n_head, t))  # rows sum to 1


def tokens(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


def overlapping(labels) -> int:
    """How many neighbouring tick labels touch each other on the drawn canvas."""
    boxes = [label.get_window_extent() for label in labels]
    return sum(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def test_the_issues_five_panels_make_a_grid_not_a_strip(four_heads, tmp_path, capsys):
    out = tmp_path / "a.png"
    code, printed, _ = run_cli(["attention", four_heads, TEXT, "--layer", "2", "--out", out], capsys)
    width, height = Image.open(out).size
    assert code == 0 and "1 layer(s) x 4 head(s)" in printed
    assert width / height < 2 and max(width, height) <= MAX_PX  # was 5588 x 1117: a 5:1 strip
    assert min(width, height) >= 800  # 28 tokens a panel still get room for their labels


def test_every_token_labelled_on_short_inputs_at_a_readable_size():
    fig = alignment_figure(random_weights(1, 4, 28, 28), list(TEXT), list(TEXT), "title", 2, [1, 2, 3, 4])
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_title()]  # the colour bar has no title
    assert [ax.get_title() for ax in panels] == [*(f"layer 2 head {h}" for h in range(1, 5)), "layer 2: mean of heads"]
    for ax in panels:
        xs, ys = ax.get_xticklabels(), ax.get_yticklabels()
        assert [x.get_text() for x in xs] == [y.get_text() for y in ys] == list(TEXT)
        assert min(label.get_fontsize() for label in xs + ys) >= 7
        assert ax.title.get_fontsize() > xs[0].get_fontsize()  # titles stand above their labels
        assert overlapping(ys) == 0 and overlapping(xs) == 0
    assert fig._supxlabel.get_text() == "keys" and fig._supylabel.get_text() == "queries"


def test_long_inputs_label_every_kth_token_without_overlap():
    fig = alignment_figure(random_weights(1, 2, 200, 200), tokens(200), tokens(200), "long")
    fig.canvas.draw()
    ax = fig.axes[0]
    ys = ax.get_yticklabels()
    step = int(ys[1].get_text()[1:])  # t0, t<k>, t<2k>, ...
    assert 1 < step < 20 and [y.get_text() for y in ys] == tokens(200)[::step]
    assert f"every {step}th labelled" in fig._supylabel.get_text()
    assert "labelled" in fig._supxlabel.get_text()
    assert overlapping(ys) == 0 and overlapping(ax.get_xticklabels()) == 0
    assert min(y.get_fontsize() for y in ys) >= 7


def test_one_panel_titles_an_alignment_or_the_chosen_head():
    w = random_weights(1, 1, 4, 5)
    assert [ax.get_title() for ax in alignment_figure(w, list("abcde"), list("wxyz")).axes if ax.get_title()] == [
        "alignment"
    ]
    chosen = alignment_figure(w, list("abcde"), list("wxyz"), first_layer=2, heads=[3])
    assert chosen.axes[0].get_title() == "layer 2 head 3"


def test_grids_stay_landscape_and_huge_ones_fit_the_pixel_cap():
    assert grid_shape(1, 5) == (2, 3)  # the issue's 1 x 5 strip
    assert grid_shape(2, 5) == (2, 5)  # a layer per row when that stays landscape
    rows, cols = grid_shape(12, 13)
    assert cols <= 6 and rows * cols >= 12 * 13
    for n_layer, per_layer, t in ((12, 13, 64), (1, 5, 500), (6, 9, 30)):
        lay = plan(n_layer, per_layer, t, t, longest=8)
        assert max(lay.width, lay.height) * lay.dpi <= MAX_PX and lay.label_pt >= 7


def test_svg_is_vector_with_its_text_kept_as_text(four_heads, tmp_path, capsys):
    out = tmp_path / "a.svg"
    code, printed, _ = run_cli(["attention", four_heads, "def hello", "--layer", "1", "--out", out], capsys)
    root = ET.fromstring(out.read_text())
    text = " ".join("".join(node.itertext()) for node in root.iter() if node.tag.endswith("text"))
    assert code == 0 and root.tag.endswith("svg") and "self-attention" in printed
    assert "layer 1: mean of heads" in text and "self-attention: 'def hello'" in text
    plot_alignment(random_weights(1, 1, 3, 3), list("abc"), list("abc"), tmp_path / "b.svg", "rnn")
    assert (tmp_path / "b.svg").read_text().lstrip().startswith("<?xml")


@torch.no_grad()
def test_json_holds_the_models_own_weights(four_heads, tmp_path, capsys):
    out = tmp_path / "a.json"
    code, _, _ = run_cli(["attention", four_heads, TEXT, "--layer", "2", "--head", "3", "--out", out], capsys)
    data = json.loads(out.read_text())
    (view,) = data["views"]
    assert code == 0 and data["text"] == TEXT and data["run"] == "gpt"
    assert view["name"] == "self-attention" and view["layers"] == [2] and view["heads"] == [3]
    assert view["queries"] == view["keys"] == list(TEXT.replace(" ", "·"))
    run = load(four_heads, device="cpu")
    model = run.model.eval()
    x = model.pos(model.tok(torch.tensor([run.tokenizer.encode(TEXT)])))  # (1, T, C)
    x, _ = model.blocks[0](x)  # the second block's input
    attn = model.blocks[1].attn
    q, k, v = attn._heads(attn.qkv_proj(model.blocks[1].norm_attn(x)), 4, 4, 4)  # (1, H, T, Dh) each
    _, by_hand = attend(q, k, v, causal=True, return_weights=True)  # (1, H, T, T)
    got = torch.tensor(view["weights"])  # (1, 1, T, T)
    assert got.shape == (1, 1, 28, 28)
    torch.testing.assert_close(got[0, 0], by_hand[0, 2].float(), atol=6e-5, rtol=0)  # 4 decimals kept
    whole = tmp_path / "all.json"
    assert run_cli(["attention", four_heads, "def", "--out", whole], capsys)[0] == 0
    (every,) = json.loads(whole.read_text())["views"]
    assert np.array(every["weights"]).shape == (2, 4, 3, 3) and every["layers"] == [1, 2]


def test_formats_are_named_when_the_suffix_is_wrong(four_heads, tmp_path, capsys):
    code, _, err = run_cli(["attention", four_heads, "def", "--out", tmp_path / "a.jpg"], capsys)
    assert code == 2 and all(f in err for f in (".png", ".svg", ".html", ".json"))
    image_run = SimpleNamespace(task=SimpleNamespace(tokenized=False))  # an image run draws PNG alone
    with pytest.raises(AttnlabError, match="FILE.png"):
        write_attention(image_run, "cat.png", tmp_path / "a.svg")
