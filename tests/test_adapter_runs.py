"""LoRA runs out and in: `attnlab export RUN --to peft DIR` gives an adapter PEFT loads over the base with
attnlab's logits, `attnlab merge` a full run with the LoRA run's logits, and a PEFT-made adapter folder
reads (once, into the cache) as a LoRA run with PEFT's logits, on a random GPT-2 and a random Llama
built here (nothing downloaded). LoRA runs are written by hand (tests/conftest.py write_lora_run)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import attnlab
from attnlab.data.chat import ChatTemplate
from attnlab.errors import AttnlabError
from attnlab.interop.adapter_runs import export_peft
from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.io import read_json, write_json
from attnlab.nn.lora import LoRAConfig
from attnlab.runs.adapted import CHAT_TEMPLATE, as_run
from attnlab.runs.marker import read_marker, record
from attnlab.runs.merge import float_adapted, merge_run
from tests.conftest import extra, moved_peft, run_cli, write_lora_run

transformers = extra("transformers", "the reference models are a dev extra")
peft = extra("peft", "PEFT, the reference for the adapter layout, is a dev extra")

pytestmark = pytest.mark.usefixtures("one_thread")
ALL = {"gpt2": ("q", "k", "v", "out", "up", "down"), "llama": ("q", "k", "v", "out", "gate", "up", "down")}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """name -> a folder holding hf/ (a random HuggingFace model) and run/ (converted from it)."""
    from tests.test_convert_gpt2 import save_hf as save_gpt2
    from tests.test_convert_llama import save_hf as save_llama

    out = {}
    for name, save, shape in (("gpt2", save_gpt2, "2x32"), ("llama", save_llama, "llama_gqa_untied")):
        root = tmp_path_factory.mktemp(name)
        save(root / "hf", shape)
        convert_from_hf(root / "hf", root / "run")
        out[name] = root
    return out


def ids() -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(0, 300, (2, 20))  # (B, T)


@torch.no_grad()
def logits(run, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A run's logits. A merge is compared in float64: its weights were folded and stored in float32
    (about 8e-7 from the unmerged model then), but the float32 forward pass would add up to 1e-5."""
    return attnlab.load(run, device="cpu").model.to(dtype)(ids())


@torch.no_grad()
def peft_logits(adapter) -> torch.Tensor:
    """PEFT's own reading of an adapter folder, over the base its config names."""
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager")
    return peft.PeftModel.from_pretrained(hf, adapter).eval()(ids()).logits


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_an_exported_adapter_loads_in_peft_with_the_lora_runs_logits(bases, name, tmp_path, capsys):
    lora = write_lora_run(bases[name] / "run", tmp_path / "lora", LoRAConfig(rank=4, alpha=8.0, targets=ALL[name]))
    code, out, _ = run_cli(["export", lora, "--to", "peft", tmp_path / "adapter"], capsys)
    summary = json.loads(out)
    assert code == 0 and summary["base"] == str(bases[name] / "hf") and "note" not in summary
    ours = logits(lora)
    assert (ours - logits(bases[name] / "run")).abs().max() > 1e-2  # the adapter matters
    assert (ours - peft_logits(tmp_path / "adapter")).abs().max() < 1e-4


def test_an_attnlab_base_is_named_and_exported_as_the_note_says(bases, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(bases["gpt2"] / "run", base)
    write_json(base / "config.json", {k: v for k, v in read_json(base / "config.json").items() if k != "source"})
    lora = write_lora_run(base, tmp_path / "lora", LoRAConfig(rank=2, alpha=4.0, targets=("q", "v")))
    summary = export_peft(lora, tmp_path / "adapter")
    assert summary["base"] == str(base) and f"attnlab export {base} --to hf DIR" in summary["note"]
    export_hf(base, tmp_path / "base-hf")  # as the note says
    config = tmp_path / "adapter" / "adapter_config.json"
    write_json(config, {**read_json(config), "base_model_name_or_path": str(tmp_path / "base-hf")})
    assert (logits(lora) - peft_logits(tmp_path / "adapter")).abs().max() < 1e-4


def test_exporting_says_what_does_not_apply_in_one_line(bases, tmp_path, capsys):
    code, _, err = run_cli(["export", bases["gpt2"] / "run", "--to", "peft", tmp_path / "a"], capsys)
    assert code == 2 and "not a LoRA run: export it with --to hf" in err and len(err.splitlines()) == 1
    lora = write_lora_run(bases["gpt2"] / "run", tmp_path / "lora", LoRAConfig(rank=2))
    code, _, err = run_cli(["export", lora, "--to", "hf", tmp_path / "h"], capsys)
    assert code == 2 and "is a LoRA run: export its adapter with --to peft, or merge it" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    code, _, err = run_cli(["export", lora, "--to", "peft", tmp_path / "mine", "--force"], capsys)
    assert code == 2 and "is not a PEFT adapter folder" in err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_a_merged_run_is_the_lora_run_as_a_full_run(bases, tmp_path, capsys):
    lora = write_lora_run(bases["gpt2"] / "run", tmp_path / "lora", LoRAConfig(rank=4, targets=ALL["gpt2"]))
    record(lora, CHAT_TEMPLATE)
    write_json(lora / CHAT_TEMPLATE, ChatTemplate().to_dict())
    code, out, _ = run_cli(["merge", lora, "--out", tmp_path / "merged"], capsys)
    assert code == 0 and "adapters folded into its base (8 matrices" in out
    merged = tmp_path / "merged"
    assert (logits(merged, torch.float64) - logits(lora, torch.float64)).abs().max() < 1e-5
    assert (logits(merged) - logits(lora)).abs().max() < 1e-4
    config = read_json(merged / "config.json")
    assert "adapter" not in config and config["task"] == {"kind": "sft"}
    assert config["model"] == read_json(lora / "config.json")["model"]
    assert (
        set(read_marker(merged)["files"])
        == {p.name for p in merged.iterdir()}
        == {"attnlab.json", "config.json", "model.safetensors", "tokenizer.json", CHAT_TEMPLATE}
    )
    assert (merged / "tokenizer.json").read_bytes() == (lora / "tokenizer.json").read_bytes()
    code, _, err = run_cli(["merge", lora, "--out", merged], capsys)
    assert code == 2 and "already exists: choose another --out, or --force" in err
    code, _, err = run_cli(["merge", lora, "--out", bases["gpt2"] / "run", "--force"], capsys)
    assert code == 2 and "would replace its base run" in err
    export_hf(merged, tmp_path / "hf")  # a full run: HuggingFace's export takes it
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert (hf(ids()).logits - logits(lora)).abs().max() < 1e-4


def test_an_nf4_runs_adapters_merge_onto_the_float_base(bases, tmp_path, capsys):
    lora = write_lora_run(bases["llama"] / "run", tmp_path / "lora", LoRAConfig(rank=4), quantize="nf4")
    code, out, _ = run_cli(["merge", lora, "--out", tmp_path / "merged"], capsys)
    assert code == 0 and "quantized to nf4: the adapters are folded into the float base" in out
    net, _ = float_adapted(lora)
    with torch.no_grad():
        float_logits = net.double().eval()(ids())
    merged = logits(tmp_path / "merged", torch.float64)
    assert (merged - float_logits).abs().max() < 1e-5
    assert (merged - logits(lora, torch.float64)).abs().max() > 1e-3  # the LoRA run computes over 4-bit weights


def test_merging_a_run_without_adapters_is_one_line(bases, tmp_path):
    with pytest.raises(AttnlabError, match="is not a LoRA run .*: nothing to merge"):
        merge_run(bases["gpt2"] / "run", tmp_path / "m")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_peft_adapter_folder_reads_as_a_lora_run_once(bases, name, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_pretrained(bases[name] / "hf", attn_implementation="eager")
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn"] if name == "gpt2" else ["q_proj", "v_proj"])
    theirs = moved_peft(hf, config)
    theirs.save_pretrained(tmp_path / "theirs")  # base_model_name_or_path: the folder hf was read from
    run = as_run(tmp_path / "theirs")
    assert "PEFT adapter" in capsys.readouterr().err
    assert as_run(tmp_path / "theirs") == run and capsys.readouterr().err == ""  # the second time: the cache
    config = read_json(run / "config.json")
    assert config["task"] == {"kind": "sft"} and [(c["kind"], c["rank"]) for c in config["converters"]] == [("lora", 4)]
    ours, base = logits(run), logits(bases[name] / "run")
    with torch.no_grad():
        assert (ours - theirs.eval()(ids()).logits).abs().max() < 1e-4 < (ours - base).abs().max()


def test_a_peft_folder_with_no_local_base_is_one_line(tmp_path):
    (tmp_path / "a").mkdir()
    write_json(tmp_path / "a" / "adapter_config.json", {"peft_type": "LORA", "base_model_name_or_path": "gpt2"})
    with pytest.raises(AttnlabError, match="base_model_name_or_path 'gpt2' is not a local folder: attnlab downloads"):
        as_run(tmp_path / "a")
