"""attnlab.interpret.trace and attnlab.hooks: every named activation of every family, read and replaced."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError
from attnlab.models import build_model
from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=40, context=16, n_layer=2, n_head=2, d_model=16, dropout=0.0)
    return build_model("gpt", cfg).eval()


def test_gpt_trace_names_shapes_and_the_residual_stream_add_up():
    model, ids = gpt(), torch.randint(0, 40, (2, 7))
    t = attnlab.trace(model, ids)
    for i in range(2):
        for name, shape in [
            ("hook_resid_pre", (2, 7, 16)),
            ("attn.hook_pattern", (2, 2, 7, 7)),
            ("attn.hook_head_out", (2, 2, 7, 8)),
            ("hook_attn_out", (2, 7, 16)),
            ("hook_resid_mid", (2, 7, 16)),
            ("hook_ff_out", (2, 7, 16)),
            ("hook_resid_post", (2, 7, 16)),
        ]:
            assert t[f"blocks.{i}.{name}"].shape == shape, name
        block = model.blocks[i]
        # Pre-norm: the stream is the input plus each sublayer's output.
        at = lambda name, i=i: t[f"blocks.{i}.{name}"]
        assert torch.allclose(at("hook_resid_mid"), at("hook_resid_pre") + at("hook_attn_out"), atol=1e-6)
        assert torch.allclose(at("hook_resid_post"), at("hook_resid_mid") + at("hook_ff_out"), atol=1e-6)
        # The heads' outputs, concatenated and projected, are the sublayer's output.
        heads = t[f"blocks.{i}.attn.hook_head_out"].transpose(1, 2).reshape(2, 7, 16)
        assert torch.allclose(block.attn.out_proj(heads), t[f"blocks.{i}.hook_attn_out"], atol=1e-6)
        pattern = t[f"blocks.{i}.attn.hook_pattern"]
        assert torch.allclose(pattern.sum(-1), torch.ones(2, 2, 7), atol=1e-6)
        assert torch.all(pattern.triu(1) == 0)  # causal
    assert torch.equal(t["blocks.0.hook_resid_post"], t["blocks.1.hook_resid_pre"])
    assert torch.allclose(t.output, model(ids), atol=1e-6)  # recording changes nothing
    assert t.names()[0] == "blocks.0.hook_resid_pre" and "blocks.0.hook_cross_out" not in t


def test_hooks_replace_activations_and_are_removed_afterwards():
    model, ids = gpt(), torch.randint(0, 40, (1, 6))
    plain = model(ids)
    with attnlab.hooks(model, {"blocks.1.attn.hook_head_out": attnlab.zero_head(0)}):
        ablated = model(ids)
        t = attnlab.trace(model, ids)
    assert not torch.allclose(plain, ablated)
    assert torch.all(t["blocks.1.attn.hook_head_out"][:, 0] == 0) and torch.any(
        t["blocks.1.attn.hook_head_out"][:, 1] != 0
    )
    assert torch.equal(model(ids), plain)  # gone on leaving
    # A pattern hook that returns nothing reads it; one that returns a pattern is what attention applies.
    seen = []
    with attnlab.hooks(model, {"blocks.0.attn.hook_pattern": seen.append}):
        assert torch.allclose(model(ids), plain, atol=1e-6)
    assert seen[0].shape == (1, 2, 6, 6)
    uniform = lambda p: torch.tril(torch.ones_like(p)) / torch.tril(torch.ones_like(p)).sum(-1, keepdim=True)
    with attnlab.hooks(model, {"blocks.0.attn.hook_pattern": uniform}):
        t = attnlab.trace(model, ids)
    v = model.blocks[0].attn  # the head outputs are now running means of the values
    x = model.blocks[0].norm_attn(t["blocks.0.hook_resid_pre"])
    _, _, values = v._heads(v.qkv_proj(x), 2, 2, 2)  # (1, H, T, Dh)
    means = values.cumsum(2) / torch.arange(1, 7).view(1, 1, 6, 1)
    assert torch.allclose(t["blocks.0.attn.hook_head_out"], means, atol=1e-5)


def test_hooks_are_removed_on_error_and_unknown_names_are_refused():
    model, ids = gpt(), torch.randint(0, 40, (1, 5))

    def boom(x):
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        with attnlab.hooks(model, {"blocks.0.hook_resid_pre": boom}):
            model(ids)
    model(ids)  # no hook left behind
    with pytest.raises(AttnlabError, match="no hook point 'blocks.9.hook_resid_pre'"):
        with attnlab.hooks(model, {"blocks.9.hook_resid_pre": print}):
            pass


@pytest.mark.parametrize("family", ["encoder", "seq2seq", "vit"])
def test_every_family_has_the_same_points(family):
    torch.manual_seed(0)
    if family == "encoder":
        model = build_model("encoder", EncoderConfig(vocab_size=30, context=12, n_layer=2, n_head=2, d_model=16))
        inputs, prefixes = (torch.tensor([[2, 5, 7, 9, 0, 0]]),), ["blocks"]
    elif family == "seq2seq":
        cfg = Seq2SeqConfig(src_vocab=30, tgt_vocab=30, n_layer=1, n_head=2, d_model=16, d_ff=32, context=12)
        model = build_model("seq2seq", cfg)
        inputs, prefixes = (torch.tensor([[4, 5, 6]]), torch.tensor([[1, 7]])), ["encoder", "decoder"]
    else:
        cfg = ViTConfig(image_size=8, patch_size=4, channels=1, n_labels=3, n_layer=1, n_head=2, d_model=16)
        model = build_model("vit", cfg)
        inputs, prefixes = (torch.randn(1, 1, 8, 8),), ["blocks"]
    t = attnlab.trace(model.eval(), *inputs)
    for prefix in prefixes:
        assert f"{prefix}.0.attn.hook_pattern" in t and f"{prefix}.0.hook_resid_post" in t
    if family == "encoder":  # padding neither gives nor receives attention
        assert torch.all(t["blocks.0.attn.hook_pattern"][0, :, :4, 4:] == 0)
    if family == "seq2seq":  # the decoder's cross-attention: (B, H, target, source)
        assert t["decoder.0.cross.hook_pattern"].shape == (1, 2, 2, 3)
        assert "decoder.0.hook_cross_out" in t and "encoder.0.hook_cross_out" not in t


def test_trace_reads_text_through_a_runs_tokenizer(tmp_path, corpus):
    from tests.conftest import tiny_data, tiny_model, tiny_train

    attnlab.train(tmp_path / "r", tiny_model(), tiny_train(max_steps=2), tiny_data(corpus), progress=False)
    run = attnlab.load(tmp_path / "r", device="cpu")
    t = attnlab.trace(run, "def add(a, b):")
    n = len(run.tokenizer.encode("def add(a, b):"))
    assert t["blocks.0.attn.hook_pattern"].shape[-1] == n
    with pytest.raises(AttnlabError, match="tokenizer"):
        attnlab.trace(run.model, "text")


def test_attention_only_blocks_add_nothing_after_attention():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=40, context=16, n_layer=2, n_head=2, d_model=16, feedforward="none")
    model = build_model("gpt", cfg).eval()
    t = attnlab.trace(model, torch.randint(0, 40, (1, 6)))
    assert torch.all(t["blocks.0.hook_ff_out"] == 0)
    assert torch.equal(t["blocks.1.hook_resid_post"], t["blocks.1.hook_resid_mid"])
    assert not any(".ff." in name for name, _ in model.named_parameters())  # only the norm before it


def test_mixture_of_experts_routing_is_a_point_and_a_replaced_router_reroutes():
    torch.manual_seed(0)
    moe = dict(feedforward="moe", n_experts=4, experts_per_token=1)
    cfg = GPTConfig(vocab_size=40, context=16, n_layer=1, n_head=2, d_model=16, dropout=0.0, **moe)
    model, ids = build_model("gpt", cfg).eval(), torch.randint(0, 40, (2, 5))
    t = attnlab.trace(model, ids)
    probs = t["blocks.0.ff.hook_router"]
    assert probs.shape == (10, 4) and torch.allclose(probs.sum(-1), torch.ones(10))
    assert torch.equal(model.blocks[0].ff.choice.flatten(), probs.argmax(-1))
    forced = torch.zeros(10, 4)
    forced[:, 2] = 1  # every token to expert 2
    with attnlab.hooks(model, {"blocks.0.ff.hook_router": lambda p: forced}):
        model(ids)
    assert torch.all(model.blocks[0].ff.choice == 2)
