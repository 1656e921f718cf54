"""attnlab's CUDA paths, each against a reference: every family trains in bf16, `attend`'s fused kernels
(flash, memory-efficient) against its math path, cached against uncached decoding, exact resume,
and --compile against eager. torchrun with NCCL (DDP and FSDP) is in tests/test_cuda_torchrun.py,
inference on the GPU (the server's batched decoding, quantized weights, the compiled decode step) in
tests/test_cuda_serve.py.

Skipped without a GPU (marker `cuda`). On a GPU machine, both files (-n 4, with pytest-xdist, runs
them side by side; -rP --show-capture=stdout also prints the torch version and GPU, whether the resume
was bit for bit, and which way the decode step was compiled):

    pytest -m cuda tests/test_cuda*.py

ATTNLAB_TEST_DEVICE=cpu runs the same bodies on the CPU, a dry run of every code path where there is no
GPU (the CUDA kernels' own checks are skipped): ATTNLAB_TEST_DEVICE=cpu pytest -m cuda tests/test_cuda*.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
import attnlab.engine.loop as loop_mod
from attnlab.data import DataConfig
from attnlab.data.captions import CaptionDataConfig
from attnlab.data.finetune import ChatData, PreferenceData
from attnlab.data.images import ImageDataConfig
from attnlab.data.labeled import LabeledDataConfig
from attnlab.data.parallel import ParallelDataConfig
from attnlab.decoding.sampling import stream
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run as run_task
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.attention import MultiHeadAttention, attend, padding_mask
from attnlab.nn.context import Context
from attnlab.runtime.device import dtype_choice
from attnlab.tasks import TASKS
from attnlab.tasks.request import python_request
from tests.conftest import TEXT, decode_stepwise, losses, perturb, tiny_chat_base, tiny_train
from tests.test_decode_path import greedy_reference

DEVICE = torch.device(os.environ.get("ATTNLAB_TEST_DEVICE", "cuda"))
ON_GPU = DEVICE.type == "cuda"
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[1]


def corpus(folder: Path) -> Path:
    path = folder / "code.txt"
    path.write_text(TEXT * 40)  # ~5 KB of Python-like code
    return path


def tiny(**kw) -> TrainConfig:
    """tiny_train on DEVICE: 12 steps of 16 rows at a higher learning rate, one validation batch."""
    gpu = {"max_steps": 12, "batch_size": 16, "lr": 1e-2, "warmup_steps": 2, "eval_interval": 12, "eval_batches": 1}
    return tiny_train(**{**gpu, "device": str(DEVICE), **kw})


@pytest.mark.skipif(not ON_GPU, reason="a CPU's choice is measured: tests/test_dtype_choice.py")
def test_auto_precision_on_the_gpu_trains_in_bf16_and_decodes_in_float32():
    """--dtype auto on this GPU (runtime/device.py): bf16 to train, as the bf16 runs below assume;
    float32 to decode."""
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    assert dtype_choice("auto", DEVICE) == (torch.bfloat16, "auto: bf16 on this GPU")
    assert dtype_choice("auto", DEVICE, use="decode")[0] == torch.float32


# ---- 1. every family trains in bf16 ------------------------------------------------------------------

T = dict(n_layer=1, n_head=2, d_model=64)  # the Transformer families' width
FAMILY_RUNS = [
    ("lm", "gpt"),
    ("reward", "reward"),
    ("mlm", "encoder"),
    ("tag", "encoder"),
    ("sft", "gpt"),
    ("dpo", "gpt"),
    ("translate", "transformer"),
    ("translate", "rnn-attention"),
    ("image", "vit"),
    ("image", "mlp"),
    ("caption", "transformer"),
    ("caption", "rnn-attention"),
]
FAMILY_RUNS += [("classify", m) for m in TASKS["classify"].models]  # encoder, bow, pooled, conv1d, rnn, ...
FAMILY_TRAIN = {"mlm": {"block_size": 16, "batch_size": 64}, "image": {"batch_size": 64}}  # less noisy losses


def family_case(task: str, model: str, tmp: Path) -> tuple[dict, object, dict]:
    """(model fields, data config, request extras) of a run of `model` that learns within a few steps."""
    if task in ("sft", "dpo", "reward"):  # adapt a base: a GPT pretrained a step on chats (on the CPU)
        if task == "sft":
            return {}, ChatData(examples=40, test_examples=4), {"init": tiny_chat_base(tmp)}
        # One answer always preferred: learnt in a few steps (the built-in pairs need arithmetic).
        rows = [{"prompt": f"Is {i} fine?", "chosen": "yes", "rejected": "no"} for i in range(60)]
        (tmp / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {}, PreferenceData(data=str(tmp / "pairs.jsonl")), {"init": tiny_chat_base(tmp)}
    if task == "classify":  # the label is the first word: any classifier learns it at once
        rows = [f"{'good' if i % 2 else 'bad'} film number {i}\t{'pos' if i % 2 else 'neg'}" for i in range(200)]
        (tmp / "labeled.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n")
        fields = dict(T, context=32) if model == "encoder" else {"dropout": 0.0} if model == "bow" else {}
        return fields, LabeledDataConfig(data=str(tmp / "labeled.tsv"), max_len=32), {}
    if task == "tag":
        return dict(T, context=32), LabeledDataConfig(data="tagging", max_len=32), {}
    if task in ("lm", "mlm"):
        tokens = {"tokenizer": "word", "vocab_size": 64} if task == "mlm" else {}  # mlm needs [MASK]
        return dict(T, context=32), DataConfig(data=str(corpus(tmp)), **tokens), {}
    if task == "translate":
        fields = dict(T, d_ff=128) if model == "transformer" else dict(d_emb=32, d_hidden=64)
        return fields, ParallelDataConfig(data="numbers", n_train=200, max_len=32, vocab_size=300), {}
    if task == "image":
        return (T if model == "vit" else {}), ImageDataConfig(data="digits"), {}
    return (T if model == "transformer" else {}), CaptionDataConfig(n_train=64, n_test=8), {}


@pytest.mark.parametrize(("task", "model"), FAMILY_RUNS, ids=lambda v: v)
def test_every_family_trains_in_bf16(task, model, tmp_path, capsys):
    """A few bf16 steps on the device: the loss falls (mean of the last 3 steps below the first 3's), the
    run says it trained on the device in bf16, and its checkpoint is written."""
    fields, data, extras = family_case(task, model, tmp_path)
    out = tmp_path / "run"
    cfg = tiny(dtype="bfloat16", **FAMILY_TRAIN.get(task, {}))
    run_task(TASKS[task], python_request(TASKS[task], out, model, fields, cfg, data, progress=False, **extras))
    said = "".join(capsys.readouterr())
    assert f"| {DEVICE.type} bfloat16 |" in said, said  # announce(): the session's device and dtype
    seen = losses(out)
    assert len(seen) == 12 and all(v == v for v in seen), seen
    assert sum(seen[-3:]) < sum(seen[:3]), seen
    assert (out / "model.safetensors").stat().st_size > 0 and (out / "train_state.safetensors").is_file()


# ---- 2. attend: the fused kernels against the math path ---------------------------------------------

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def qkv(dtype: torch.dtype, tq: int = 16, tk: int = 16, heads: int = 4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    shapes = [(2, heads, tq, 32), (2, heads, tk, 32), (2, heads, tk, 32)]  # (B, H, T, Dh)
    return tuple(torch.randn(s, generator=g).to(DEVICE, dtype) for s in shapes)


def same(fused: torch.Tensor, math: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    assert fused.dtype == dtype and torch.isfinite(fused).all()
    torch.testing.assert_close(fused.float(), math.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_attention_is_the_math_path(dtype):
    """Causal (the kernel's own is_causal), padded (a boolean mask; fully masked rows zeroed), causal over
    a cache (4 queries, 16 keys: the mask made here) and grouped key/value heads (2 for 4 heads)."""
    q, k, v = qkv(dtype)
    real = torch.ones(2, 16, dtype=torch.bool, device=DEVICE)
    real[1, 11:] = False  # row 1 padded after 11 tokens
    pad = padding_mask(real)  # (B, 1, T, T)
    for mask, causal in [(None, True), (pad, False), (pad, True)]:
        same(attend(q, k, v, mask, causal=causal)[0], attend(q, k, v, mask, True, causal=causal)[0], dtype)
    q4, k4, v4 = qkv(dtype, tq=4)
    same(attend(q4, k4, v4, causal=True)[0], attend(q4, k4, v4, None, True, causal=True)[0], dtype)
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4, n_kv_heads=2, causal=True).to(DEVICE, dtype).eval()
    x = torch.randn(2, 16, 64, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        same(mha(x)[0], mha(x, Context(return_weights=True))[0], dtype)


@pytest.mark.skipif(not ON_GPU, reason="flash and memory-efficient attention are CUDA kernels")
def test_flash_and_memory_efficient_kernels_run_and_match():
    """With one SDPA backend allowed at a time, the fused path runs on it (it fails with no kernel
    otherwise). Flash takes no mask tensor: attend passes none for causal self-attention, so flash is
    checked there; memory-efficient attention also takes the padding mask."""
    q, k, v = qkv(torch.bfloat16)
    math = attend(q, k, v, None, True, causal=True)[0]
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        with sdpa_kernel(backend):
            same(attend(q, k, v, causal=True)[0], math, torch.bfloat16)
    real = torch.ones(2, 16, dtype=torch.bool, device=DEVICE)
    real[0, 5:] = False
    pad = padding_mask(real)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = qkv(dtype)
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            same(attend(q, k, v, pad, causal=True)[0], attend(q, k, v, pad, True, causal=True)[0], dtype)


# ---- 3. cached decoding is the uncached forward --------------------------------------------------------

LLAMA = dict(positions="rope", norm_kind="rmsnorm", feedforward="swiglu", n_kv_head=2, bias=False, tie_weights=False)


def decoder(**kw) -> GPT:
    torch.manual_seed(1)  # large random weights (and a seed) whose greedy tokens do not soon repeat one token
    return perturb(GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, context=16, vocab_size=29, **kw)), 0.5).to(DEVICE)


@pytest.mark.parametrize("blocks", [{}, LLAMA], ids=["gpt2", "llama"])
def test_cached_decoding_is_the_uncached_forward(blocks):
    gpt = decoder(**blocks)
    want = greedy_reference(gpt, [3, 1, 4, 1, 5], 40)  # 40 > context 16: the window jumps
    assert len(set(want)) >= 8  # not one token repeated: a wrong cache would show
    assert list(stream(gpt, [3, 1, 4, 1, 5], 40, temperature=0, dtype="float32")) == want
    drawn = [list(stream(gpt, [3, 1, 4], 40, 1.0, seed=3, use_cache=c, dtype="float32")) for c in (True, False)]
    assert drawn[0] == drawn[1] and len(set(drawn[0])) >= 8  # seeded draws: every position's logits matter
    ids = torch.randint(0, 29, (3, 16), device=DEVICE)
    with torch.no_grad():
        stepwise, _ = decode_stepwise(gpt, ids, 5)
        full = gpt(ids)
    torch.testing.assert_close(stepwise, full, atol=1e-4, rtol=1e-4)


# ---- 4. exact resume, 5. --compile ---------------------------------------------------------------------


def test_an_interrupted_run_resumes_to_the_uninterrupted_one(tmp_path, monkeypatch):
    """12 steps in one go against 6, a Ctrl-C, and a resume to 12 (float32, dropout on: the CUDA RNG must
    come back): losses and weights within 1e-6, and printed whether bit for bit. Exact is expected:
    attention runs on SDPA's math backend (the fused kernels' backward may sum with atomics, in any
    order), the rest is cuBLAS products and reductions that one GPU repeats bit for bit. A resume that
    lost any state (an RNG, the optimizer's moments, the schedule) is off by far more than 1e-6."""
    data = DataConfig(data=str(corpus(tmp_path)))
    model = GPTConfig(n_layer=2, n_head=2, d_model=64, context=32, dropout=0.1)
    full, cut = tmp_path / "full", tmp_path / "cut"
    real = loop_mod.train_step

    def interrupted(s):
        if s.step == 6:
            raise KeyboardInterrupt
        return real(s)

    with sdpa_kernel(SDPBackend.MATH):
        attnlab.train(full, model, tiny(), data, progress=False)
        monkeypatch.setattr(loop_mod, "train_step", interrupted)
        with pytest.raises(attnlab.AttnlabError, match="interrupted at step 6"):
            attnlab.train(cut, model, tiny(), data, progress=False)
        monkeypatch.setattr(loop_mod, "train_step", real)
        attnlab.train(cut, resume=True, progress=False)
    a, b = losses(full), losses(cut)
    assert len(a) == len(b) == 12
    wa, wb = attnlab.load(full, "cpu").model.state_dict(), attnlab.load(cut, "cpu").model.state_dict()
    gaps = max(abs(x - y) for x, y in zip(a, b)), max(float((wa[n] - wb[n]).abs().max()) for n in wa)
    print(f"resumed on {DEVICE}: " + ("bit for bit" if gaps == (0, 0) else f"losses, weights within {gaps}"))
    assert max(gaps) <= 1e-6, (gaps, a, b)


def test_compiled_training_matches_eager(tmp_path):
    """--compile: torch.compile compiled the model (a graph was made) and 6 steps' losses are eager's
    within 1e-3 (float32: inductor's fused reductions round in another order)."""
    from torch._dynamo.utils import counters  # torch.compile's own statistics

    data, model = DataConfig(data=str(corpus(tmp_path))), GPTConfig(n_layer=1, n_head=2, d_model=64, context=32)
    attnlab.train(tmp_path / "eager", model, tiny(max_steps=6), data, progress=False)
    counters.clear()
    attnlab.train(tmp_path / "compiled", model, tiny(max_steps=6, compile=True), data, progress=False)
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert len(a) == len(b) == 6 and max(abs(x - y) for x, y in zip(a, b)) < 1e-3, (a, b)
    assert not [k for k in attnlab.load(tmp_path / "compiled", "cpu").model.state_dict() if "_orig_mod" in k]
