"""The captioner: a ViT encoder over patches and the encoder-decoder's causal decoder over words."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.data.batches import BOS_ID, EOS_ID
from attnlab.decoding.beam import beam_search, greedy
from attnlab.models import build_model
from attnlab.models.captioner import CaptionerConfig
from attnlab.tasks.caption import caption_attention, stream_caption
from tests.conftest import TINY_IMAGES, perturb
from tests.conftest import tiny_captioner as captioner

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def test_patch_states_do_not_depend_on_the_caption():
    model, images = captioner(), torch.rand(2, 1, 8, 16)
    a = attnlab.trace(model, images, torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8]]))
    b = attnlab.trace(model, images, torch.tensor([[BOS_ID, 9, 3], [BOS_ID, 4, 4]]))
    encoder = [n for n in a.names() if n.startswith("encoder.")]
    assert encoder and all(torch.equal(a[n], b[n]) for n in encoder)
    assert a["encoder.0.attn.hook_pattern"].shape == (2, 2, 8, 8)  # 2 x 4 patches see each other
    assert not torch.equal(a.output, b.output)


def test_the_decoder_is_causal_and_cross_attention_sums_to_one_over_patches():
    model, images = captioner(), torch.rand(3, 1, 8, 16)
    tgt = torch.randint(3, 20, (3, 6))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(3, 20, (3, 2))
    with torch.no_grad():
        assert torch.allclose(model(images, tgt)[:, :4], model(images, changed)[:, :4], atol=1e-6)
        cross = model.attention(images, tgt)["cross"]
    assert len(cross) == 2 and cross[0].shape == (3, 2, 6, 8)  # (B, H, T, N) per decoder layer
    assert all(torch.allclose(w.sum(-1), torch.ones(3, 2, 6), atol=1e-6) for w in cross)


def test_cached_decoding_equals_teacher_forcing_and_beam_1_equals_greedy():
    model, images = captioner(), torch.rand(4, 1, 8, 16)
    hyps = greedy(model, images, 8)
    for row, hyp in enumerate(hyps):  # each step's argmax, recomputed without the cache
        tgt_in = torch.tensor([[BOS_ID, *hyp]])
        with torch.no_grad():
            logits = model(images[row : row + 1], tgt_in)[0]
        logits[:, :EOS_ID] = float("-inf")
        want = logits.argmax(-1).tolist()
        assert want[: len(hyp)] == hyp and (len(hyp) == 8 or want[len(hyp)] == EOS_ID)
    assert beam_search(model, images, 1, 8) == hyps


def test_bad_configs_and_images_are_refused():
    with pytest.raises(ValueError, match="does not cut into"):
        CaptionerConfig(image_size=8, image_width=10, patch_size=4)
    with pytest.raises(ValueError, match="no token embedding to share"):
        CaptionerConfig(share_embeddings=True)
    with pytest.raises(ValueError, match="takes images of 1x8x16"):
        captioner()(torch.rand(1, 3, 8, 16), torch.tensor([[BOS_ID]]))


def test_show_attend_and_tell_decodes_like_the_rnn_and_its_attention_covers_the_patches():
    from attnlab.models.rnn_captioner import RNNCaptionerConfig

    torch.manual_seed(0)
    cfg = RNNCaptionerConfig(tgt_vocab=20, d_emb=8, d_hidden=16, d_attn=8, dropout=0.0, **TINY_IMAGES)
    model = perturb(build_model("rnn-captioner", cfg), 0.5)
    images = torch.rand(3, 1, 8, 16)
    hyps = greedy(model, images, 6)
    assert beam_search(model, images, 1, 6) == hyps
    tgt = torch.tensor([[BOS_ID, *h] for h in hyps if len(h) == len(hyps[0])])[:1]
    alignment = model.alignment(images[:1], tgt)  # (B, 1, 1, T, N)
    assert alignment.shape == (1, 1, 1, tgt.shape[1], 8)
    assert torch.allclose(alignment.sum(-1), torch.ones(1, 1, 1, tgt.shape[1]), atol=1e-6)
    # Each region's feature is its patch's projection plus its position's vector: one patch moved
    # elsewhere gives a different feature, so attention can tell left from right.
    feats = model.start(images).memory  # (B, N, F)
    assert torch.allclose(feats, model.patches(images) + model.where, atol=1e-6)
    assert not torch.allclose(model.where[0, 0], model.where[0, 1])


def test_caption_task_trains_evaluates_predicts_and_draws_where_words_looked(tmp_path, capsys):
    """A few steps of each model through the command line (the skill is measured in benchmarks)."""
    from PIL import Image

    from attnlab.data import strips
    from tests.conftest import run_cli

    strip = strips.strips("test", 1)[0]
    image = tmp_path / "strip.png"
    Image.fromarray((strip.image * 255).astype("uint8")).save(image)
    steps = (
        "--max-steps 3 --batch-size 8 --eval-interval 3 --eval-batches 1 --device cpu --n-train 100 --n-test 20"
    ).split()
    for model, extra in (
        ("transformer", ["--d-model", "32", "--n-layer", "1"]),
        ("rnn-attention", ["--d-hidden", "16", "--d-emb", "8", "--d-attn", "8"]),
    ):
        run = tmp_path / model
        code, out, err = run_cli(["train", "caption", "--model", model, "--out", run, *steps, *extra], capsys)
        assert code == 0, err
        assert "test (greedy): exact match" in out
        picture = tmp_path / f"{model}.png"
        code, out, err = run_cli(["predict", run, image, "--attention", picture, "--json"], capsys)
        assert code == 0, err
        result = __import__("json").loads(out)
        assert result["kind"] == "caption" and result["attention"] == str(picture)
        assert picture.read_bytes()[:4] == b"\x89PNG"
        loaded = attnlab.load(run)  # streamed word by word: the same words and weights as all at once
        pixels = strip.image[None].astype("float32")
        words, weights = caption_attention(loaded, pixels)
        streamed = list(stream_caption(loaded, pixels))
        assert [w for w, _ in streamed] == words
        torch.testing.assert_close(torch.tensor(np.stack([a for _, a in streamed], 2)), torch.tensor(weights))
        if model == "transformer":  # eval is the task's, whatever the model
            code, out, err = run_cli(["eval", run, "--json"], capsys)
            assert code == 0 and '"exact_match"' in out and '"attention_on_digit"' in out, err


def test_word_regions_count_a_word_right_when_its_top_patch_is_on_its_digit():
    """A stand-in model whose attention is put by hand: on each word's own digit, then one patch off."""
    from attnlab.data import strips as S
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.interpret.word_regions import digit_attention
    from attnlab.tasks.translate import to_ids

    found = S.strips("test", 6)
    tok = train_tokenizer("word", [s.caption for s in found], 100)
    hyps = [to_ids(tok, s.caption).tolist() for s in found]
    hyps[0] = hyps[1]  # a wrong caption: not checked

    class Pointing(torch.nn.Module):
        def __init__(self, shift: int):
            super().__init__()
            self.shift, self.w = shift, torch.nn.Parameter(torch.zeros(1))
            self.cfg = CaptionerConfig(image_width=48)  # 4 x 4 patches: 2 x 12

        def alignment(self, images, tgt_in):  # (B, L, H, T, N) with all weight on one patch per word
            out = torch.zeros(len(images), 1, 1, tgt_in.shape[1], 24)
            for b, image in enumerate(images):
                strip = next(s for s in found if torch.equal(torch.from_numpy(s.image), image[0]))
                for t, (_, deps) in enumerate(S.caption_words(strip.digits)):
                    col = strip.boxes[deps[0]][0] // 4 + 1 + self.shift  # inside the digit, or moved off it
                    out[b, 0, 0, t, min(col, 23)] = 1
            return out

    right = digit_attention(Pointing(0), tok, found, hyps)
    assert right["attention_on_digit"] == 1.0 and right["attention_strips"] == 5
    assert right["attention_other_words"] == 1.0
    words = [w for s in found[1:] for w, _ in S.caption_words(s.digits)]
    digit_words = [w for w in words if w not in ("hundred", "thousand", "-")]
    assert (right["attention_words"], right["attention_others"]) == (len(digit_words), len(words) - len(digit_words))
    assert digit_attention(Pointing(8), tok, found, hyps)["attention_on_digit"] < 0.5


def test_compare_captioners_table_and_chart(tmp_path, capsys, monkeypatch):
    """`attnlab compare --task caption`: both captioners on one data, a row each with the attention check."""
    import functools
    import json

    import attnlab.data.captions as captions
    import attnlab.tasks.caption as cap
    from tests.conftest import run_cli

    budget = dict(max_steps=3, batch_size=8, eval_interval=3, eval_batches=1, device="cpu")
    for name in cap.TRAIN_DEFAULTS:  # a few steps: this checks the command, not the scores
        monkeypatch.setitem(cap.TRAIN_DEFAULTS, name, budget)
    monkeypatch.setattr(
        captions, "CaptionDataConfig", functools.partial(captions.CaptionDataConfig, n_train=64, n_test=16)
    )
    code, out, err = run_cli(["compare", "--task", "caption", "--out", tmp_path], capsys)
    assert code == 0, err
    assert "on digit" in out and "rnn-attention" in out
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["transformer", "rnn-attention"]
    assert all(0 <= r["exact_match"] <= 1 and 0 <= r["attention_on_digit"] <= 1 for r in rows)
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_text_lines_get_full_height_patches_unless_told_otherwise():
    from attnlab.tasks.caption import model_config

    for name in ("transformer", "rnn-attention"):
        assert model_config(name, 40, (1, 8, 48), 16, {}).patch == (8, 4)  # digits-strips: 12 columns
        assert model_config(name, 40, (1, 8, 48), 16, {"patch_size": 4}).patch == (4, 4)  # the user's word wins
        assert model_config(name, 40, (3, 32, 32), 16, {}).patch == (4, 4)  # not a text line: square patches
