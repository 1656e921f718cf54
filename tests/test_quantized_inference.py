"""Quantized weights for inference (quant/packed.py, runs/quantized.py): the int8 and int4 products against
dequantize-then-multiply, the int4 error bound, every decoder family quantized, greedy decoding against
float32, cached against uncached and batched against alone, quantized runs written and read back, the
per-shape choice of kernel, and the command line."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from conftest import TEXT, int4_rows_exact, perturb, run_cli, tiny_data, tiny_model, tiny_train
from torch import nn

import attnlab
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.sampling import stream, stream_rows
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.quant import pack_choice, row_kernels
from attnlab.quant.packed import COMPUTE, KINDS, ROW_LIMIT, ROW_OPS, PackedLinear, dequantize_int4, quantize_int4
from attnlab.runs.quantized import FLOAT, quantize_for_inference
from attnlab.runs.quantized_run import quantize_run
from attnlab.runtime.timing import Measurement, Timing

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(layer: PackedLinear, x: torch.Tensor, round_x: bool = True) -> torch.Tensor:
    """x @ W^T + b in float32, W dequantized from the codes by the formulas (scales and zeros rounded to
    bfloat16, as the kernels take them) and x rounded to bfloat16 as PyTorch's kernels take it (attnlab's
    one-row operators take it in float32: round_x=False)."""
    bf16 = lambda t: t.to(COMPUTE).float()
    if layer.kind == "int8":
        w = layer.codes.float() * bf16(layer.scales)[:, None]
    elif layer.kind == "int4":
        q = torch.stack((layer.codes & 15, layer.codes >> 4), dim=2).view(layer.out_features, -1).float()
        groups = q.shape[1] // layer.scales.shape[1]
        w = (q - 8) * bf16(layer.scales).repeat_interleave(groups, 1) + bf16(layer.zeros).repeat_interleave(groups, 1)
    else:
        w = layer.weight.float()
    y = (bf16(x) if round_x else x) @ w.T
    return y if layer.bias is None else y + layer.bias


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lead", [(1,), (1, 3), (5, 3), (33, 3)])  # up to ROW_LIMIT rows: a decode step's product
@pytest.mark.parametrize("bias", [True, False])
def test_packed_product_is_dequantize_then_multiply(kind, lead, bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)  # 40 outputs: int4's kernel pads them to 48 and the padding is cut off
    layer = PackedLinear.from_linear(linear, kind)
    x = torch.randn(*lead, 96)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (*lead, 40) and y.dtype == torch.float32
    if kind in ROW_OPS and x.numel() // 96 <= ROW_LIMIT and row_kernels.loaded():  # attnlab's operator
        if kind == "int4":  # its activations rounded to int8 per block of 32
            exact = int4_rows_exact(x.reshape(-1, 96), layer.codes, layer.scales, layer.zeros).float()
            ref = (exact if layer.bias is None else exact + layer.bias).view(*lead, 40)
        else:  # float32 throughout
            ref = reference(layer, x.reshape(-1, 96), round_x=False).view(*lead, 40)
        assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6), (y - ref).abs().max()
        return
    ref = reference(layer, x.reshape(-1, 96)).view(*lead, 40)
    # The kernels accumulate in float32 and round their output to bf16: 2^-8 of each output at most.
    assert torch.allclose(y, ref, rtol=2**-7, atol=1e-3), (y - ref).abs().max()


def test_int4_error_is_at_most_half_a_step_per_group():
    torch.manual_seed(0)
    w = torch.randn(24, 128) * torch.rand(24, 1) * 4
    w[3, :32] = 1.5  # a constant group: its step is 0, and it comes back exactly
    codes, scales, zeros = quantize_int4(w, 32)
    assert codes.dtype == torch.uint8 and codes.shape == (24, 64) and scales.shape == zeros.shape == (24, 4)
    back = dequantize_int4(codes, scales, zeros)
    step = scales.repeat_interleave(32, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(back[3, :32], w[3, :32])
    # 16 levels from each group's min to its max: both ends are levels.
    g = w.view(24, 4, 32)
    assert torch.allclose(back.view(24, 4, 32).amin(2), g.amin(2), atol=1e-6)
    assert torch.allclose(back.view(24, 4, 32).amax(2), g.amax(2), atol=1e-5)


@pytest.mark.parametrize("preset", ["gpt-nano", "llama-nano", "moe-nano"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_decoder_family_quantizes(preset, kind):
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig.from_preset(preset)), 0.02)
    quantized = copy.deepcopy(model)
    report = quantize_for_inference(quantized, kind, every_layer=True)
    packed = [n for n, k in report.layers.items() if k != FLOAT]
    assert "head" in packed and any(".attn.qkv_proj" in n for n in packed)
    assert all(isinstance(quantized.get_submodule(n), PackedLinear) for n in packed)
    assert report.bytes_after < report.bytes_before
    kept = {n for n, k in report.layers.items() if k == FLOAT}
    if preset == "moe-nano":
        assert kept == {f"blocks.{i}.ff.router" for i in range(4)}  # routing stays exact
    if preset == "llama-nano" and kind != "bf16":  # SwiGLU's 344 wide hidden layer: not whole blocks of 32
        assert kept == {f"blocks.{i}.ff.down" for i in range(4)}
    # Against the float model holding the dequantized weights, only the kernels' rounding of activations
    # differs (bf16 in PyTorch's kernels, none in attnlab's int8 and bf16 rows, int8 per block of 32 in
    # its int4 rows: 5-7% of these random models' logits); against the float32 model, the weights' too.
    dequantized = copy.deepcopy(model)
    dequantized.head.weight = nn.Parameter(dequantized.head.weight.clone())  # untied: the embedding stays float
    with torch.no_grad():
        for name in packed:
            dequantized.get_submodule(name).weight.copy_(quantized.get_submodule(name).dequantize())
    ids = torch.randint(0, 256, (2, 12))
    with torch.inference_mode():
        want, got, same_weights = model(ids), quantized(ids), dequantized(ids)
    assert ((got - same_weights).norm() / same_weights.norm()).item() < (0.1 if kind == "int4" else 0.02)
    error = ((got - want).norm() / want.norm()).item()
    assert error < {"int8": 0.02, "int4": 0.4, "bf16": 0.01}[kind], error


def wide_gaps_model(device: str | torch.device = "cpu") -> GPT:
    """A GPT trained for a moment on repeated code, on `device`: its greedy choices are clear, not
    near-ties, so a kernel's rounding cannot flip them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=64, context=64, vocab_size=64)).to(device)
    ids = torch.tensor([[ord(c) % 64 for c in TEXT * 2]], device=device)[:, :65]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        _, loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_greedy_int8_decodes_what_float32_decodes():
    model = wide_gaps_model()
    prompt = [ord(c) % 64 for c in "def add("]
    want = list(stream(model, prompt, 40, temperature=0, dtype="float32"))
    quantized = copy.deepcopy(model)
    quantize_for_inference(quantized, "int8", every_layer=True)
    got = list(stream(quantized, prompt, 40, temperature=0, dtype="float32"))
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if first is not None:  # allowed only at a near-tie of float32's own logits, which this model has none of
        with torch.no_grad():
            top = model(torch.tensor([prompt + want[:first]]))[0, -1].topk(2).values
        pytest.fail(f"int8 greedy differs from float32's at token {first} (float32's top-2 gap {top[0] - top[1]:.4f})")
    assert got == want


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_cached_equals_uncached_and_batched_equals_alone_quantized(kind):
    model = wide_gaps_model()
    quantize_for_inference(model, kind, every_layer=True)
    prompt = [ord(c) % 64 for c in "class Point"]
    cached = list(stream(model, prompt, 30, temperature=0))
    uncached = list(stream(model, prompt, 30, temperature=0, use_cache=False))
    assert cached == uncached
    rows = [list(map(int, step)) for step in stream_rows(model, prompt, 3, 30, temperature=0)]
    assert all(r == [t] * 3 for r, t in zip(rows, cached))  # the batch of 3: each row the lone sequence


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qrun")
    corpus = folder / "code.txt"
    corpus.write_text(TEXT * 30)
    attnlab.train(
        folder / "lm",
        tiny_model(d_model=64),
        tiny_train(max_steps=2, warmup_steps=1),
        tiny_data(corpus),
        progress=False,
    )
    return folder / "lm"


@pytest.mark.parametrize("kind", KINDS)
def test_a_quantized_run_loads_what_was_quantized(lm_run, tmp_path, kind):
    summary = quantize_run(lm_run, kind, tmp_path / "q", every_layer=True)
    assert summary["kind"] == kind and summary["megabytes_after"] < summary["megabytes_before"]
    loaded = attnlab.load(tmp_path / "q", device="cpu")
    in_memory = attnlab.load(lm_run, device="cpu", quantize=kind, every_layer=True)
    assert loaded.config["quantized"]["kind"] == kind and loaded.config["quantized"]["from"] == str(lm_run)
    ids = torch.randint(0, loaded.model.cfg.vocab_size, (1, 20))
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids), in_memory.model(ids))
    assert isinstance(loaded.model.head, PackedLinear) and loaded.tokenizer is not None
    with pytest.raises(AttnlabError, match="already quantized"):
        attnlab.load(tmp_path / "q", quantize="int8")


def _timing(seconds: float) -> Timing:
    return Timing(seconds, 0.01, 7)


def test_a_shape_float32_runs_faster_stays_float32_and_the_answer_is_kept(monkeypatch):
    calls = []

    def fake(timer, *a, **k):  # float32 measured twice as fast as the packed kernel
        calls.append(1)
        return Measurement(_timing(1.0), _timing(2.0))

    monkeypatch.setattr(pack_choice, "measure", fake)
    monkeypatch.setattr(pack_choice, "AGAIN_AFTER", 0.0)
    pack_choice._CHOSEN.clear()
    model = GPT(tiny_model(d_model=64))
    report = quantize_for_inference(model, "int8")
    assert set(report.layers.values()) == {FLOAT} and "float32 measured 2x faster" in next(iter(report.kept.values()))
    n = len(calls)  # each shape twice: an answer that keeps float32 is measured again before it is kept
    assert n == 2 * len({(m.out_features, m.in_features) for _, m in model.named_modules() if isinstance(m, nn.Linear)})
    pack_choice._CHOSEN.clear()  # a new process: the answers come from kernels.json, not from timing again
    quantize_for_inference(GPT(tiny_model(d_model=64)), "int8")
    assert len(calls) == n


def test_float32_faster_once_but_not_again_packs_and_is_not_kept(monkeypatch):
    answers = iter([2.0, 0.5] * 100)  # the packed product's time: float32 faster, then not

    def fake(timer, *a, **k):
        return Measurement(_timing(1.0), _timing(next(answers)))

    monkeypatch.setattr(pack_choice, "measure", fake)
    monkeypatch.setattr(pack_choice, "AGAIN_AFTER", 0.0)
    monkeypatch.setattr(pack_choice, "_keep", lambda *a: pytest.fail("an answer in doubt was kept"))
    monkeypatch.setattr(pack_choice, "_read", dict)  # nothing kept by an earlier test
    pack_choice._CHOSEN.clear()
    report = quantize_for_inference(GPT(tiny_model(d_model=64)), "int8")
    assert FLOAT not in report.layers.values()


def test_a_noisy_timing_packs(monkeypatch):
    monkeypatch.setattr(pack_choice, "measure", lambda *a, **k: Measurement(_timing(1.0), Timing(3.0, 0.9, 7)))
    pack_choice._CHOSEN.clear()
    report = quantize_for_inference(GPT(tiny_model(d_model=64)), "int4")
    assert FLOAT not in report.layers.values()


def test_quantize_refuses_what_it_cannot_quantize(lm_run, tmp_path, capsys):
    code, _, err = run_cli(["quantize", lm_run, "--to", "int8", "--out", lm_run], capsys)
    assert code == 2 and "would replace the run being quantized" in err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    code, _, err = run_cli(["quantize", lm_run, "--to", "int8", "--out", tmp_path / "taken"], capsys)
    assert code == 2 and "already exists" in err and (tmp_path / "taken" / "mine.txt").read_text() == "keep"
    code, _, err = run_cli(["quantize", lm_run, "--to", "int3", "--out", tmp_path / "q"], capsys)
    assert code == 2 and "int3" in err and not (tmp_path / "q").exists()
    model = GPT(tiny_model())
    from attnlab.nn.lora import LoRAConfig, add_lora

    add_lora(model, LoRAConfig(rank=2))
    with pytest.raises(AttnlabError, match="merge them into its base first"):
        quantize_for_inference(model, "int8")


def test_sample_and_eval_take_quantize(lm_run, tmp_path, capsys):
    code, out, err = run_cli(
        ["sample", lm_run, "--quantize", "int4", "--max-new-tokens", "8", "--seed", "1", "--device", "cpu"], capsys
    )
    assert code == 0 and "as int4" in err and out.strip()
    code, out, err = run_cli(["quantize", lm_run, "--to", "int8", "--out", tmp_path / "q8", "--every-layer"], capsys)
    assert code == 0 and "as int8" in out
    code, out, _ = run_cli(["eval", tmp_path / "q8", "--max-tokens", "500", "--json", "--device", "cpu"], capsys)
    assert code == 0 and '"loss"' in out


def test_the_servers_batched_steps_decode_quantized_rows_as_each_alone():
    model = wide_gaps_model()
    quantize_for_inference(model, "int4", every_layer=True)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    draws = [Draw(0.0, seed=1), Draw(1.0, 5, seed=2), Draw(0.8, None, 0.9, seed=3), Draw(1.2, seed=4)]
    alone = [[int(t[0]) for t in stream_rows(model, p, 1, 24, d)] for p, d in zip(prompts, draws)]
    engine = Engine(model, max_batch=4, dtype="float32")
    got, ended = [[] for _ in prompts], threading.Semaphore(0)
    for i, (p, d) in enumerate(zip(prompts, draws)):  # submit(): the server's way, on the engine's thread
        engine.submit(p, d, 24, lambda s, i=i: got[i].append(s.token) if s is not None else ended.release())
    assert all(ended.acquire(timeout=120) for _ in prompts)
    engine.close(wait=5)
    assert got == alone
    assert engine.stats["batched rows"] > 0  # the rows shared steps
