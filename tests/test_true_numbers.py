"""Numbers a user can check, checked against what they describe: parameter counts with packed and
quantized matrices (nn/counting.py), `attnlab quantize`'s file sizes, `attnlab runs`' preset."""

import json
import re

import pytest
import torch

import attnlab
from attnlab.models import build_model
from attnlab.nn.counting import count_parameters
from attnlab.nn.lora import LoRAConfig, add_lora, lora_parameters
from attnlab.quant.quantize import quantize_model
from attnlab.runs.listing import list_runs
from attnlab.runs.quantized import quantize_for_inference
from tests.conftest import flags, run_cli, tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")


def gpt(**kw) -> torch.nn.Module:
    return build_model("gpt", {"n_layer": 2, "n_head": 2, "d_model": 64, "context": 32, "vocab_size": 96, **kw})


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kind", ["int8", "int4", "bf16"])
def test_packed_layers_count_as_the_weights_they_stand_for(kind, tied):
    model = gpt(tie_weights=tied)
    n = sum(p.numel() for p in model.parameters())  # the float model's count, a tied weight once
    assert count_parameters(model).logical == n == model.num_params()
    floats = sum(p.numel() * 4 for p in model.parameters())
    report = quantize_for_inference(model, kind, every_layer=True)
    assert all(k == kind for k in report.layers.values())  # every matrix packed: the count is theirs
    counted = count_parameters(model)
    assert counted.logical == n and sum(p.numel() for p in model.parameters()) < n
    assert counted.packed > 0 and counted.stored_bytes < floats


def test_a_quantized_base_under_lora_counts_whole():
    model = gpt()
    n = count_parameters(model).logical
    quantize_model(model, "nf4")
    add_lora(model, LoRAConfig(rank=2))
    adapters = sum(p.numel() for p in lora_parameters(model))
    counted = count_parameters(model)
    assert counted.logical == n + adapters and counted.trained == adapters
    assert counted.line().startswith(f"{(n + adapters) / 1e6:.2f}M parameters ({adapters / 1e6:.3f}M trained")


@pytest.fixture(scope="module")
def float_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("numbers")
    (root / "c.txt").write_text("def f(x):\n    return x * 2\n" * 300)
    attnlab.train(
        root / "lm", tiny_model(), tiny_train(max_steps=2, warmup_steps=1), tiny_data(root / "c.txt"), progress=False
    )
    return root / "lm"


def test_quantize_prints_the_files_sizes_on_disk(float_run, tmp_path, capsys):
    code, out, _ = run_cli(["quantize", float_run, "--to", "int8", "--out", tmp_path / "q8", "--every-layer"], capsys)
    before, after = (float_run / "model.safetensors").stat().st_size, (tmp_path / "q8/model.safetensors").stat().st_size
    said = re.search(r"model\.safetensors (\d+\.\d\d) MB -> (\d+\.\d\d) MB on disk", out)
    assert code == 0 and said, out
    assert said.groups() == (f"{before / 1e6:.2f}", f"{after / 1e6:.2f}")
    code, out, _ = run_cli(["quantize", float_run, "--to", "int4", "--out", tmp_path / "q4", "--json"], capsys)
    summary = json.loads(out)
    assert summary["bytes_before"] == before
    assert summary["bytes_after"] == (tmp_path / "q4/model.safetensors").stat().st_size


def test_runs_and_inspect_count_a_quantized_run_as_its_float_one(float_run, tmp_path, capsys):
    assert run_cli(["quantize", float_run, "--to", "int4", "--out", tmp_path / "q4", "--every-layer"], capsys)[0] == 0
    n = count_parameters(attnlab.load(float_run, device="cpu").model).logical
    (listed,) = list_runs(tmp_path)
    assert listed.parameters == n and "int4" in listed.model
    said = repr(attnlab.load(tmp_path / "q4", device="cpu"))
    assert f"{n:,} parameters (" in said and "packed" in said


def test_an_sft_run_names_its_preset_and_counts_its_quantized_base(tmp_path, capsys):
    """The start line of a LoRA run on an NF4 base counts the base's matrices; `attnlab runs` shows
    the preset the base started from."""
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.instructions import instructions

    chats = "".join(ChatTemplate().render(c.messages) for c in instructions("train", 200, 5))
    (tmp_path / "chats.txt").write_text(chats)
    small = (
        "--n-layer 1 --d-model 16 --n-head 2 --batch-size 2 --device cpu --dtype float32 "
        "--warmup-steps 1 --eval-batches 1"
    ).split()
    base = ["train", "lm", "--preset", "gpt-nano", "--context", "256", "--tokenizer", "char", "--max-steps", "1"]
    assert run_cli([*base, "--data", tmp_path / "chats.txt", "--out", tmp_path / "runs/base", *small], capsys)[0] == 0
    sft = [
        "train",
        "sft",
        "--init",
        tmp_path / "runs/base",
        *flags(lora_rank=2, quantize_base="nf4", max_steps=1, examples=20, test_examples=4),
        "--out",
        tmp_path / "runs/sft",
    ]
    code, _, err = run_cli(
        [*sft, *flags(batch_size=2, warmup_steps=1, eval_batches=1, dtype="float32", device="cpu")],
        capsys,
    )
    assert code == 0, err
    whole = count_parameters(attnlab.load(tmp_path / "runs/base", device="cpu").model).logical
    adapters = sum(p.numel() for p in lora_parameters(attnlab.load(tmp_path / "runs/sft", device="cpu").model))
    assert f"model {(whole + adapters) / 1e6:.2f}M parameters ({adapters / 1e6:.3f}M trained" in err
    code, out, _ = run_cli(["runs", tmp_path / "runs"], capsys)
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert code == 0 and "(gpt-nano)" in rows[str(tmp_path / "runs/base")]
    assert "(gpt-nano, lora)" in rows[str(tmp_path / "runs/sft")]
