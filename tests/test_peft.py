"""LoRA adapters in PEFT's layout: an attnlab adapter on a random Llama (built here, nothing downloaded)
loaded by PeftModel.from_pretrained gives attnlab's logits, and a PEFT-made adapter read by attnlab
gives PEFT's."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf
from attnlab.interop.peft import CONFIG, read_peft, write_peft
from attnlab.nn.lora import LoRAConfig, add_lora, load_lora_state, lora_parameters, lora_state_dict
from tests.conftest import extra

transformers = extra("transformers", "the reference Llama is a dev extra")
peft = extra("peft", "PEFT, the reference for the adapter layout, is a dev extra")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py
ALL = ("q", "k", "v", "out", "gate", "up", "down")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.test_convert_llama import save_hf

    root = tmp_path_factory.mktemp("peft")
    save_hf(root / "hf", "llama_gqa_untied")
    convert_from_hf(root / "hf", root / "run")
    return root


def hf_base(root):
    return transformers.LlamaForCausalLM.from_pretrained(root / "hf").eval()


def ids() -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(0, 300, (2, 20))  # (B, T)


def test_an_attnlab_adapter_loads_in_peft_with_the_same_logits(llama, tmp_path):
    run = attnlab.load(llama / "run", device="cpu")
    lora = LoRAConfig(rank=4, alpha=8.0, targets=ALL)
    add_lora(run.model, lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in lora_parameters(run.model):
            p.normal_(0, 0.1)  # B away from zero: the adapters change the model
    write_peft(tmp_path / "adapter", lora_state_dict(run.model), run.model.cfg, lora)
    theirs = peft.PeftModel.from_pretrained(hf_base(llama), tmp_path / "adapter").eval()
    with torch.no_grad():
        ours, base, out = run.model(ids()), hf_base(llama)(ids()).logits, theirs(ids()).logits
    assert (ours - base).abs().max() > 1e-2  # the adapter matters
    assert (ours - out).abs().max() < 1e-4
    assert json.loads((tmp_path / "adapter" / CONFIG).read_text())["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # fmt: skip


def test_a_peft_adapter_reads_into_attnlab_with_the_same_logits(llama, tmp_path):
    config = peft.LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    theirs = peft.get_peft_model(hf_base(llama), config)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    theirs.save_pretrained(tmp_path / "theirs")
    run = attnlab.load(llama / "run", device="cpu")
    with torch.no_grad():
        base = run.model(ids())
    lora, tensors = read_peft(tmp_path / "theirs", run.model.cfg)
    assert lora.targets == ("q", "v", "down") and lora.rank == 4 and lora.alpha == 16
    add_lora(run.model, lora)
    load_lora_state(run.model, tensors)
    with torch.no_grad():
        ours = run.model(ids())
        assert (ours - theirs.eval()(ids()).logits).abs().max() < 1e-4 < (ours - base).abs().max()


def test_what_attnlab_cannot_map_is_one_line(llama, tmp_path):
    run = attnlab.load(llama / "run", device="cpu")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                     "target_modules": ["q_proj", "lm_head"]}))  # fmt: skip
    with pytest.raises(AttnlabError, match=r"target_modules \['q_proj', 'lm_head'\]"):
        read_peft(tmp_path / "a", run.model.cfg)
    (tmp_path / "a" / CONFIG).write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(AttnlabError, match="attnlab reads LORA adapters"):
        read_peft(tmp_path / "a", run.model.cfg)
