"""LoRA adapters in PEFT's layout: an attnlab adapter on a random Llama or GPT-2 (built here, nothing
downloaded) loaded by PeftModel.from_pretrained gives attnlab's logits, and a PEFT-made adapter read by
attnlab gives PEFT's. GPT-2's fused c_attn carries attnlab's q, k and v adapters as one of a larger
rank (and PEFT's own rank_pattern and alpha_pattern are read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf
from attnlab.interop.peft import CONFIG, WEIGHTS, read_peft, write_peft
from attnlab.io import write_safetensors
from attnlab.nn.lora import LoRAConfig, add_lora, load_lora_state, lora_parameters, lora_state_dict
from tests.conftest import extra, moved_peft

transformers = extra("transformers", "the reference Llama is a dev extra")
peft = extra("peft", "PEFT, the reference for the adapter layout, is a dev extra")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py
ALL = ("q", "k", "v", "out", "gate", "up", "down")


def converted(tmp_path_factory, save_hf, name: str) -> Path:
    """A folder of hf/ (`save_hf`'s model `name`) and run/ (attnlab's conversion of it)."""
    root = tmp_path_factory.mktemp(name)
    save_hf(root / "hf", name)
    convert_from_hf(root / "hf", root / "run")
    return root


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.test_convert_llama import save_hf

    return converted(tmp_path_factory, save_hf, "llama_gqa_untied")


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
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


def read_back(root: Path, hf, config, tmp_path) -> tuple:
    """PEFT's adapter `config` on `hf`, its B moved off zero and saved, read into the converted run
    root/run: both give the same logits, and not the base model's. Returns (PEFT's model, the LoRAConfig read)."""
    theirs = moved_peft(hf, config)
    theirs.save_pretrained(tmp_path / "theirs")
    run = attnlab.load(root / "run", device="cpu")
    with torch.no_grad():
        base = run.model(ids())
    lora, tensors = read_peft(tmp_path / "theirs", run.model.cfg)
    add_lora(run.model, lora)
    load_lora_state(run.model, tensors)
    with torch.no_grad():
        ours = run.model(ids())
        assert (ours - theirs.eval()(ids()).logits).abs().max() < 1e-4 < (ours - base).abs().max()
    return theirs, lora


def test_a_peft_adapter_reads_into_attnlab_with_the_same_logits(llama, tmp_path):
    config = peft.LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    theirs, lora = read_back(llama, hf_base(llama), config, tmp_path)
    assert lora.targets == ("q", "v", "down") and lora.rank == 4 and lora.alpha == 16


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from tests.test_convert_gpt2 import save_hf

    return converted(tmp_path_factory, save_hf, "2x32")


def gpt2_base(root):
    return transformers.GPT2LMHeadModel.from_pretrained(root / "hf").eval()


def test_an_attnlab_adapter_on_gpt2_loads_in_peft_with_the_same_logits(gpt2, tmp_path):
    run = attnlab.load(gpt2 / "run", device="cpu")
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q", "v", "out", "up", "down"))  # k left out: zeros in c_attn
    add_lora(run.model, lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in lora_parameters(run.model):
            p.normal_(0, 0.1)
    write_peft(tmp_path / "adapter", lora_state_dict(run.model), run.model.cfg, lora)
    theirs = peft.PeftModel.from_pretrained(gpt2_base(gpt2), tmp_path / "adapter").eval()
    with torch.no_grad():
        ours, base, out = run.model(ids()), gpt2_base(gpt2)(ids()).logits, theirs(ids()).logits
    assert (ours - base).abs().max() > 1e-2
    assert (ours - out).abs().max() < 1e-4
    config = json.loads((tmp_path / "adapter" / CONFIG).read_text())
    assert config["target_modules"] == ["attn.c_proj", "c_attn", "c_fc", "mlp.c_proj"]
    # c_attn carries q and v: rank 2 r, lora_alpha 2 alpha, the same scale; PEFT built it so
    assert config["rank_pattern"] == {"c_attn": 8} and config["alpha_pattern"] == {"c_attn": 16.0}
    assert theirs.base_model.model.transformer.h[0].attn.c_attn.lora_A["default"].weight.shape == (8, 32)


def test_a_peft_adapter_on_gpt2_reads_into_attnlab_with_the_same_logits(gpt2, tmp_path):
    # c_proj names both attention's output and the MLP's; c_fc has its own rank and alpha
    config = peft.LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["c_attn", "c_proj", "c_fc"],
        rank_pattern={"c_fc": 2},
        alpha_pattern={"c_fc": 3},
    )
    theirs, lora = read_back(gpt2, gpt2_base(gpt2), config, tmp_path)
    assert lora.targets == ("q", "k", "v", "out", "up", "down") and lora.rank == 4 and lora.alpha == 16


def test_an_adapter_read_back_is_the_same_model(gpt2, tmp_path):
    """attnlab -> PEFT -> attnlab: the ranks differ (c_attn's is 2 r, every adapter padded to it), the
    logits do not."""
    run = attnlab.load(gpt2 / "run", device="cpu")
    lora = LoRAConfig(rank=3, alpha=5.0, targets=("q", "v", "down"))
    add_lora(run.model, lora)
    with torch.no_grad():
        for p in lora_parameters(run.model):
            p.normal_(0, 0.1)
    write_peft(tmp_path / "a", lora_state_dict(run.model), run.model.cfg, lora)
    back = attnlab.load(gpt2 / "run", device="cpu")
    lora2, tensors = read_peft(tmp_path / "a", back.model.cfg)
    assert lora2.rank == 6 and lora2.targets == ("q", "k", "v", "down")
    add_lora(back.model, lora2)
    load_lora_state(back.model, tensors)
    with torch.no_grad():
        assert (back.model(ids()) - run.model(ids())).abs().max() < 1e-5


def test_what_attnlab_cannot_map_is_one_line(llama, tmp_path):
    run = attnlab.load(llama / "run", device="cpu")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / CONFIG).write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "lm_head"]})
    )
    head = "base_model.model.lm_head.lora_A.weight"
    write_safetensors(tmp_path / "a" / WEIGHTS, {head: torch.zeros(4, 32)}, {})
    with pytest.raises(AttnlabError, match=f"{WEIGHTS} holds {head}: attnlab maps LoRA on Llama's"):
        read_peft(tmp_path / "a", run.model.cfg)
    layer0 = "base_model.model.model.layers.0.self_attn.q_proj"
    write_safetensors(tmp_path / "a" / WEIGHTS, {f"{layer0}.lora_{ab}.weight": torch.zeros(4, 32) for ab in "AB"}, {})
    with pytest.raises(AttnlabError, match="lacks model.layers.1.self_attn.q_proj.lora_A: attnlab adapts every"):
        read_peft(tmp_path / "a", run.model.cfg)
    (tmp_path / "a" / CONFIG).write_text(json.dumps({"peft_type": "LORA", "use_dora": True}))
    with pytest.raises(AttnlabError, match="use_dora is set; attnlab reads plain LoRA"):
        read_peft(tmp_path / "a", run.model.cfg)
    (tmp_path / "a" / CONFIG).write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(AttnlabError, match="attnlab reads LORA adapters"):
        read_peft(tmp_path / "a", run.model.cfg)
    adapter = {f"blocks.{i}.attn.qkv_proj.lora_{ab}.{t}": torch.zeros(1) for i in range(2) for ab in "AB" for t in "qv"}
    with pytest.raises(AttnlabError, match="holds head.weight beside LoRA's A and B"):
        write_peft(tmp_path / "b", {**adapter, "head.weight": torch.zeros(1)}, run.model.cfg, LoRAConfig(rank=1))
    assert not (tmp_path / "b").exists()
