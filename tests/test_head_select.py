"""--keep / --remove: which heads a spec names, and that zeroing them is what sample and predict see."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError
from attnlab.interpret.head_select import head_hooks, parse_heads
from attnlab.models import build_model
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.nn.hooks import taps
from tests.conftest import flags, perturb

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def gpt(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=40, context=16, n_layer=2, n_head=4, d_model=16, dropout=0.0, **kw)
    return build_model("gpt", cfg).eval()


def test_specs_name_layers_and_heads_from_one():
    model = gpt()
    assert parse_heads("2.3", model) == {"blocks.1.attn.hook_head_out": {2}}
    assert parse_heads("1.1, 1.4,2", model) == {
        "blocks.0.attn.hook_head_out": {0, 3},
        "blocks.1.attn.hook_head_out": {0, 1, 2, 3},
    }
    for bad in ("3.1", "1.5", "0.1", "x", "cross:1.1", "left:1.1", ""):
        with pytest.raises(AttnlabError):
            parse_heads(bad, model)


def test_removing_heads_equals_zeroing_their_share_of_the_output_projection():
    """The hooks' output equals a copy of the model whose W_O columns for those heads are zero."""
    model, ids = gpt(), torch.randint(0, 40, (2, 9))
    with attnlab.hooks(model, head_hooks(model, remove="1.2,2.4")):
        got = model(ids)
    edited = gpt()
    with torch.no_grad():
        for layer, head in ((0, 1), (1, 3)):
            edited.blocks[layer].attn.out_proj.weight[:, head * 4 : (head + 1) * 4] = 0
    assert torch.allclose(got, edited(ids), atol=1e-6)
    assert not torch.allclose(got, model(ids), atol=1e-4)


def test_keep_leaves_only_the_named_heads():
    model = gpt()
    fns = head_hooks(model, keep="2.1")
    assert fns["blocks.0.attn.hook_head_out"].heads == [0, 1, 2, 3]
    assert fns["blocks.1.attn.hook_head_out"].heads == [1, 2, 3]
    with pytest.raises(AttnlabError, match="not both"):
        head_hooks(model, keep="1.1", remove="1.2")
    assert head_hooks(model) == {}


def test_encoder_decoder_prefixes_pick_the_attention():
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab=30, tgt_vocab=30, d_model=16, n_head=2, n_layer=2, d_ff=32, context=12)
    model = build_model("seq2seq", cfg).eval()
    assert parse_heads("cross:2.1", model) == {"decoder.1.cross.hook_head_out": {0}}
    assert parse_heads("decoder:1", model) == {"decoder.0.attn.hook_head_out": {0, 1}}
    assert parse_heads("1.2", model) == {"encoder.0.attn.hook_head_out": {1}}
    fns = head_hooks(model, keep="cross:1.1")  # only cross-attention heads are touched
    assert set(fns) == {"decoder.0.cross.hook_head_out", "decoder.1.cross.hook_head_out"}


def test_decoding_with_the_kv_cache_honours_the_hooks():
    """Sampling's path (KV cache, fused attention) sees the removed heads: with every head gone and
    no positions, each step sees only its own token, so the output no longer depends on the prompt."""
    from attnlab.decoding.sampling import stream

    model = perturb(gpt(positions="none"), 1.0)  # random weights everywhere (zero-init projections too)
    greedy = lambda prompt: list(stream(model, prompt, 8, temperature=0))
    assert greedy([1, 2, 3]) != greedy([9, 8, 3])  # with attention, the prompt matters
    with attnlab.hooks(model, head_hooks(model, remove="1,2")):
        assert greedy([1, 2, 3]) == greedy([9, 8, 3])


def test_cli_sample_removes_heads_and_says_how_many(tmp_path, capsys, monkeypatch):
    from attnlab.cli.main import main
    from tests.conftest import run_cli

    (tmp_path / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 100)
    run = tmp_path / "gpt"
    args = [
        "train",
        "lm",
        "--data",
        tmp_path / "corpus.txt",
        "--out",
        run,
        *flags(preset="gpt-nano", n_layer=2, d_model=16, n_head=2, context=16, max_steps=3, batch_size=2),
        *flags(eval_interval=3, eval_batches=1, device="cpu"),
    ]
    assert main([str(a) for a in args]) == 0
    capsys.readouterr()
    greedy = ["sample", run, "--prompt", "def", "--max-new-tokens", "12", "--temperature", "0", "--device", "cpu"]
    code, plain, err = run_cli(greedy, capsys)
    assert code == 0 and "zeroed" not in err
    import attnlab.decoding.sampling as sampling

    active, real = [], sampling.stream_text

    def spy(model, *args, **kw):  # which heads' hooks are set while the text is generated
        active.extend(name for name, tap in taps(model).items() if tap.active)
        return real(model, *args, **kw)

    monkeypatch.setattr(sampling, "stream_text", spy)
    code, removed, err = run_cli([*greedy, "--remove", "1,2.2"], capsys)
    assert code == 0 and "[zeroed 3 of 4 heads]" in err and removed.startswith("def")
    assert active == ["blocks.0.attn.hook_head_out", "blocks.1.attn.hook_head_out"]
    code, _, err = run_cli([*greedy, "--keep", "1.1", "--remove", "1.2"], capsys)
    assert code == 2 and "not allowed with" in err
    code, _, err = run_cli([*greedy, "--remove", "3.1"], capsys)
    assert code != 0 and "layer is a number from 1 to 2" in err
