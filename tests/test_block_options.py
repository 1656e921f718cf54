"""One block schema: an option added from this file alone reaches every family, their flags, config.json,
and every exporter's support check; and every exporter says, for every block option, what it can express."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
import torch
from torch import nn

import attnlab
from attnlab.interop.hf import bert, gpt2, llama, qwen3, vit
from attnlab.interop.hf.support import block_problems, undeclared
from attnlab.models import FAMILIES, build_model
from attnlab.models.captioner import CaptionerConfig
from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig
from attnlab.nn import NORMS, BlockConfig, BlockOptions, block_option
from attnlab.nn.options import block_option_names
from tests.conftest import run_cli, tiny_data, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")

EXPORTERS = {"GPT-2": gpt2, "BERT": bert, "Llama": llama, "Qwen3": qwen3, "ViT": vit}
SMALL = dict(n_layer=1, n_head=2, d_model=8)
FAMILY_CONFIGS = {  # one small config of every Transformer family
    "gpt": GPTConfig(**SMALL, context=8, vocab_size=11),
    "encoder": EncoderConfig(**SMALL, context=8, vocab_size=11),
    "seq2seq": Seq2SeqConfig(**SMALL, context=8, src_vocab=11, tgt_vocab=11),
    "vit": ViTConfig(**SMALL, image_size=8, channels=1, patch_size=4, n_labels=3),
    "captioner": CaptionerConfig(**SMALL, context=8, tgt_vocab=11, image_size=8, channels=1, patch_size=4),
}


class GainNorm(nn.Module):
    """A toy norm: RMS-normalized, times a fixed gain that is a block option of its own."""

    def __init__(self, d_model: int, gain: float):
        super().__init__()
        self.gain = gain
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.gain * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.fixture
def gain_norm(monkeypatch):
    """The toy norm registered and its option, norm_gain, added to the block schema, for one test."""
    monkeypatch.setitem(NORMS, "gain", lambda c: GainNorm(c.d_model, c.norm_gain))
    with block_option("norm_gain", float, 1.0, "the gain norm's fixed factor"):
        yield


def test_every_exporter_says_what_it_does_with_every_block_option():
    for name, module in EXPORTERS.items():
        assert undeclared(module.SUPPORT) == [], f"{name}'s exporter names no rule for these block options"


def test_an_option_added_here_reaches_every_family(gain_norm):
    assert "norm_gain" in block_option_names() and "norm_gain" in {f.name for f in fields(BlockConfig)}
    for family, cfg in FAMILY_CONFIGS.items():
        assert "norm_gain" in {f.name for f in fields(type(cfg))}, family
        model = build_model(family, replace(cfg, norm_kind="gain", norm_gain=3.0))
        gains = [m.gain for m in model.modules() if isinstance(m, GainNorm)]
        assert gains and set(gains) == {3.0}, family  # every block's norms, and the final norm
    x = torch.randint(0, 11, (2, 8))
    gpt = build_model("gpt", replace(FAMILY_CONFIGS["gpt"], norm_kind="gain", norm_gain=3.0))
    assert gpt(x).shape == (2, 8, 11)


def test_an_option_added_here_is_a_flag_and_a_config_key(gain_norm, tmp_path, corpus, capsys):
    code, out, _ = run_cli(["train", "lm", "--help"], capsys)
    assert code == 0 and "--norm-gain" in out
    model = replace(FAMILY_CONFIGS["gpt"], context=16, norm_kind="gain", norm_gain=2.5)
    attnlab.train(tmp_path / "run", model, tiny_train(max_steps=2, eval_interval=2), tiny_data(corpus), progress=False)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["norm_kind"] == "gain" and config["model"]["norm_gain"] == 2.5
    run = attnlab.load(tmp_path / "run", device="cpu")
    assert {m.gain for m in run.model.modules() if isinstance(m, GainNorm)} == {2.5}


def test_an_option_no_exporter_knows_is_refused_unless_at_its_default(gain_norm):
    for name, module in EXPORTERS.items():
        assert undeclared(module.SUPPORT) == ["norm_gain"], name
    classic = FAMILY_CONFIGS["gpt"]
    assert block_problems(classic, gpt2.SUPPORT, "GPT-2") == []  # the default value: the block GPT-2 has
    problems = block_problems(replace(classic, norm_gain=2.0), gpt2.SUPPORT, "GPT-2")
    assert problems == ["norm_gain 2.0 (GPT-2 has no place for it)"]
    with pytest.raises(attnlab.AttnlabError, match="norm_gain 2.0"):
        gpt2.check_exportable(replace(classic, norm_gain=2.0))


def test_the_option_is_gone_after_its_test():
    assert "norm_gain" not in block_option_names()
    assert not hasattr(GPTConfig(), "norm_gain") and "norm_gain" not in {f.name for f in fields(BlockOptions)}
    assert set(FAMILY_CONFIGS) <= set(FAMILIES)
